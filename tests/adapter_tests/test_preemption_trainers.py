"""SIGTERM to a process training through the Hugging Face or Lightning adapter ends the run in
order, status ``preempted`` (issue 40, item 1; ``open_run``'s half is
``tests/reliability/test_preemption.py``). Real signals to real trainer processes.

- Hugging Face: the adapter takes SIGTERM (nobody else does): training stops at the next
  step, which saves a checkpoint (ours inside it), the run ends ``preempted`` and
  ``handlers.Preempted`` leaves ``train()``: the process exits 143.
- Lightning installs its own SIGTERM handler and ends ``fit`` with its
  ``SIGTERMException`` (exit code 0, Lightning's choice); the run ends ``preempted``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

pytest.importorskip("torch", reason="torch is not installed (pip install '.[transformers]')")
pytest.importorskip(
    "transformers", reason="transformers is not installed (pip install '.[transformers]')"
)
pytest.importorskip("lightning", reason="lightning is not installed (pip install '.[lightning]')")

from eventbus import RunFinished
from eventbus.log import read_log

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent

SCRIPT = textwrap.dedent(
    """
    import json, os, sys, time
    from pathlib import Path
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    out, framework, bus_runs = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
    from handlers import UserCallback

    class Seen(UserCallback):
        def after_report(self, run_context, metrics, checkpoint):
            (out / "ready").touch()

        def after_run(self, run_context, result):
            (out / "after_run.json").write_text(json.dumps(
                {"status": result.status, "error": result.error,
                 "last_checkpoint": result.last_checkpoint}))

    if framework == "hf":
        import test_hf
        from adapters.transformers import EventBusCallback

        class Slow(test_hf.TinyModel):
            def forward(self, x, y):
                time.sleep(0.01)
                return super().forward(x, y)

        callback = EventBusCallback([Seen()], log=out / "run.evlog", bus_runs=bus_runs)
        trainer = test_hf.make_trainer(out, callback, model=Slow(), max_steps=5000,
                                       save_steps=4000)
        trainer.train()
    else:
        import _lightning_model
        from adapters.lightning import EventBusCallback

        class Slow(_lightning_model.Regression):
            def training_step(self, batch, batch_idx):
                time.sleep(0.01)
                return super().training_step(batch, batch_idx)

        callback = EventBusCallback([Seen()], log=out / "run.evlog", bus_runs=bus_runs)
        trainer = _lightning_model.make_trainer(out, [callback], max_steps=5000)
        trainer.fit(Slow())
    print("training returned")
    """
)


@pytest.mark.parametrize("bus_runs", ["in_hooks", "in_thread"])
@pytest.mark.parametrize("framework", ["hf", "lightning"])
def test_sigterm_ends_a_trainers_run_preempted(
    tmp_path: Path, framework: str, bus_runs: str
) -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(HERE)])}
    process = subprocess.Popen(
        [sys.executable, "-c", SCRIPT, str(tmp_path), framework, bus_runs],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 120
    while not (tmp_path / "ready").exists():
        assert process.poll() is None, process.communicate()
        assert time.monotonic() < deadline, "no round in 120 s"
        time.sleep(0.02)
    process.send_signal(signal.SIGTERM)
    stdout, stderr = process.communicate(timeout=120)
    ended = json.loads((tmp_path / "after_run.json").read_text())
    assert ended["status"] == "preempted" and ended["error"] == "preempted by SIGTERM", stderr
    assert "training returned" not in stdout
    log = read_log(tmp_path / "run.evlog")
    assert not log.truncated
    (finished,) = [e for e in log.events if isinstance(e, RunFinished)]
    assert finished.status == "preempted"
    if framework == "hf":
        assert process.returncode == 143, stderr
        assert "Traceback" not in stderr
        # The preemption checkpoint: the step the signal stopped, our states in it.
        checkpoint = Path(ended["last_checkpoint"])
        assert checkpoint.name.startswith("checkpoint-") and checkpoint.name != "checkpoint-4000"
        assert (checkpoint / "callback_state.json").exists()
    else:
        assert process.returncode == 0, stderr  # Lightning's SIGTERMException exits 0


RAY_SCRIPT = textwrap.dedent(
    """
    import json, os, sys, time
    from pathlib import Path
    import _ray_env
    _ray_env.quiet_ray()  # Ray's environment for tests, before ray is imported
    import anyio
    from adapters.ray import RayEngine
    from handlers import UserCallback, open_run

    out = Path(sys.argv[1])

    class Seen(UserCallback):
        def after_report(self, run_context, metrics, checkpoint):
            (out / "ready").touch()

        def after_run(self, run_context, result):
            (out / "after_run.json").write_text(json.dumps(
                {"status": result.status, "last_checkpoint": result.last_checkpoint}))

    async def train(reporter):
        step = 0
        while not reporter.should_stop:
            checkpoint = None
            if reporter.should_checkpoint:
                folder = Path(out, f"saved_{reporter.rank}_{step}")
                folder.mkdir(exist_ok=True)
                (folder / "step.json").write_text(json.dumps({"step": step}))
                checkpoint = str(folder)
            await reporter.report({"step": step}, checkpoint=checkpoint)
            await reporter.sync()
            step += 1
            time.sleep(0.05)

    async def main():
        engine = RayEngine(init={"num_cpus": 2, "include_dashboard": False})
        run = open_run(world_size=2, callbacks=[Seen()], state_dir=out, engine=engine)
        async with run:
            await run.workers(train)

    anyio.run(main)
    """
)


def test_sigterm_to_a_ray_engine_driver_checkpoints_the_workers_and_ends_preempted(
    tmp_path: Path,
) -> None:
    """``ray.init`` installs Ray's own SIGTERM handler in the driver; the engine keeps the
    run's: the workers save at their next step (Ray persists it), stop, and the run ends
    preempted, exit code 143."""
    pytest.importorskip("ray.train", reason="Ray Train is not installed (pip install '.[ray]')")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(HERE)])}
    process = subprocess.Popen(
        [sys.executable, "-c", RAY_SCRIPT, str(tmp_path)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 180
    while not (tmp_path / "ready").exists():
        assert process.poll() is None, process.communicate()
        assert time.monotonic() < deadline, "no round in 180 s"
        time.sleep(0.1)
    process.send_signal(signal.SIGTERM)
    _, stderr = process.communicate(timeout=120)
    assert process.returncode == 143, stderr[-3000:]
    ended = json.loads((tmp_path / "after_run.json").read_text())
    assert ended["status"] == "preempted"
    saved = Path(ended["last_checkpoint"])  # Ray's copy, in the run's state_dir
    assert saved.parent == tmp_path and (saved / "callback_state.json").exists()
