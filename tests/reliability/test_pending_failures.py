"""A failure recorded before a checkpoint, still waiting for its health-check period's end,
is part of where the run stood: a run killed after that checkpoint and resumed delivers it
to ``after_exception`` once, as an uninterrupted run does (issue 23, item 21)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from eventbus import TrainRunContext
from eventbus.testing import replay_log
from handlers import UserCallback

ROOT = Path(__file__).resolve().parents[2]

#: A run whose period never ends (an hour), with rank 1 started on its own
#: (``start_worker``), so that its failure neither restarts the group nor ends the
#: run: it waits for its period's end. Rounds wait for rank 0 alone; rank 1 fails at
#: its third step, rank 0 then checkpoints at step 3 (snapshotted with the failure
#: still pending) and the process SIGKILLs itself at step 4 (``kill``).
SCRIPT = textwrap.dedent(
    """
    import json, os, signal, sys
    from pathlib import Path
    import anyio
    from handlers import UserCallback, open_run

    out, kill, resume = Path(sys.argv[1]), sys.argv[2] == "kill", sys.argv[3] or None

    class Failures(UserCallback):
        def after_exception(self, run_context, worker_exceptions):
            with open(out / "seen.jsonl", "a") as f:
                seen = {
                    r: [getattr(e, "error_type", type(e).__name__), getattr(e, "message", str(e))]
                    for r, e in worker_exceptions.items()
                }
                f.write(json.dumps(seen) + "\\n")

        def after_report(self, run_context, metrics, checkpoint):
            if kill and metrics[0]["step"] == 4:
                os.kill(os.getpid(), signal.SIGKILL)

    rank_1_ended = anyio.Event()

    async def rank_1(reporter):
        try:
            for step in range(2):
                await reporter.report({"step": step})
            raise RuntimeError("rank 1 fell over")
        finally:
            rank_1_ended.set()

    async def rank_0(reporter):
        for step in range(4 if resume else 0, 6):
            if step == 3:
                await rank_1_ended.wait()
            checkpoint = None
            if step in (1, 3):
                checkpoint = out / f"checkpoint_{step}"
                checkpoint.mkdir(exist_ok=True)
            await reporter.report({"step": step}, checkpoint=checkpoint)
            await reporter.sync()

    async def main():
        async with open_run(
            world_size=2, required_ranks=[0], callbacks=[Failures()], period=3600.0,
            state_dir=out, resume_from=resume, log=out / "run.evlog",
        ) as run:
            if not resume:
                run.start_worker(1, rank_1)
            await run.workers(rank_0, ranks=[0])

    anyio.run(main)
    """
)


def _run(out: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, "-c", SCRIPT, str(out), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def _seen(out: Path) -> list[dict[str, list[str]]]:
    path = out / "seen.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_a_failure_pending_at_a_snapshot_is_delivered_once_after_a_resume(tmp_path: Path) -> None:
    whole, killed = tmp_path / "whole", tmp_path / "killed"
    whole.mkdir()
    killed.mkdir()
    done = _run(whole, "run", "")
    assert done.returncode == 0, done.stderr
    assert _seen(whole) == [{"1": ["RuntimeError", "rank 1 fell over"]}]

    crashed = _run(killed, "kill", "")
    assert crashed.returncode == -9, crashed.stderr
    assert _seen(killed) == []  # its period never ended: pending when the process died
    resumed = _run(killed, "run", str(killed / "checkpoint_3"))
    assert resumed.returncode == 0, resumed.stderr
    assert _seen(killed) == [{"1": ["RuntimeError", "rank 1 fell over"]}]


class _Exceptions(UserCallback):
    def __init__(self) -> None:
        self.seen: list[dict[int, str]] = []

    def after_exception(
        self, run_context: TrainRunContext, worker_exceptions: dict[int, Exception]
    ) -> None:
        self.seen.append({rank: str(exc) for rank, exc in worker_exceptions.items()})


@pytest.mark.anyio
async def test_the_history_log_replays_the_failure_once_too(tmp_path: Path) -> None:
    assert _run(tmp_path, "kill", "").returncode == -9
    assert _run(tmp_path, "run", str(tmp_path / "checkpoint_3")).returncode == 0
    exceptions = _Exceptions()
    await replay_log(tmp_path / "run.evlog", exceptions)
    assert exceptions.seen == [{1: "RuntimeError: rank 1 fell over"}]
