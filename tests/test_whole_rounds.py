"""Rounds passed whole (issue 39, item 4): where a framework gathered the ranks already
(Ray's controller, Lightning's all-gather), the run takes the round whole
(``Run.report_round``, ``ReportCallbackHandler.take_round``): checked by the rules a
rank's report passes, counted as every rank's report, delivered as one round, and
never split into reports to be gathered again. The log still holds each rank's
report, so a replay gathers the same rounds from it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest

from eventbus import (
    CheckpointSaved,
    Event,
    EventBus,
    Report,
    RoundGathered,
    TrainRunContext,
    VirtualClock,
)
from eventbus.log import read_log
from eventbus.testing import replay_log
from handlers import EarlyStopping, ReportError, UserCallback, open_run
from handlers._reports import ReportCallbackHandler


def metrics_of(round_: int, world_size: int) -> list[dict[str, Any]]:
    return [{"rank": rank, "i": round_, "loss": 1.0} for rank in range(world_size)]


class Rounds(UserCallback):
    """Keeps each round's metrics and checkpoint, as ``after_report`` gets them."""

    def __init__(self) -> None:
        self.rounds: list[tuple[list[dict[str, Any]], str | None]] = []

    def after_report(
        self, run_context: TrainRunContext, metrics: list[dict[str, Any]], checkpoint: str | None
    ) -> None:
        self.rounds.append(([dict(m) for m in metrics], checkpoint))


