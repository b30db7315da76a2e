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


def test_demo_resumes_weights_and_callback_state_and_records_its_log(tmp_path: Path) -> None:
    out = tmp_path / "run"
    fast = ["--workers", "2", "--checkpoint-every", "5", "--step-time", "0.001"]
    first = run_demo(*fast, "--steps", "20", "--out", str(out))
    assert first.returncode == 0, first.stderr
    checkpoint = out / "checkpoint_000020"
    saved = json.loads((checkpoint / "callback_state.json").read_text())
    early = next(v for k, v in saved["states"].items() if "EarlyStopping" in k)

    second = run_demo(*fast, "--steps", "30", "--resume", str(checkpoint))
    assert second.returncode == 0, second.stderr
    restored = "restored EarlyStopping, BestCheckpoints, FinalLoss"
    assert f"resumed from {checkpoint}: {restored}" in second.stdout
    # One run, continued: its rounds go on from the checkpoint's (steps 21..30 redone).
    assert "run finished: 30 rounds from 60 reports" in second.stdout
    assert (out / "checkpoint_000030" / "rank_1.json").exists()  # same run directory
    # The callbacks went on from their saved state: early stopping counted every round of
    # both runs, and the top-3 checkpoints still hold one from the first run.
    resumed = json.loads((out / "checkpoint_000030" / "callback_state.json").read_text())
    states = {k.split("[")[0].rsplit(".", 1)[-1]: v for k, v in resumed["states"].items()}
    assert early["attributes"]["rounds"] == 20
    assert states["EarlyStopping"]["attributes"]["rounds"] == 30
    top = [path for _, path in states["BestCheckpoints"]["attributes"]["top"]]
    assert len(top) == 3 and any(int(p[-6:]) <= 20 for p in top)
    assert len(list(out.glob("demo-*.evlog"))) == 1  # one history: the resumed run appended
    resumed_log = second.stdout.split("event log: ")[1].split()[0]
    shown = subprocess.run(
        [sys.executable, "-m", "adapters.cli", "stats", resumed_log],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert shown.returncode == 0, shown.stderr
    assert "StateRestored" in shown.stdout and "Report" in shown.stdout
    assert "RunResumed" in shown.stdout and "rolled back" in shown.stdout


def test_the_demo_is_deterministic_for_a_seed_whatever_the_scheduling(tmp_path: Path) -> None:
    """Ranks paced differently (and a stop on the way: patience 3) end the same."""
    summaries = []
    for pace in ("0", "0.003"):
        where = tmp_path / pace
        done = run_demo(
            "--seed", "7", "--workers", "3", "--steps", "40", "--patience", "3",
            "--step-time", pace, "--out", str(where), "--summary", str(where / "s.json"),
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        summary = json.loads((where / "s.json").read_text())
        del summary["callback_costs"]  # times: they differ from run to run
        # Checkpoint paths name each run's own directory: compare them relative to it.
        summaries.append(json.loads(json.dumps(summary).replace(str(where), "OUT")))
    assert summaries[0] == summaries[1]
    assert summaries[0]["rounds"] > 0 and summaries[0]["final_mean_loss"] is not None
