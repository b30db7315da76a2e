"""A run's trackers (a TensorBoard directory and an MLflow experiment) and the checks that
a failed attempt, then its resume, left in them what an uninterrupted run leaves: for
tests/adapter_tests/test_trackers_frameworks.py (Lightning, Hugging Face) and
tests/adapter_tests/test_ray_engine.py (Ray).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from _trackers_readback import (
    each_by_step,
    event_files,
    mlflow_metrics,
    mlflow_only_run,
    rounds_only,
    tensorboard_scalars,
)

from adapters.mlflow import MLflowLogger
from adapters.tensorboard import TensorBoardLogger


@dataclass
class Trackers:
    """One run's trackers: a TensorBoard directory and an MLflow experiment (one database
    for the test, an experiment per run)."""

    root: Path
    uri: str
    name: str
    #: The loggers' ``step_metric`` (``None``: the run's config's, else the round's index).
    step_metric: str | None = None

    @property
    def log_dir(self) -> Path:
        return self.root / self.name / "tensorboard"

    def loggers(self) -> list[Any]:
        """Fresh logger objects for one attempt (a resumed process has new ones, begun
        after the second the attempt it resumes began its event file in: the logger waits
        for it, adapters/tensorboard.py)."""
        step_metric = self.step_metric
        return [
            TensorBoardLogger(self.log_dir, step_metric=step_metric),
            MLflowLogger(self.uri, self.name, step_metric=step_metric),
        ]


def check_failed_attempt(resumed: Trackers, first: list[Any], purge_step: int) -> None:
    """After the failure: one MLflow run, FAILED, with the rounds up to the checkpoint
    only (the later ones are held, never written); TensorBoard has the later ones too."""
    run = mlflow_only_run(resumed.uri, resumed.name)
    assert run.info.status == "FAILED"
    assert run.info.run_id == first[1].mlflow_run_id
    metrics = each_by_step(rounds_only(mlflow_metrics(resumed.uri, run.info.run_id)))
    assert metrics and all(max(steps) < purge_step for steps in metrics.values())
    written = rounds_only(tensorboard_scalars(resumed.log_dir))
    assert max(step for points in written.values() for step, _ in points) >= purge_step


def check_resumed_as_uninterrupted(
    whole: Trackers, resumed: Trackers, first: list[Any], second: list[Any], purge_step: int
) -> None:
    """What both trackers hold of the resumed run is what they hold of the uninterrupted one."""
    # Both attempts wrote into the one directory; the second file's purge marker is the
    # first step after the checkpoint, and the first file really holds steps it drops.
    assert len(event_files(whole.log_dir)) == 1
    before, after = event_files(resumed.log_dir)
    assert (before.purge_step, after.purge_step) == (None, purge_step)
    dropped = {
        (tag, step)
        for tag, points in rounds_only(before.scalars).items()
        for step, _ in points
        if step >= purge_step
    }
    assert dropped, f"the failed attempt wrote nothing after step {purge_step - 1}"
    # ...which the resumed attempt wrote again: without the purge, they would be there twice.
    redone = {
        (tag, step) for tag, points in rounds_only(after.scalars).items() for step, _ in points
    }
    assert all(step >= purge_step for _, step in redone), (
        f"the resumed attempt wrote steps before its purge step {purge_step}: "
        f"{rounds_only(after.scalars)}"
    )
    assert dropped <= redone

    # TensorBoard, as its reader shows it: every round scalar, each step once, same values.
    expected_tb = each_by_step(rounds_only(tensorboard_scalars(whole.log_dir)))
    assert "loss" in expected_tb and len(expected_tb["loss"]) > 1
    assert each_by_step(rounds_only(tensorboard_scalars(resumed.log_dir))) == expected_tb

    # MLflow: one run, continued, FINISHED; each step once, with the uninterrupted values.
    expected_run = mlflow_only_run(whole.uri, whole.name)
    run = mlflow_only_run(resumed.uri, resumed.name)
    assert run.info.status == expected_run.info.status == "FINISHED"
    assert run.info.run_id == first[1].mlflow_run_id == second[1].mlflow_run_id
    assert run.data.tags["eventbus.status"] == "finished"
    expected_ml = each_by_step(rounds_only(mlflow_metrics(whole.uri, expected_run.info.run_id)))
    assert each_by_step(rounds_only(mlflow_metrics(resumed.uri, run.info.run_id))) == expected_ml
    # The two trackers agree on what was written, and where.
    assert {k: sorted(v) for k, v in expected_ml.items()} == {
        k: sorted(v) for k, v in expected_tb.items()
    }
