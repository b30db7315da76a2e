"""SIGTERM, what every cluster sends before it kills a job, ends an ``open_run`` in order
(issue 40, item 1): ``after_run`` once with status ``preempted``, ``RunFinished`` in the log,
the log whole, and the process exits quietly with 143 (128 + SIGTERM); a second SIGTERM skips
what is left of the callbacks' work and still closes the log whole. Real signals to real
processes, at random points, on asyncio and trio."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from eventbus import AfterRun, Report, RunFinished
from eventbus.log import read_log

ROOT = Path(__file__).resolve().parents[2]

#: Two workers report for ever, a step each 10 ms; a slow callback, if asked, takes 30 s at
#: the run's end. ``ready`` is written once the first round was handled.
SCRIPT = textwrap.dedent(
    """
    import json, sys, time
    from pathlib import Path
    import anyio
    from handlers import UserCallback, open_run

    out, backend, slow_end = Path(sys.argv[1]), sys.argv[2], sys.argv[3] == "slow-end"

    class Seen(UserCallback):
        def after_report(self, run_context, metrics, checkpoint):
            (out / "ready").touch()

        async def after_run(self, run_context, result):
            with open(out / "after_run.jsonl", "a") as f:
                f.write(json.dumps({"status": result.status, "error": result.error}) + "\\n")
            if slow_end:
                await anyio.sleep(30)

    async def train(reporter):
        step = 0
        while True:
            await reporter.report({"step": step})
            step += 1
            await anyio.sleep(0.01)

    async def main():
        async with open_run(
            world_size=2, callbacks=[Seen()], log=out / "run.evlog", timeout=60,
            drain_timeout=60,
        ) as run:
            await run.workers(train)

    anyio.run(main, backend=backend)
    """
)


def start(out: Path, backend: str, *args: str) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen(
        [sys.executable, "-c", SCRIPT, str(out), backend, *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def wait_for(path: Path, process: subprocess.Popen[str], seconds: float = 60) -> None:
    deadline = time.monotonic() + seconds
    while not path.exists():
        assert process.poll() is None, process.communicate()
        assert time.monotonic() < deadline, f"{path} never came"
        time.sleep(0.01)


def after_runs(out: Path) -> list[dict[str, str]]:
    path = out / "after_run.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
@pytest.mark.parametrize("seed", [0, 1])
def test_sigterm_ends_the_run_in_order_and_exits_143(
    tmp_path: Path, backend: str, seed: int
) -> None:
    process = start(tmp_path, backend, "")
    wait_for(tmp_path / "ready", process)
    time.sleep(random.Random(seed).uniform(0, 0.3))  # a random point of the run
    process.send_signal(signal.SIGTERM)
    _, stderr = process.communicate(timeout=60)
    assert process.returncode == 143, stderr
    assert "Traceback" not in stderr
    assert "SIGTERM: ending run" in stderr and "preempted" in stderr
    assert after_runs(tmp_path) == [{"status": "preempted", "error": "preempted by SIGTERM"}]
    log = read_log(tmp_path / "run.evlog")
    assert not log.truncated
    (finished,) = [e for e in log.events if isinstance(e, RunFinished)]
    assert finished.status == "preempted" and finished.error == "preempted by SIGTERM"
    assert [type(e) for e in log.events].count(AfterRun) == 1
    # Every report handed to the bus before the end is in the log, each rank's in order.
    for rank in (0, 1):
        indices = [e.index for e in log.events if isinstance(e, Report) and e.rank == rank]
        assert indices == list(range(len(indices))) and indices


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_a_second_sigterm_skips_the_callbacks_work_and_still_closes_the_log(
    tmp_path: Path, backend: str
) -> None:
    process = start(tmp_path, backend, "slow-end")
    wait_for(tmp_path / "ready", process)
    process.send_signal(signal.SIGTERM)
    wait_for(tmp_path / "after_run.jsonl", process)  # after_run has begun its 30 s
    process.send_signal(signal.SIGTERM)
    started = time.monotonic()
    _, stderr = process.communicate(timeout=60)
    assert time.monotonic() - started < 20  # not the slow callback's 30 s
    assert process.returncode == 143, stderr
    assert "SIGTERM again: skipping" in stderr
    log = read_log(tmp_path / "run.evlog")
    assert not log.truncated
    (finished,) = [e for e in log.events if isinstance(e, RunFinished)]
    assert finished.status == "preempted"


def test_a_handler_of_the_users_own_is_left_alone(tmp_path: Path) -> None:
    """Code that installed its own SIGTERM handler keeps it: the run takes no signal."""
    script = SCRIPT.replace(
        "anyio.run(main, backend=backend)",
        "import signal, os\n"
        "signal.signal(signal.SIGTERM, lambda *_: os._exit(7))\n"
        "anyio.run(main, backend=backend)",
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    process = subprocess.Popen(
        [sys.executable, "-c", script, str(tmp_path), "asyncio", ""],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    wait_for(tmp_path / "ready", process)
    process.send_signal(signal.SIGTERM)
    process.communicate(timeout=60)
    assert process.returncode == 7
    assert after_runs(tmp_path) == []
