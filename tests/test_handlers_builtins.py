"""Built-in callbacks: their logic and the state round trip the state store relies on."""

from __future__ import annotations

import enum
import io
import json
from collections.abc import Mapping
from typing import Any

import pytest
import structlog

from eventbus import Report, RunResult, TrainRunContext
from handlers import BestCheckpoints, EarlyStopping, MetricsLogger, ProgressDisplay
from handlers._metrics import mean_metrics


class IntValue(enum.IntEnum):
    ONE = 1


CTX = TrainRunContext(run_id="r", name="demo", world_size=2)


def rounds(values: list[float], name: str = "loss") -> list[list[dict[str, Any]]]:
    """Each value becomes a round whose two ranks average to it."""
    return [[{name: v - 1.0}, {name: v + 1.0}] for v in values]


def restore(cls: Any, state: Mapping[str, Any]) -> Any:
    """What the state store does: rebuild from args, set attributes (through JSON)."""
    state = json.loads(json.dumps(state))
    obj = cls(**state["args"])
    for key, value in state["attributes"].items():
        setattr(obj, key, value)
    return obj


def test_early_stopping_min_with_patience_and_threshold() -> None:
    stop = EarlyStopping("loss", patience=2, threshold=0.5, mode="min")
    for metrics in rounds([10.0, 9.0, 8.8, 8.6]):  # 8.8 and 8.6 improve by less than 0.5
        assert not stop.should_stop
        stop.after_report(CTX, metrics, None)
    assert stop.should_stop and stop.best == 9.0 and stop.wait == 2


def test_early_stopping_max_resets_wait_on_improvement_and_ignores_missing_metric() -> None:
    stop = EarlyStopping("acc", patience=2, mode="max")
    for metrics in rounds([0.5, 0.4, 0.6, 0.6], name="acc"):
        stop.after_report(CTX, metrics, None)
    stop.after_report(CTX, [{"loss": 1.0}], None)  # no "acc": not a round for it
    assert stop.best == pytest.approx(0.6)
    assert (stop.wait, stop.rounds, stop.should_stop) == (1, 4, False)


def test_early_stopping_state_round_trip_continues_identically() -> None:
    a = EarlyStopping("loss", patience=3, threshold=0.1)
    for metrics in rounds([5.0, 4.0, 4.05]):
        a.after_report(CTX, metrics, None)
    b = restore(EarlyStopping, a.state())
    assert b.state() == a.state() and b.state_key == a.state_key
    for metrics in rounds([4.0, 4.02]):
        a.after_report(CTX, metrics, None)
        b.after_report(CTX, metrics, None)
    assert a.should_stop and b.should_stop


def test_state_keys_tell_instances_apart() -> None:
    keys = {
        EarlyStopping("loss").state_key,
        EarlyStopping("acc", mode="max").state_key,
        BestCheckpoints("loss").state_key,
        BestCheckpoints("loss", k=1).state_key,
    }
    assert len(keys) == 4


def test_early_stopping_rejects_bad_arguments() -> None:
    with pytest.raises(ValueError, match="mode"):
        EarlyStopping("loss", mode="lowest")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="patience"):
        EarlyStopping("loss", patience=0)


def test_best_checkpoints_keeps_top_k_and_skips_rounds_without_checkpoint() -> None:
    best = BestCheckpoints("loss", k=2, mode="min")
    for i, metrics in enumerate(rounds([3.0, 1.0, 2.0, 0.5, 5.0])):
        best.after_report(CTX, metrics, f"ck{i}" if i != 3 else None)
    assert best.checkpoints == ["ck1", "ck2"] and best.best == "ck1"
    best.after_report(CTX, rounds([1.5])[0], "ck5")
    assert best.checkpoints == ["ck1", "ck5"]
    best_max = BestCheckpoints("acc", k=1, mode="max")
    for i, metrics in enumerate(rounds([0.2, 0.9, 0.5], name="acc")):
        best_max.after_report(CTX, metrics, f"ck{i}")
    assert best_max.best == "ck1"


def test_best_checkpoints_state_round_trip() -> None:
    best = BestCheckpoints("loss", k=2)
    for i, metrics in enumerate(rounds([3.0, 1.0, 2.0])):
        best.after_report(CTX, metrics, f"ck{i}")
    again = restore(BestCheckpoints, best.state())
    assert again.state() == best.state() and again.checkpoints == ["ck1", "ck2"]
    again.after_report(CTX, rounds([0.1])[0], "ck9")
    assert again.best == "ck9"


