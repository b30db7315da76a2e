"""What a user hears, on the console of a real run: rejected reports (rate-limited), a
worker's failure and the group's restart, the run's end, and which checkpoint a resume
took (issue 23, items 14, 16 and 20). Each script runs as a user's would, in its own
process, with logging left as the library sets it up: its stderr is what they see."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def run_script(source: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(source)],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_rejected_reports_are_heard_at_the_1st_2nd_4th_8th_and_counted_at_the_end(
    tmp_path: Path,
) -> None:
    done = run_script(
        """
        import anyio
        from eventbus import Report
        from handlers import open_run

        async def main():
            async with open_run(world_size=2, run_id="loud") as run:
                for index in range(10):  # rank 7 is outside the world: each one rejected
                    await run.bus.publish(Report(
                        run_id="loud", rank=7, world_size=2, index=index, metrics={}
                    ))

        anyio.run(main)
        """,
        tmp_path,
    )
    assert done.returncode == 0, done.stderr
    lines = [line for line in done.stderr.splitlines() if "rejected (" in line]
    assert len(lines) == 4, done.stderr
    assert "report of rank 7 rejected (rank): rank 7 is outside world size 2" in lines[0]
    assert [line.split("rejected_so_far=")[1].split()[0] for line in lines] == ["1", "2", "4", "8"]
    end = [line for line in done.stderr.splitlines() if "run loud finished" in line]
    assert len(end) == 1 and "10 reports rejected" in end[0] and "warning" in end[0]


def test_a_worker_failure_and_the_restart_are_each_one_line(tmp_path: Path) -> None:
    done = run_script(
        """
        import anyio
        from handlers import open_run

        async def worker(reporter):
            for step in range(4):
                if reporter.rank == 1 and step == 2 and reporter.attempt == 0:
                    raise RuntimeError("lost its device")
                await reporter.report({"loss": 1.0}, checkpoint=None)
                await reporter.sync()

        async def main():
            async with open_run(world_size=2, run_id="shaky") as run:
                await run.workers(worker, max_restarts=1)

        anyio.run(main)
        """,
        tmp_path,
    )
    assert done.returncode == 0, done.stderr
    err = done.stderr
    failed = [line for line in err.splitlines() if "worker rank 1 failed" in line]
    assert len(failed) == 1 and "RuntimeError: lost its device" in failed[0]
    assert "attempt=0" in failed[0]
    restart = [line for line in err.splitlines() if "restarting the worker group" in line]
    assert len(restart) == 1 and "restart 1 of 1" in restart[0]
    end = [line for line in err.splitlines() if "run shaky finished" in line]
    assert len(end) == 1 and "1 worker failure, 1 restart" in end[0]


def test_a_failed_group_says_so_once_before_the_error(tmp_path: Path) -> None:
    done = run_script(
        """
        import anyio
        from handlers import open_run

        async def worker(reporter):
            raise ValueError("bad data")

        async def main():
            async with open_run(world_size=1, run_id="doomed") as run:
                await run.workers(worker)

        anyio.run(main)
        """,
        tmp_path,
    )
    assert done.returncode == 1
    err = done.stderr
    assert err.count("worker rank 0 failed: ValueError: bad data") == 1
    assert "worker group failed: rank(s) 0; no restart left" in err
    assert "run doomed failed" in err and "WorkerGroupError" in err


def test_a_resume_from_the_run_directory_says_which_checkpoint_it_took(
    tmp_path: Path,
) -> None:
    """A kill leaves the newest checkpoint without its snapshot: the latest complete
    one is taken, and named (``ls | tail -1`` would pick the half-written one)."""
    script = """
        import sys
        from pathlib import Path
        import anyio
        from handlers import EarlyStopping, open_run

        resume = sys.argv[1] if len(sys.argv) > 1 else None

        async def worker(reporter):
            for step in range(6):
                checkpoint = None
                if step % 2 == 1:
                    checkpoint = Path("runs/a") / f"checkpoint_{step}"
                    checkpoint.mkdir(parents=True, exist_ok=True)
                await reporter.report({"loss": 1.0 / (step + 1)}, checkpoint=checkpoint)

        async def main():
            async with open_run(
                world_size=1, callbacks=[EarlyStopping("loss")], state_dir="runs/a",
                resume_from=resume,
            ) as run:
                if resume is None:
                    await run.workers(worker)

        anyio.run(main)
        """
    first = run_script(script, tmp_path)
    assert first.returncode == 0, first.stderr
    (tmp_path / "runs/a/checkpoint_7").mkdir()  # what a kill mid-checkpoint leaves
    resumed = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script), "runs/a"],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert resumed.returncode == 0, resumed.stderr
    said = [line for line in resumed.stderr.splitlines() if "resuming from" in line]
    assert len(said) == 1
    assert "resuming from runs/a/checkpoint_5: the latest complete checkpoint in runs/a" in said[0]