class Admitted:
    """Counts the gatherer's per-report path (``_admit``) while it wraps it."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls = 0
        admit = ReportCallbackHandler._admit

        def counted(handler: ReportCallbackHandler, report: Report) -> None:
            self.calls += 1
            admit(handler, report)

        monkeypatch.setattr(ReportCallbackHandler, "_admit", counted)


# --- the gatherer, without a bus ---------------------------------------------------


def test_a_whole_round_is_one_round_of_every_ranks_metrics_with_each_ranks_record() -> None:
    handler = ReportCallbackHandler(world_size=3)
    events = handler.take_round("r", metrics_of(0, 3), "ckpt")
    reports = [e for e in events if isinstance(e, Report)]
    (gathered,) = [e for e in events if isinstance(e, RoundGathered)]
    assert events[:3] == reports  # each rank's record first, then the round
    assert [(r.rank, r.index, r.checkpoint) for r in reports] == [(k, 0, "ckpt") for k in range(3)]
    assert [m["rank"] for m in gathered.metrics] == [0, 1, 2]
    assert all(m is r.metrics for m, r in zip(gathered.metrics, reports, strict=True))
    assert (gathered.round, gathered.ranks, gathered.checkpoint) == (0, (0, 1, 2), "ckpt")
    again = handler.take_round("r", metrics_of(1, 3))
    assert [e.index for e in again if isinstance(e, Report)] == [1, 1, 1]
    assert (handler.rounds, handler.reports, handler.last_checkpoint) == (2, 6, "ckpt")


def test_a_bad_ranks_metrics_are_refused_naming_it_and_nothing_of_the_round_is_taken() -> None:
    handler = ReportCallbackHandler(world_size=3)
    handler.take_round("r", metrics_of(0, 3))
    bad = metrics_of(1, 3)
    bad[1]["loss"] = object()
    with pytest.raises(ReportError) as refused:
        handler.take_round("r", bad)
    assert (refused.value.rank, refused.value.field) == (1, "metrics['loss']")
    assert str(refused.value).startswith("rank 1: report refused: metrics['loss']: ")
    assert (handler.rounds, handler.reports, handler.rejected) == (1, 3, 0)  # round 0 stays
    events = handler.take_round("r", metrics_of(1, 3))  # the refused round's indices are free
    assert [e.index for e in events if isinstance(e, Report)] == [1, 1, 1]
    with pytest.raises(ReportError, match="rank 0: report refused: checkpoint: ''"):
        handler.take_round("r", metrics_of(2, 3), "")
    assert handler.rounds == 2


def test_a_whole_round_needs_each_required_ranks_metrics_and_the_runs_id() -> None:
    handler = ReportCallbackHandler(world_size=4, required_ranks=[0, 2])
    with pytest.raises(ValueError, match=r"each required rank \[0, 2\].*2 mappings, got 4"):
        handler.take_round("r", metrics_of(0, 4))
    (gathered,) = [e for e in handler.take_round("r", metrics_of(0, 2)) if type(e) is RoundGathered]
    assert gathered.ranks == (0, 2) and [m["rank"] for m in gathered.metrics] == [0, 1]
    with pytest.raises(ValueError, match="a round of run 'other', but this run is 'r'"):
        handler.take_round("other", metrics_of(1, 2))
    assert handler.rounds == 1


def test_a_whole_round_is_refused_while_reports_wait_for_theirs() -> None:
    handler = ReportCallbackHandler(world_size=2)
    handler.handle(Report(run_id="r", rank=1, world_size=2, index=0, metrics={"i": 0}))
    with pytest.raises(
        RuntimeError, match=r"reports of ranks \[1\] wait for theirs: it would overtake them"
    ):
        handler.take_round("r", metrics_of(0, 2))
    assert handler.rounds == 0 and handler.reports == 1


# --- on a bus, and through a run ---------------------------------------------------


@pytest.mark.anyio
async def test_on_a_bus_a_whole_round_is_gathered_once_and_its_records_never_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    admitted = Admitted(monkeypatch)
    seen: list[Event] = []
    async with EventBus(clock=VirtualClock(), period=1000) as bus:
        bus.subscribe((Report, RoundGathered), seen.append)
        handler = ReportCallbackHandler(world_size=2)
        handler.subscribe(bus)
        for round_ in range(3):
            await bus.publish_many(handler.take_round("r", metrics_of(round_, 2)))
        # A rank's report after them is gathered as ever: it continues the indices.
        await bus.publish(Report(run_id="r", rank=0, world_size=2, index=3, metrics={"i": 3}))
        await bus.wait_idle()
    assert admitted.calls == 1  # the report alone: the whole rounds' records were passed over
    assert [type(e).__name__ for e in seen] == (["Report"] * 2 + ["RoundGathered"]) * 3 + ["Report"]
    assert [e.round for e in seen if isinstance(e, RoundGathered)] == [0, 1, 2]
    assert (handler.rounds, handler.reports, handler.rejected) == (3, 7, 0)
    assert handler.lacking() == [1]


@pytest.mark.anyio
async def test_a_run_takes_whole_rounds_stops_as_of_them_and_replays_the_same(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    admitted = Admitted(monkeypatch)
    kept, log = Rounds(), tmp_path / "events.jsonl"
    stopped_at = None
    losses = [1.0, 0.5, 0.6, 0.7, 0.8, 0.9]
    async with open_run(
        world_size=2,
        callbacks=[kept, EarlyStopping("loss", patience=2)],
        state_dir=tmp_path / "run",
        log=log,
    ) as run:
        for round_, loss in enumerate(losses):
            metrics = [{"rank": rank, "loss": loss + rank} for rank in range(2)]
            checkpoint = tmp_path / "run" / f"checkpoint_{round_:06d}" if round_ == 1 else None
            await run.report_round(metrics, checkpoint=checkpoint)
            await run.wait_gathered(1)  # any rank: a whole round left none waiting
            if run.should_stop:
                stopped_at = round_
                break
    assert stopped_at == 3  # two rounds without improvement after round 1: as of round 3
    assert admitted.calls == 0  # nothing split to be gathered again
    assert [[m["rank"] for m in metrics] for metrics, _ in kept.rounds] == [[0, 1]] * 4
    assert [metrics[1]["loss"] for metrics, _ in kept.rounds] == [2.0, 1.5, 1.6, 1.7]
    saved = str(tmp_path / "run" / "checkpoint_000001")
    assert [c for _, c in kept.rounds] == [None, saved, None, None]
    result = run.result
    assert (result.rounds, result.reports, result.rejected) == (4, 8, 0)
    assert result.last_checkpoint == saved
    events = read_log(log).events
    assert [(e.rank, e.index) for e in events if isinstance(e, Report)] == [
        (rank, i) for i in range(4) for rank in range(2)
    ]
    assert sum(isinstance(e, CheckpointSaved) for e in events) == 1
    replayed = Rounds()
    await replay_log(log, replayed)
    assert replayed.rounds == kept.rounds  # the records gathered again, rank by rank


def test_a_run_refuses_a_bad_rank_of_a_whole_round_and_goes_on() -> None:
    kept = Rounds()

    async def main() -> None:
        async with open_run(world_size=2, callbacks=[kept]) as run:
            await run.report_round(metrics_of(0, 2))
            with pytest.raises(ReportError, match=r"rank 1: report refused: metrics\['x'\]"):
                await run.report_round([{"x": 1}, {"x": {1, 2}}])
            with pytest.raises(ReportError, match="rank 0: report refused: checkpoint"):
                await run.report_round(metrics_of(1, 2), checkpoint="a\0b")
            await run.report_round(metrics_of(1, 2))

    anyio.run(main)
    assert [metrics[0]["i"] for metrics, _ in kept.rounds] == [0, 1]
