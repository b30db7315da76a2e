"""The report's figures against logs whose answers are known: shares of periods,
percentiles, downsampling that keeps spikes, two runs on one grid, what a resume
rolled back."""

from __future__ import annotations

import json
import math
import random
import re
from pathlib import Path
from typing import Any

import pytest

from adapters.report import comparison_report, run_report
from adapters.report._digest import RunDigest, digest_log
from adapters.report._series import SeriesGroup, align
from eventbus import (
    BudgetReport,
    CheckpointSaved,
    Event,
    EventPlaceholder,
    HandlerStateChanged,
    Report,
    RoundGathered,
    RunFinished,
    RunResumed,
    RunStarted,
    TrainRunContext,
    WorkerFailure,
    WorkerGroupRestarted,
)
from eventbus._events import HandlerUsage, RunPosition
from eventbus.testing import write_log

CONTEXT = TrainRunContext(run_id="r", name="known", world_size=2)


def gathered(round_: int, *values: dict[str, Any]) -> RoundGathered:
    return RoundGathered(
        context=CONTEXT, round=round_, ranks=tuple(range(len(values))), metrics=list(values)
    )


def usage(handler: str, calls: int, total: float, **more: Any) -> HandlerUsage:
    return HandlerUsage(handler=handler, calls=calls, total=total, max=more.pop("max", 0.0), **more)


def budget_report(
    period: int, *usages: HandlerUsage, length: float = 1.0, **more: Any
) -> BudgetReport:
    start = 100.0 + period
    total = sum(u.total for u in usages)
    return BudgetReport(
        period=period,
        start=start,
        end=start + length,
        budget=0.05,
        total=total,
        fraction=total / length,
        handlers=usages,
        **more,
    )


def digest_of(tmp_path: Path, events: list[Event], name: str = "run.evlog") -> RunDigest:
    return digest_log(write_log(tmp_path / name, events, run_id="r"))


# --- downsampling ----------------------------------------------------------------------


def test_a_short_series_is_kept_exactly() -> None:
    group = SeriesGroup(buckets=16)
    line = group.series("a")
    for x in range(10):
        group.add(line, x, x * 1.5)
    lines = group.lines()
    assert lines.x == [float(x) for x in range(10)]
    assert lines.columns == [[x * 1.5 for x in range(10)]]
    assert group.width == 1


def test_downsampling_keeps_every_spike_and_bounds_the_points() -> None:
    group = SeriesGroup(buckets=64)
    line = group.series("loss")
    for x in range(100_000):
        value = 50.0 if x == 43_210 else -7.0 if x == 90_001 else 1.0 + (x % 3) * 0.01
        group.add(line, x, value)
    lines = group.lines()
    values = [v for v in lines.columns[0] if v is not None]
    assert len(lines.x) <= 2 * 64
    assert max(values) == 50.0 and min(values) == -7.0
    width = group.width
    assert width == 2048  # the smallest power of two with 100,000 / width <= 64
    spike_x = lines.x[lines.columns[0].index(50.0)]
    dip_x = lines.x[lines.columns[0].index(-7.0)]
    assert abs(spike_x - 43_210) < width and abs(dip_x - 90_001) < width
    assert group.extremes(line) == ((90_001, -7.0), (43_210, 50.0))  # exact, with x
    assert group.points(line) == 100_000


def test_a_bucket_keeps_its_low_and_high_in_the_order_they_came() -> None:
    group = SeriesGroup(buckets=2)
    line = group.series("a")
    for x, y in [(0, 5.0), (1, 9.0), (2, 1.0), (3, 4.0)]:  # 2 buckets of width 2
        group.add(line, x, y)
    for x, y in [(4, 3.0), (5, 8.0)]:  # widens to 4: [0..3] and [4..7]
        group.add(line, x, y)
    assert group.width == 4
    lines = group.lines()
    # Bucket 0: high 9 (x=1) came before low 1 (x=2); bucket 1: low 3 then high 8.
    assert lines.x == [0.0, 2.0, 4.0, 6.0]
    assert lines.columns == [[9.0, 1.0, 3.0, 8.0]]


