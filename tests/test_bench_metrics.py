"""What the bench's synthetic reports carry (issue 28, item 6): names a training job
reports by default, the loss first, or what ``--metrics`` says (names, or how many);
bad input is one line naming the flag, exit 2, before anything runs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from adapters.cli._bench_runner import Workload, synthetic_events
from eventbus import Report
from eventbus.options import OptionError

CALLBACKS = '''
from handlers import UserCallback


class LossReader(UserCallback):
    """Reads the loss of every rank, as a training callback does."""

    def after_report(self, run_context, metrics, checkpoint):
        sum(m["loss"] for m in metrics)


class GradNormReader(UserCallback):
    def after_report(self, run_context, metrics, checkpoint):
        sum(m["grad_norm"] for m in metrics)
'''


@pytest.fixture
def callbacks_dir(tmp_path: Path) -> Path:
    """A directory with ``metric_callbacks.py``; the command runs there (``module:Name``)."""
    (tmp_path / "metric_callbacks.py").write_text(CALLBACKS)
    return tmp_path


def bench(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "adapters.cli", "bench", *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=cwd,
        check=False,
        env={**os.environ, "COLUMNS": "100"},
    )


def bench_json(*args: str, cwd: Path | None = None) -> dict[str, Any]:
    done = bench(*args, "--repeat", "1", "--json", "-", cwd=cwd)
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def figures(result: dict[str, Any], name: str) -> dict[str, Any]:
    found: list[dict[str, Any]] = [f for f in result["callbacks"] if f["name"] == name]
    (one,) = found
    return one


def test_a_callback_reading_the_loss_is_measured_on_the_default_workload(
    callbacks_dir: Path,
) -> None:
    """Before: the reports carried metric_0 ... metric_7, a KeyError at every call and a
    traceback, exit 1."""
    result = bench_json(
        "metric_callbacks:LossReader", "--events", "80", "--world-size", "4", cwd=callbacks_dir
    )
    assert result["metrics"][0] == "loss"
    assert result["metrics"] == [
        "loss",
        "accuracy",
        "learning_rate",
        "grad_norm",
        "val_loss",
        "val_accuracy",
        "throughput",
        "step_time",
    ]
    reader = figures(result, "LossReader.after_report")
    assert reader["calls"] == reader["bus_calls"] == 20
    assert (reader["faults"], reader["bus_faults"], reader["first_error"]) == (0, 0, "")


def test_the_table_says_what_the_reports_carry(callbacks_dir: Path) -> None:
    done = bench(
        *("metric_callbacks:LossReader", "--metrics", "loss, accuracy", "--events", "40"),
        *("--repeat", "1"),
        cwd=callbacks_dir,
    )
    assert done.returncode == 0, done.stderr
    assert "reports carry 2 metrics: loss, accuracy" in done.stdout.splitlines()


def test_metrics_by_name_are_what_every_report_carries(callbacks_dir: Path) -> None:
    result = bench_json(
        *("metric_callbacks:LossReader", "metric_callbacks:GradNormReader"),
        *("--metrics", "loss,accuracy", "--events", "40", "--world-size", "2"),
        cwd=callbacks_dir,
    )
    assert result["metrics"] == ["loss", "accuracy"]
    assert figures(result, "LossReader.after_report")["faults"] == 0
    missing = figures(result, "GradNormReader.after_report")
    assert missing["faults"] == missing["calls"] == 20  # it reads a metric not reported
    assert missing["first_error"] == "KeyError: 'grad_norm'"


def test_a_count_of_metrics_takes_the_default_names_first() -> None:
    three = Workload(metrics=3, events=4, world_size=2)
    assert three.metric_names == ("loss", "accuracy", "learning_rate")
    ten = Workload(metrics=10, events=4, world_size=2).metric_names
    assert ten[:8] == Workload().metric_names and ten[8:] == ("metric_8", "metric_9")
    reports = [e for e in synthetic_events(three) if isinstance(e, Report)]
    assert len(reports) == 4
    assert all(list(r.metrics) == ["loss", "accuracy", "learning_rate"] for r in reports)
    named = Workload(metrics=("loss", "f1"), events=2, world_size=1)
    assert [list(e.metrics) for e in synthetic_events(named) if isinstance(e, Report)] == [
        ["loss", "f1"],
        ["loss", "f1"],
    ]


def test_the_count_form_still_works_on_the_command_line() -> None:
    result = bench_json("noop", "--metrics", "3", "--events", "40")
    assert result["metrics"] == ["loss", "accuracy", "learning_rate"]


def test_the_help_names_the_default_metrics() -> None:
    done = bench("--help")
    assert done.returncode == 0, done.stderr
    text = " ".join(done.stdout.split())
    assert "--metrics N|NAMES" in text
    assert "loss, accuracy, learning_rate, grad_norm" in text
    assert "--metric NAME" in text


BAD_METRICS = {
    "zero": "0",
    "negative": "-1",
    "empty": "",
    "an empty name": "a,,b",
    "a trailing comma": "loss,",
    "a name twice": "loss,accuracy,loss",
    "a huge count": "100000000000000000000",
    "one more than the most": "1001",
    "a mistyped count": "8.5",
}


@pytest.mark.parametrize("value", BAD_METRICS.values(), ids=BAD_METRICS.keys())
def test_bad_metrics_are_one_line_naming_the_flag(tmp_path: Path, value: str) -> None:
    done = bench("noop", "--metrics", value, "--events", "40", cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    assert lines[0].startswith("eventbus bench: error: --metrics "), lines[0]
    assert done.stdout == ""  # refused before anything ran


def test_the_errors_say_what_is_wrong() -> None:
    def said(metrics: Any) -> str:
        with pytest.raises(OptionError) as info:
            Workload(metrics=metrics)
        assert info.value.option == "metrics"
        return str(info.value)

    assert said(0) == (
        "metrics must be a whole number of metrics from 1 to 1,000, or their names "
        "(loss,accuracy), got 0"
    )
    assert said(("a", "", "b")) == "metrics has an empty name (name 2 of 3 in 'a,,b')"
    assert said(("loss", "loss")) == "metrics names 'loss' twice (in 'loss,loss')"
    assert said(tuple(f"m{i}" for i in range(1001))) == (
        "metrics names 1,001 metrics, more than 1,000"
    )


def test_a_workload_too_big_to_hold_its_metrics_is_refused_in_words(tmp_path: Path) -> None:
    done = bench("noop", "--metrics", "1000", "--events", "2000000", cwd=tmp_path)
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1, done.stderr
    assert "2,000,000,000 metric values" in done.stderr and "more than 20,000,000" in done.stderr


def test_workload_options_with_a_log_are_refused_not_ignored(tmp_path: Path) -> None:
    from eventbus import RunStarted
    from eventbus.log import LogRecorder

    log = tmp_path / "run.evlog"
    with LogRecorder(log) as recorder:
        recorder.write(RunStarted(run_id="r", name="r", world_size=1, seq=0, time=1.0))
    done = bench("noop", "--log", str(log), "--metrics", "loss", "--world-size", "2", cwd=tmp_path)
    assert done.returncode == 2
    assert done.stderr == (
        "eventbus bench: error: --world-size, --metrics: not with --log (they shape the "
        "synthetic workload; the log's events are the workload)\n"
    )
