"""The built-ins that watch a metric (early-stopping, best-checkpoints) watch one the
workload carries: the log's (``loss`` when its reports have it), or ``--metric``; when
what they are timed doing is not what a run would do (the metric is not in the
reports), the command says so in one line (issue 28, item 7)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import anyio
import pytest

from eventbus import VirtualClock
from handlers import open_run


def bench(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "adapters.cli", "bench", *args, "--repeat", "1"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=cwd,
        check=False,
    )


def bench_json(*args: str, cwd: Path | None = None) -> tuple[dict[str, Any], list[str]]:
    """The figures, and the notes on stderr."""
    done = bench(*args, "--json", "-", cwd=cwd)
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    notes = [line for line in done.stderr.splitlines() if line.startswith("eventbus bench: note:")]
    result: dict[str, Any] = json.loads(done.stdout)
    return result, notes


def record(path: Path, metrics: dict[str, float]) -> Path:
    """A run of 20 rounds of 2 ranks, each report carrying ``metrics``."""

    async def run() -> None:
        clock = VirtualClock(start=100.0)
        async with open_run(world_size=2, log=path, clock=clock, period=1.0) as run:
            reporters = [run.reporter(rank) for rank in range(2)]
            for index in range(20):
                clock.advance(0.1)
                for reporter in reporters:
                    await reporter.report({**metrics, "step": index})
                await run.bus.wait_idle()

    anyio.run(run)
    return path


@pytest.fixture
def loss_log(tmp_path: Path) -> Path:
    return record(tmp_path / "loss.evlog", {"accuracy": 0.5, "loss": 0.25})


@pytest.fixture
def f1_log(tmp_path: Path) -> Path:
    return record(tmp_path / "f1.evlog", {"f1": 0.5})


def test_with_a_log_the_built_ins_watch_its_loss_and_say_nothing(loss_log: Path) -> None:
    """Before: wired to metric_0, which no real run reports, they timed their "metric
    missing" path (0.59 µs against 1.06 µs), silently."""
    result, notes = bench_json("early-stopping", "best-checkpoints", "--log", str(loss_log))
    assert result["metrics"] == ["accuracy", "loss", "step"]
    assert result["builtins_metric"] == "loss"
    assert notes == [] and result["notes"] == []
    names = {f["name"] for f in result["callbacks"]}
    assert names == {"EarlyStopping.after_report", "BestCheckpoints.after_report"}


def test_without_a_loss_they_watch_the_logs_first_metric(f1_log: Path) -> None:
    result, notes = bench_json("early-stopping", "--log", str(f1_log))
    assert (result["builtins_metric"], notes) == ("f1", [])


def test_a_metric_the_reports_do_not_carry_is_said_in_one_line(f1_log: Path) -> None:
    result, notes = bench_json("early-stopping", "--log", str(f1_log), "--metric", "val_loss")
    assert result["builtins_metric"] == "val_loss"
    (note,) = notes
    assert note == (
        "eventbus bench: note: early-stopping watches 'val_loss', which the log's reports do "
        "not carry (they carry f1, step): what is timed is its path for a round without "
        "it, not what a run would do (--metric NAME picks another)"
    )
    assert result["notes"] == [note.removeprefix("eventbus bench: note: ")]


def test_the_metric_option_picks_one_of_the_synthetic_workload() -> None:
    result, notes = bench_json(
        "best-checkpoints", "--metrics", "loss,accuracy", "--metric", "accuracy", "--events", "40"
    )
    assert (result["builtins_metric"], notes) == ("accuracy", [])
    result, notes = bench_json("early-stopping", "--metrics", "accuracy", "--events", "40")
    assert (result["builtins_metric"], notes) == ("accuracy", [])  # its first, without a loss


def test_the_table_says_which_metric_the_built_ins_watch() -> None:
    done = bench("early-stopping", "--events", "40")
    assert done.returncode == 0, done.stderr
    assert "the built-ins watch 'loss' (--metric NAME)" in done.stdout.splitlines()


def test_two_built_ins_watching_a_missing_metric_are_said_in_one_line(f1_log: Path) -> None:
    _, notes = bench_json(
        "early-stopping", "best-checkpoints", "--log", str(f1_log), "--metric", "loss"
    )
    (note,) = notes
    assert note.startswith(
        "eventbus bench: note: early-stopping and best-checkpoints watch 'loss', which the "
        "log's reports do not carry (they carry f1, step): what is timed is their path"
    )


def test_a_metric_option_with_no_built_in_to_watch_it_is_said() -> None:
    result, notes = bench_json("noop", "--metric", "loss", "--events", "40")
    assert result["builtins_metric"] == ""
    assert notes == [
        "eventbus bench: note: --metric is for the built-ins early-stopping and "
        "best-checkpoints, and neither is benched: ignored"
    ]


def test_an_empty_metric_is_refused(tmp_path: Path) -> None:
    done = bench("early-stopping", "--metric", " ", "--events", "40", cwd=tmp_path)
    assert done.returncode == 2
    assert done.stderr == "eventbus bench: error: --metric must name a metric, got ' '\n"


def test_no_built_in_faults_on_the_failures_the_workload_injects() -> None:
    """A built-in's ``after_exception`` runs as it would in a run: the bench's own quiet
    logger for ``metrics-logger`` once lacked ``warning``, and every call was a fault."""
    from adapters.cli._bench import BUILTINS

    result, _ = bench_json(*BUILTINS, "--failure-rate", "0.3", "--duration", "4", "--rate", "5")
    called = {row["name"]: row for row in result["callbacks"]}
    assert "MetricsLogger.after_exception" in called
    faulted = {name: row["first_error"] for name, row in called.items() if row["faults"]}
    assert faulted == {}
