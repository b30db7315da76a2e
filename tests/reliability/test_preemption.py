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
from typing import Any

import anyio
import pytest

from eventbus import (
    AfterRun,
    Report,
    RunFinished,
    RunResumed,
    RunStarted,
    StateSnapshotted,
    TrainRunContext,
)
from eventbus.log import read_log
from eventbus.testing import replay_log
from handlers import UserCallback

ROOT = Path(__file__).resolve().parents[2]

#: Two workers report, a step each 10 ms, syncing after each report; they save a checkpoint
#: when asked to (``should_checkpoint``) and stop when asked to (``should_stop``), unless
#: ``deaf`` (they then never stop: the grace period ends them). A slow callback, if asked,
#: takes 30 s at the run's end. ``ready`` is written once the first round was handled.
#: ``resume``: run again on the same folder, as a requeue does; the workers then go on from
#: their checkpoint to step 300 (a run never preempted would end there too).
SCRIPT = textwrap.dedent(
    """
    import json, sys, time
    from pathlib import Path
    import anyio
    from handlers import UserCallback, open_run

    out, backend, how = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
    slow_end, deaf, resume = how == "slow-end", how == "deaf", how == "resume"
    computing = how == "computing"  # steps of 2 ms that await nothing, no sync, 3000 steps

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
        if reporter.latest_checkpoint is not None:
            saved = Path(reporter.latest_checkpoint, f"rank_{reporter.rank}.json")
            step = json.loads(saved.read_text())["step"] + 1
        while (deaf or not reporter.should_stop) and step < (3000 if computing else 300):
            checkpoint = None
            if reporter.should_checkpoint and not deaf:
                checkpoint = out / f"checkpoint_{step}"
                checkpoint.mkdir(exist_ok=True)
                (checkpoint / f"rank_{reporter.rank}.json").write_text(json.dumps({"step": step}))
            await reporter.report({"step": step}, checkpoint=checkpoint)
            step += 1
            if computing:
                until = time.perf_counter() + 0.002
                while time.perf_counter() < until:
                    pass
                continue
            await reporter.sync()
            await anyio.sleep(0.01)

    async def main():
        async with open_run(
            world_size=2, callbacks=[Seen()], log=out / "run.evlog", timeout=60,
            drain_timeout=60, state_dir=out, preempt_grace=1 if deaf else 25,
            resume_from=out if resume else None,
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
    assert "SIGTERM: preempting run" in stderr
    assert after_runs(tmp_path) == [{"status": "preempted", "error": "preempted by SIGTERM"}]
    log = read_log(tmp_path / "run.evlog")
    assert not log.truncated
    (finished,) = [e for e in log.events if isinstance(e, RunFinished)]
    assert finished.status == "preempted" and finished.error == "preempted by SIGTERM"
    assert [type(e) for e in log.events].count(AfterRun) == 1
    # Every report handed to the bus before the end is in the log, each rank's in order,
    # and both ranks stopped at the same step, the one after their preemption checkpoint.
    reports = {
        rank: [e for e in log.events if isinstance(e, Report) and e.rank == rank] for rank in (0, 1)
    }
    for made in reports.values():
        assert [e.index for e in made] == list(range(len(made))) and made
    assert reports[0][-1].metrics["step"] == reports[1][-1].metrics["step"]
    (saved,) = {e.checkpoint for e in reports[0] + reports[1] if e.checkpoint}
    assert saved.endswith(f"checkpoint_{reports[0][-1].metrics['step']}")
    (snapshot,) = [e for e in log.events if isinstance(e, StateSnapshotted)]
    assert snapshot.checkpoint == saved and not snapshot.error


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_workers_whose_steps_await_nothing_hear_it_too(tmp_path: Path, backend: str) -> None:
    """Their reports give the loop its turns: the run ends in order at once. Before, the
    loop never ran while they computed: the grace period ran out, and the workers went on
    to their last step, deaf to the signal."""
    process = start(tmp_path, backend, "computing")
    wait_for(tmp_path / "ready", process)
    process.send_signal(signal.SIGTERM)
    _, stderr = process.communicate(timeout=60)
    assert process.returncode == 143, stderr
    assert "did not end within" not in stderr and "Traceback" not in stderr
    assert after_runs(tmp_path) == [{"status": "preempted", "error": "preempted by SIGTERM"}]
    log = read_log(tmp_path / "run.evlog")
    (finished,) = [e for e in log.events if isinstance(e, RunFinished)]
    assert finished.status == "preempted" and not log.truncated
    last_step = max(e.metrics["step"] for e in log.events if isinstance(e, Report))
    assert last_step < 2999, "the workers never heard the stop"


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_workers_that_never_stop_are_abandoned_at_the_grace_periods_end(
    tmp_path: Path, backend: str
) -> None:
    process = start(tmp_path, backend, "deaf")
    wait_for(tmp_path / "ready", process)
    process.send_signal(signal.SIGTERM)
    started = time.monotonic()
    _, stderr = process.communicate(timeout=60)
    assert time.monotonic() - started < 15
    assert process.returncode == 143, stderr
    assert "did not end within preempt_grace=1 s of SIGTERM" in stderr
    log = read_log(tmp_path / "run.evlog")
    assert not log.truncated
    (finished,) = [e for e in log.events if isinstance(e, RunFinished)]
    assert finished.status == "preempted"


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


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_requeued_it_continues_one_history_from_the_preemption_checkpoint(
    tmp_path: Path, backend: str
) -> None:
    """Run again on the same folder, as Slurm's requeue and a Kubernetes restart do: the
    same run id, the same log appended, every step once after the checkpoint, and the run
    ends as one never preempted ends."""
    process = start(tmp_path, backend, "")
    wait_for(tmp_path / "ready", process)
    process.send_signal(signal.SIGTERM)
    _, stderr = process.communicate(timeout=60)
    assert process.returncode == 143, stderr
    requeued = start(tmp_path, backend, "resume")
    _, stderr = requeued.communicate(timeout=120)
    assert requeued.returncode == 0, stderr
    assert after_runs(tmp_path) == [
        {"status": "preempted", "error": "preempted by SIGTERM"},
        {"status": "finished", "error": None},
    ]
    log = read_log(tmp_path / "run.evlog")
    starts = [e for e in log.events if isinstance(e, RunStarted)]
    assert len(starts) == 2 and starts[0].run_id == starts[1].run_id
    (resumed,) = [e for e in log.events if isinstance(e, RunResumed)]
    assert resumed.checkpoint.startswith(str(tmp_path / "checkpoint_"))
    # Replayed, the history is each step once, 0 to 299, on both ranks.
    inputs = Steps()
    anyio.run(replay_log, tmp_path / "run.evlog", inputs)
    assert inputs.steps == [[step, step] for step in range(300)]


class Steps(UserCallback):
    def __init__(self) -> None:
        self.steps: list[list[int]] = []

    def after_report(
        self, run_context: TrainRunContext, metrics: list[dict[str, Any]], checkpoint: str | None
    ) -> None:
        self.steps.append([m["step"] for m in metrics])


def test_the_demo_preempted_saves_where_it_stands_and_resumes_from_its_folder(
    tmp_path: Path,
) -> None:
    """``eventbus demo`` as a cluster ends it: SIGTERM, exit 143, the preemption checkpoint
    with the callbacks' states in it; run again on the folder, the same run goes on."""
    out = tmp_path / "run"
    demo = [sys.executable, "-m", "adapters.cli", "demo", "--out", str(out), "--patience"]
    args = ["1000000", "--checkpoint-every", "1000000", "--step-time", "0.01"]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    process = subprocess.Popen(
        [*demo, *args, "--steps", "100000"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 60
    while not list(out.glob("*.evlog")):
        assert process.poll() is None and time.monotonic() < deadline, process.communicate()
        time.sleep(0.05)
    time.sleep(1)
    process.send_signal(signal.SIGTERM)
    _, stderr = process.communicate(timeout=60)
    assert process.returncode == 143, stderr
    ((log_path,), (saved,)) = list(out.glob("*.evlog")), list(out.glob("checkpoint_*"))
    assert (saved / "callback_state.json").exists()
    step = int(saved.name.split("_")[1])
    resumed = subprocess.run(
        [*demo, *args, "--steps", str(step + 20), "--resume", str(out)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert resumed.returncode == 0, resumed.stderr
    assert list(out.glob("*.evlog")) == [log_path]  # one run, one log
    ends = [e for e in read_log(log_path).events if isinstance(e, RunFinished)]
    assert [e.status for e in ends] == ["preempted", "finished"]