def test_a_band_gives_each_buckets_low_mean_and_high() -> None:
    group = SeriesGroup(buckets=4)
    line = group.series("a")
    for x in range(8):
        group.add(line, x, float(x))
    band = group.band(line)
    assert group.width == 2
    assert band.x == [1.0, 3.0, 5.0, 7.0]  # each bucket's middle
    assert band.low == [0.0, 2.0, 4.0, 6.0]
    assert band.mean == [0.5, 2.5, 4.5, 6.5]
    assert band.high == [1.0, 3.0, 5.0, 7.0]


def test_pooled_values_make_the_same_buckets_as_one_by_one() -> None:
    rng = random.Random(7)
    rounds = [[rng.uniform(-5, 5) for _ in range(6)] for _ in range(1000)]
    one_by_one, pooled = SeriesGroup(buckets=32), SeriesGroup(buckets=32)
    a, b = one_by_one.series("a"), pooled.series("a")
    for x, values in enumerate(rounds):
        for value in values:
            one_by_one.add(a, x, value)
        pooled.add_pooled(b, x, [min(values), max(values), sum(values), len(values)])
    left, right = one_by_one.band(a), pooled.band(b)
    assert (left.x, left.low, left.high) == (right.x, right.low, right.high)
    assert left.mean == pytest.approx(right.mean)
    assert one_by_one.extremes(a) == pooled.extremes(b)


def test_points_off_the_axis_are_counted_not_drawn() -> None:
    group = SeriesGroup(buckets=4)
    line = group.series("a")
    for x in (-1.0, math.nan, math.inf):
        group.add(line, x, 1.0)
    group.add(line, 1e300, 2.0)  # far but finite: the buckets widen, memory does not grow
    assert group.dropped == 3
    assert group.lines().columns == [[2.0]]


def test_two_runs_are_put_on_one_grid() -> None:
    short, long = SeriesGroup(buckets=64), SeriesGroup(buckets=64)
    for group, rounds in ((short, 100), (long, 1000)):
        line = group.series("loss")
        for x in range(rounds):
            group.add(line, x, 1.0 / (x + 1))
    assert (short.width, long.width) == (2, 16)
    assert align(short, long) == 16
    assert short.width == long.width == 16
    grid = set(long.lines().x)
    assert set(short.lines().x) <= {x * 8.0 for x in range(200)}  # bucket starts and middles
    assert short.lines().x[0] in grid
    # Widening kept the extremes: round 0's 1.0 is still there.
    assert max(v for v in short.lines().columns[0] if v is not None) == 1.0


def test_comparison_charts_share_one_x_grid(tmp_path: Path) -> None:
    def run(name: str, rounds: int, loss: float) -> RunDigest:
        events: list[Event] = [RunStarted(run_id=name, name=name, world_size=1)]
        events += [gathered(r, {"loss": loss}) for r in range(rounds)]
        return digest_of(tmp_path, events, f"{name}.evlog")

    a, b = run("a", 600, 2.0), run("b", 3000, 1.0)
    page = comparison_report(a, b)
    data = json.loads(re.search(r'id="report-data">(.*?)</script>', page, re.S).group(1))  # type: ignore[union-attr]
    (loss,) = [c for c in data["charts"] if c["id"].startswith("chart-m")]
    x = loss["x"]
    means = {s["label"]: s["values"] for s in loss["series"] if s["label"].endswith("mean")}
    a_mean, b_mean = means["A: a mean"], means["B: b mean"]
    assert x == sorted(x) and len(x) == len(a_mean) == len(b_mean)
    shared = [i for i in range(len(x)) if a_mean[i] is not None and b_mean[i] is not None]
    assert shared and all(a_mean[i] == 2.0 and b_mean[i] == 1.0 for i in shared)
    assert x[shared[0]] == 8.0  # buckets of 16 rounds, drawn at their middle


# --- callback cost -----------------------------------------------------------------------


