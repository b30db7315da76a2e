"""The examples users copy still run as written (Ray's: adapter_tests/test_ray_examples.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from _builders import EXAMPLES, run_example


def test_demo_trainer_example() -> None:
    done = run_example("demo_trainer.py", timeout=120)
    assert done.returncode == 0, done.stderr
    assert "rank 1 failed: simulated failure" in done.stdout  # the worker's own exception
    assert "status='finished'" in done.stdout and "restarts=1" in done.stdout
    assert "best checkpoint:" in done.stdout


def test_hf_trainer_example() -> None:
    pytest.importorskip("transformers")
    done = run_example("hf_trainer.py", timeout=300)
    assert done.returncode == 0, done.stderr


def test_lightning_trainer_example() -> None:
    pytest.importorskip("lightning")
    done = run_example("lightning_trainer.py", timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "rank 0 failed: RuntimeError: injected failure at step 8" in done.stdout
    assert "run ended: failed, 4 rounds" in done.stdout
    # Restored as of last.ckpt (step 5: 3 rounds), then the rounds of steps 6 to 15.
    assert "tracker: rounds=9" in done.stdout and "stopped at step 15" in done.stdout


def test_torchrun_train_example_runs_and_resumes_one_history(tmp_path: Path) -> None:
    """As its docstring says: under torchrun, then again with the same ``--out``."""
    pytest.importorskip("torch.distributed")

    def launch(summary: str) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
        command = [
            str(Path(sys.executable).with_name("torchrun")),
            "--standalone",
            "--nproc-per-node",
            "2",
            str(EXAMPLES / "torchrun_train.py"),
            "--out",
            "runs/t",
            "--summary",
            summary,
        ]
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        done = subprocess.run(
            command, capture_output=True, text=True, timeout=300, check=False, cwd=tmp_path, env=env
        )
        assert done.returncode == 0, done.stderr[-3000:]
        written: dict[str, Any] = json.loads((tmp_path / summary).read_text())
        return done, written

    done, first = launch("first.json")
    assert first["status"] == "finished"
    assert first["stopped_by"].startswith("EarlyStopping")
    steps = [[m["step"] for m in metrics] for metrics in first["rounds"]]
    assert steps == [[step, step] for step in range(len(steps))]  # metrics[i] from rank i
    assert "Traceback" not in done.stderr
    again, resumed = launch("again.json")
    assert "resuming from runs/t/checkpoint_" in again.stderr
    # From the latest checkpoint (rank 0 saves at odd steps) to the same stop, the same
    # rounds and the callbacks' same final states: one history, continued.
    start = resumed["rounds"][0][0]["step"]
    assert start % 2 == 0 and 0 < start < len(steps)
    assert resumed["rounds"] == first["rounds"][start:]
    assert resumed["states"] == first["states"]
    assert resumed["stopped_by"] == first["stopped_by"]


def test_trackers_example_fails_then_resumes_into_the_same_tracker_runs(tmp_path: Path) -> None:
    """As its docstring says: run it, then again with the same folder, typed relative."""
    pytest.importorskip("tensorboard")
    pytest.importorskip("mlflow")
    done = run_example("trackers.py", 300, "runs/trackers", cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "the run failed: worker rank(s) 1 failed" in done.stdout
    assert "FAILED" in done.stdout
    again = run_example("trackers.py", 300, "runs/trackers", cwd=tmp_path)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "resuming from runs/trackers/checkpoint_" in again.stderr
    assert "TensorBoard: loss at 30 steps, 30 distinct" in again.stdout
    assert "FINISHED, loss at 30 steps, 30 distinct" in again.stdout
    mlflow_run = done.stdout.split("MLflow: run ")[1].split()[0]
    assert f"MLflow: run {mlflow_run} FINISHED" in again.stdout  # the same MLflow run
