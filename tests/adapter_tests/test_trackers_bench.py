"""``benchmarks/bench_trackers.py`` runs and reports its targets (figures are for people:
ratios on a shared machine are never asserted). One short repeat of each condition."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("tensorboard")
pytest.importorskip("mlflow")

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_trackers.py"


def test_the_trackers_benchmark_reports_every_condition_and_its_targets() -> None:
    command = [sys.executable, str(BENCH), "--json", "--repeats", "1", "--steps", "60"]
    command += ["--save-every", "20", "--hidden", "64"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=280, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads(done.stdout)
    assert set(results["steps_per_s"]) == {
        "plain",
        "bus",
        "tensorboard",
        "mlflow",
        "mlflow-by-hand",
        "both",
    }
    assert all(figures["median"] > 0 for figures in results["steps_per_s"].values())
    assert set(results["us_per_round"]) == {
        "TensorBoardLogger.on_event",
        "TensorBoardLogger thread",
        "MLflowLogger.on_event",
        "MLflowLogger thread",
    }
    names = [row["name"] for row in results["targets"]]
    assert names[0].startswith("steps/s lost to TensorBoardLogger (MLP 64")
    assert names[1].startswith("steps/s lost to MLflowLogger, in points over a hand-written")
    for row in results["targets"]:
        assert row["met"] == (row["measured"] <= row["target"])