def test_shares_percentiles_and_periods_over_budget(tmp_path: Path) -> None:
    # Nine periods of 10 calls at 1 ms, one of 10 calls at 10 ms (over its 5% budget).
    reports: list[Event] = [budget_report(p, usage("h", 10, 0.010, max=0.0012)) for p in range(9)]
    reports.append(budget_report(9, usage("h", 10, 0.100, max=0.030, over_budget=True, timeouts=2)))
    cost = digest_of(tmp_path, reports).cost
    (h,) = cost.ranked()
    assert h.calls == 100 and h.total == pytest.approx(0.19)
    assert h.mean == pytest.approx(0.0019)
    assert h.quantile(0.5) == pytest.approx(0.001, rel=0.045)
    assert h.quantile(0.99) == pytest.approx(0.010, rel=0.045)
    assert h.longest == 0.030
    assert (h.periods, h.periods_over, h.timeouts) == (10, 1, 2)
    assert cost.timeline == pytest.approx(10.0)
    assert h.total / cost.timeline == pytest.approx(0.019)  # share of the run
    worst = cost.shares.extremes(cost.shares.series("h"))
    assert worst is not None and worst[1][0] == 9  # its worst period: 10% of period 9
    assert worst[1][1] == pytest.approx(10.0)
    assert cost.periods_over == 1  # all handlers together: only period 9 is over 5%
    incidents = cost.incidents.totals(cost.incidents.series("timeouts"))
    assert incidents == [(9, 2.0)]


def test_a_partial_period_is_judged_as_a_whole_one(tmp_path: Path) -> None:
    reports: list[Event] = [
        budget_report(0, usage("h", 1, 0.010)),
        budget_report(1, usage("h", 1, 0.050), length=0.1, partial=True),
    ]
    cost = digest_of(tmp_path, reports).cost
    worst = cost.shares.extremes(cost.shares.series("h"))
    assert worst is not None and worst[1][1] == pytest.approx(5.0)  # not 50%
    assert cost.timeline == pytest.approx(2.0)
    assert cost.partial_periods == 1


def test_costs_are_ranked_by_total_and_states_become_spans(tmp_path: Path) -> None:
    events: list[Event] = [
        budget_report(0, usage("cheap", 100, 0.001), usage("dear", 1, 0.04)),
        HandlerStateChanged(handler="dear", state="disabled", reason="over budget"),
        budget_report(1, usage("cheap", 100, 0.001)),
        budget_report(2, usage("cheap", 100, 0.001)),
        HandlerStateChanged(handler="dear", state="normal", reason="re-enabled"),
        budget_report(3, usage("cheap", 100, 0.001), usage("dear", 1, 0.001)),
    ]
    cost = digest_of(tmp_path, events).cost
    assert [c.name for c in cost.ranked()] == ["dear", "cheap"]
    (span,) = cost.spans
    assert (span.handler, span.state, span.start, span.end) == ("dear", "disabled", 1, 3)


def test_handlers_past_the_cap_are_added_up_as_one(tmp_path: Path) -> None:
    many = tuple(usage(f"h{i}", 1, 0.001) for i in range(70))
    cost = digest_of(tmp_path, [budget_report(0, *many)]).cost
    assert len(cost.handlers) == 65
    other = cost.handlers["(other handlers)"]
    assert other.calls == 6 and other.total == pytest.approx(0.006)
    folded = cost.shares.extremes(cost.shares.series("(other handlers)"))
    assert folded is not None and folded[1][1] == pytest.approx(0.6)  # their sum, not one


# --- the run -------------------------------------------------------------------------------


def test_rounds_markers_and_failures_land_where_they_happened(tmp_path: Path) -> None:
    events: list[Event] = [RunStarted(run_id="r", name="known", world_size=2, wall_time=1e9)]
    for r in range(10):
        events.append(gathered(r, {"loss": 10.0 - r, "eval": {"acc": r / 10}}, {"loss": 9.0 - r}))
        if r % 4 == 3:
            events.append(CheckpointSaved(run_id="r", checkpoint=f"ck{r}", index=r))
        if r == 5:
            events.append(
                WorkerFailure(
                    run_id="r", rank=1, error_type="OSError", message="disk", traceback="tb"
                )
            )
            events.append(WorkerGroupRestarted(run_id="r", world_size=2))
    events.append(RunFinished(run_id="r", status="finished"))
    digest = digest_of(tmp_path, events)
    kinds = (RoundGathered, WorkerGroupRestarted, WorkerFailure, CheckpointSaved)
    assert [digest.counts[kind] for kind in kinds] == [10, 1, 1, 2]
    assert digest.status == "finished" and digest.wall_start == 1e9
    charts = digest.metrics
    assert charts.x_label == "round" and list(charts.metrics) == ["loss", "eval/acc"]
    assert [m.x for m in charts.markers["checkpoint"]] == [3, 7]
    assert [m.x for m in charts.markers["failure"]] == [6]  # during the round after 5
    assert [m.x for m in charts.markers["restart"]] == [6]
    (failure,) = digest.failures
    assert (failure.rank, failure.round, failure.error_type, failure.traceback) == (
        1,
        6,
        "OSError",
        "tb",
    )
    loss = charts.metrics["loss"]
    lines = loss.group.lines([loss.ranks[0], loss.ranks[1]])
    assert lines.columns == [[10.0 - r for r in range(10)], [9.0 - r for r in range(10)]]
    assert digest.duration == pytest.approx(0.1 * (len(events) - 1))