def test_metrics_logger_logs_every_nth_round_with_means() -> None:
    logger = MetricsLogger(every=2)
    with structlog.testing.capture_logs() as logs:
        logger.log = structlog.get_logger("test")
        for metrics in rounds([4.0, 3.0, 2.0]):
            logger.after_report(CTX, metrics, "ck")
    assert [(e["event"], e["round"], e["loss"], e["ranks"]) for e in logs] == [
        ("round", 0, 4.0, 2),
        ("round", 2, 2.0, 2),
    ]


def test_metrics_named_as_the_lines_own_fields_are_logged_renamed_said_once() -> None:
    """A metric named ``round`` (or ``event``, ``run_id``, ...) used to fail every round's
    line: the line keeps its own fields, the metric is logged as ``metric.<name>``."""
    logger = MetricsLogger()
    logger.log = structlog.get_logger("test")
    odd = {"loss": 1.0, "round": 7, "event": 2.0, "self": 3, "metric.round": 5}
    with structlog.testing.capture_logs() as logs:
        for _ in range(2):
            logger.after_report(CTX, [odd, odd], "ck")
    lines = [e for e in logs if e["event"] == "round"]
    warnings = [e for e in logs if e["log_level"] == "warning"]
    seen = [(e["round"], e["loss"], e["metric.metric.round"], e["metric.round"]) for e in lines]
    assert seen == [(0, 1.0, 7, 5), (1, 1.0, 7, 5)]
    assert lines[0]["metric.event"] == 2.0 and lines[0]["metric.self"] == 3
    assert sorted((w["metric"], w["logged_as"]) for w in warnings) == [
        ("event", "metric.event"),
        ("round", "metric.metric.round"),
        ("self", "metric.self"),
    ]
    # A later round with a metric named as the earlier one's new name keeps both.
    with structlog.testing.capture_logs() as logs:
        logger.after_report(CTX, [{"round": 1, "metric.metric.round": 2}], None)
    (line,) = [e for e in logs if e["event"] == "round"]
    assert (line["metric.metric.round"], line["metric.round"]) == (2, 1)


@pytest.mark.parametrize(
    "one_rank",
    [
        {"loss": 0.5, "step": 3, "epoch": 1.0},
        {"loss": float("nan"), "lr": float("inf"), "step": -2, "note": "x", "done": True},
        {"flag": False, "big": 10**30, "none": None},
        {"enum": IntValue.ONE, "loss": 0.5},  # a subclass of int: the long way
    ],
)
def test_one_ranks_means_are_its_numbers_as_the_long_way_gives_them(
    one_rank: dict[str, Any],
) -> None:
    """A single-process trainer's every round takes the one-rank path: it must give
    what the mean over several ranks gives (ints stay ints, NaN and bools are left out)."""
    fast = mean_metrics([one_rank])
    assert fast == mean_metrics([one_rank, one_rank])
    assert [type(v) for v in fast.values()] == [
        type(v) for v in mean_metrics([one_rank, one_rank]).values()
    ]


def test_progress_display_counts_reports_per_rank_and_rounds() -> None:
    out = io.StringIO()
    clock = [0.0]
    display = ProgressDisplay(out, interval=1.0, tty=False, now=lambda: clock[0])
    for i in range(3):
        for rank in (0, 1):
            display.on_event(CTX, Report(run_id="r", rank=rank, world_size=2, index=i, metrics={}))
    display.on_event(CTX, Report(run_id="r", rank=0, world_size=2, index=3, metrics={}))
    for _ in range(3):
        display.after_report(CTX, [{}, {}], None)  # shown once: the clock did not move
    clock[0] = 2.0
    display.after_run(CTX, RunResult(run_id="r", status="finished"))
    assert out.getvalue().splitlines() == [
        "demo: round 1 | reports 0:4 1:3",
        "demo: round 3 | reports 0:4 1:3",
    ]


def test_progress_display_rewrites_one_line_on_a_terminal() -> None:
    out = io.StringIO()
    display = ProgressDisplay(out, interval=0.0, tty=True)
    display.after_report(CTX, [{}], None)
    display.after_run(CTX, RunResult(run_id="r", status="finished"))
    assert out.getvalue().count("\r") == 2 and out.getvalue().endswith("\n")
