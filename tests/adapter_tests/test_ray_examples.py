"""Ray's examples still run as written, joining the Ray test files' cluster as a job does
(``RAY_ADDRESS``, set by ``ray job submit``): ``ray_train.py``'s
``RayEngine(init={"num_cpus": 2, ...})`` then leaves out what only shapes a new cluster,
and ``ray_own_trainer.py`` starts none. A second cluster beside that one is left to
``test_preemption_trainers.py``'s Ray driver (once, a driver that had started its own
crashed at exit, inside Ray, beside the shared cluster on two loaded cores)."""

from __future__ import annotations

from pathlib import Path

import pytest
from _builders import run_example
from _ray_env import quiet_ray

quiet_ray()  # before ray is imported

pytest.importorskip("ray.train", reason="Ray Train is not installed (pip install '.[ray]')")

from adapters._ray_engine import _init_keywords  # noqa: E402


def test_ray_train_example_runs_and_resumes_from_a_relative_folder(
    tmp_path: Path, joining_ray: dict[str, str]
) -> None:
    """As the README says: run it, then again with the same folder, typed relative."""
    done = run_example("ray_train.py", 300, "runs/ray", cwd=tmp_path, env=joining_ray)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "rank 1 failed: RuntimeError: injected failure on rank 1 at step 5" in done.stdout
    assert "1 restart(s)" in done.stdout and "stopped by EarlyStopping" in done.stdout
    again = run_example("ray_train.py", 300, "runs/ray", cwd=tmp_path, env=joining_ray)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "resuming from runs/ray/checkpoint_" in again.stderr
    assert "failed" not in again.stdout and "stopped by EarlyStopping" in again.stdout
    first_line = done.stdout.splitlines()[0]
    assert first_line.startswith("run run-") and again.stdout.startswith(first_line)  # its id


def test_ray_own_trainer_example(joining_ray: dict[str, str]) -> None:
    done = run_example("ray_own_trainer.py", timeout=300, env=joining_ray)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "fit() raised WorkerGroupError, as injected" in done.stdout
    assert "[replay] rank 1 failed: RuntimeError: injected failure" in done.stdout
    assert "[replay] run ended: failed" in done.stdout


def test_init_keywords_shape_a_new_cluster_only_where_one_is_started(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    init = {"num_cpus": 2, "num_gpus": 0, "resources": {"x": 1}, "include_dashboard": False}
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    assert _init_keywords(init) == init
    assert _init_keywords({**init, "address": "local"}) == {**init, "address": "local"}
    joined = {"address": "10.0.0.1:6379", "include_dashboard": False}
    assert _init_keywords({**init, "address": "10.0.0.1:6379"}) == joined
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.1:6379")
    assert _init_keywords(init) == {"include_dashboard": False}
    assert _init_keywords({**init, "address": "local"}) == {**init, "address": "local"}
