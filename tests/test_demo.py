"""End to end: ``eventbus demo`` as a user runs it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path


def run_demo(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "adapters.cli", "demo", *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_demo_with_a_failing_rank_recovers_and_reports(tmp_path: Path) -> None:
    out = tmp_path / "ck"
    args = ["--workers", "3", "--steps", "40", "--checkpoint-every", "5", "--fail-rank", "1"]
    proc = run_demo(*args, "--out", str(out), "--step-time", "0.002", "--period", "0.05")
    assert proc.returncode == 0, proc.stderr
    text = proc.stdout
    assert "run finished" in text
    assert "failures: 1, restarts: 1" in text
    assert "callback time" in text and "handlers.ReportCallbackHandler" in text
    rounds = int(text.split("run finished: ")[1].split(" rounds")[0])
    assert rounds >= 20  # 40 steps, resumed from a checkpoint after the failure at step 20
    checkpoints = sorted(out.glob("checkpoint_*/rank_*.json"))
    assert checkpoints
    saved = json.loads(checkpoints[0].read_text())
    assert len(saved["weights"]) == 4 and saved["step"] % 5 == 0
    assert "worker failures" in proc.stderr  # MetricsLogger saw after_exception


def test_demo_bad_argument_is_a_one_line_error() -> None:
    proc = run_demo("--workers", "2", "--fail-rank", "5")
    assert proc.returncode == 2
    assert "fail-rank 5" in proc.stderr