def test_events_the_recorder_could_not_encode_are_counted_on_the_page(tmp_path: Path) -> None:
    unencodable = gathered(0, {"loss": 1.0, "path": Path("/x")})  # a Path: no JSON value
    digest = digest_of(tmp_path, [unencodable, gathered(1, {"loss": 2.0})])
    assert digest.counts[EventPlaceholder] == 1 and digest.counts[RoundGathered] == 1
    assert not digest.damage.any
    assert "events kept as placeholders" in run_report(digest)


def test_values_that_are_not_numbers_are_skipped_and_nan_counted(tmp_path: Path) -> None:
    values = {"loss": math.nan, "ok": True, "name": "x", "n": 3, "big": 2**64 - 1}
    digest = digest_of(tmp_path, [gathered(0, values), gathered(1, {"loss": 1.0})])
    charts = digest.metrics
    assert list(charts.metrics) == ["loss", "n", "big"]
    assert charts.metrics["loss"].nonfinite == 1 and charts.metrics["loss"].first_nonfinite == 0


def test_a_wide_run_is_a_band_and_many_metrics_are_capped(tmp_path: Path) -> None:
    ranks = [{f"m{k}": float(rank + k) for k in range(20)} for rank in range(12)]
    digest = digest_of(tmp_path, [gathered(r, *ranks) for r in range(3)])
    charts = digest.metrics
    assert not charts.per_rank and len(charts.ranks) == 12
    assert len(charts.metrics) == 16 and list(charts.uncharted) == ["m16", "m17", "m18", "m19"]
    band = charts.metrics["m0"].group.band(charts.metrics["m0"].all_ranks)
    assert band.low == [0.0] * 3 and band.high == [11.0] * 3 and band.mean == [5.5] * 3


def test_a_log_without_rounds_is_charted_by_report_index(tmp_path: Path) -> None:
    reports: list[Event] = [
        Report(run_id="r", rank=rank, world_size=2, index=i, metrics={"loss": i + rank / 10})
        for i in range(5)
        for rank in range(2)
    ]
    charts = digest_of(tmp_path, reports).metrics
    assert charts.x_label == "report index"
    loss = charts.metrics["loss"]
    assert loss.group.lines([loss.ranks[1]]).columns == [[i + 0.1 for i in range(5)]]


def test_events_a_resume_rolled_back_are_left_out(tmp_path: Path) -> None:
    # Rounds 0-4 then a crash; the checkpoint was at round 2 (seq 3); the resume redoes 3-4.
    events: list[Event] = [RunStarted(run_id="r", name="known", world_size=1)]
    events += [gathered(r, {"loss": float(r)}) for r in range(3)]
    events.append(CheckpointSaved(run_id="r", checkpoint="ck2", index=2))  # seq 4
    events += [
        Report(run_id="r", rank=0, world_size=1, index=r, metrics={"loss": 99.0}) for r in (3, 4)
    ]
    events += [gathered(r, {"loss": 99.0}) for r in (3, 4)]
    position = RunPosition(
        checkpoint="ck2", rounds=3, next_index=(3,), world_size=1, checkpoint_seq=4
    )
    events.append(RunStarted(run_id="r", name="known", world_size=1))
    events.append(RunResumed(run_id="r", checkpoint="ck2", position=position))
    events += [gathered(r, {"loss": float(r)}) for r in (3, 4)]
    digest = digest_of(tmp_path, events)
    assert digest.rolled_back == 4 and digest.counts[RoundGathered] == 5
    assert digest.resumes == ["ck2"]
    loss = digest.metrics.metrics["loss"]
    assert loss.group.lines([loss.ranks[0]]).columns == [[0.0, 1.0, 2.0, 3.0, 4.0]]
    assert [m.x for m in digest.metrics.markers["resume"]] == [3.0]
