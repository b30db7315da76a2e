"""What the trackers hold, read back as their own readers see it, for the resume tests.

TensorBoard: ``EventAccumulator`` (TensorBoard's reader, which applies a resumed
writer's purge marker) and the raw event files (``EventFileLoader``), to show what the
purge dropped. MLflow: ``MlflowClient``'s runs and metric histories.

Scalars are ``{tag: [(step, value), ...]}`` in the order read, so a step logged twice
shows as two entries. The callbacks' cost (``callbacks/...``) depends on timing, not
on training: ``rounds_only`` leaves it out before two runs are compared.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

Points = list[tuple[int, float]]
Scalars = dict[str, Points]

#: The prefix of the callbacks' cost scalars (timing, not training).
COSTS = "callbacks/"


def rounds_only(scalars: Scalars) -> Scalars:
    """``scalars`` without the callbacks' cost."""
    return {tag: points for tag, points in scalars.items() if not tag.startswith(COSTS)}


def by_step(points: Points) -> dict[int, float]:
    """``points`` as ``{step: value}``; a step given twice is an ``AssertionError``."""
    steps = [step for step, _ in points]
    repeated = sorted({step for step in steps if steps.count(step) > 1})
    assert not repeated, f"steps {repeated} are there more than once: {points}"
    return dict(points)


def each_by_step(scalars: Scalars) -> dict[str, dict[int, float]]:
    """``by_step`` of each tag (each step once in each)."""
    return {tag: by_step(points) for tag, points in scalars.items()}


# --- TensorBoard ---------------------------------------------------------------------


def tensorboard_scalars(log_dir: Path | str) -> Scalars:
    """Every scalar tag under ``log_dir`` as TensorBoard shows it (purges applied)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    accumulator = EventAccumulator(str(log_dir))
    accumulator.Reload()
    return {
        tag: [(event.step, event.value) for event in accumulator.Scalars(tag)]
        for tag in accumulator.Tags()["scalars"]
    }


def tensorboard_texts(log_dir: Path | str) -> dict[str, list[tuple[int, str]]]:
    """Every text entry's ``(step, text)``, by tag (``checkpoints``, ``failures``, ...)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    accumulator = EventAccumulator(str(log_dir), size_guidance={"tensors": 0})
    accumulator.Reload()
    texts: dict[str, list[tuple[int, str]]] = {}
    for tag in accumulator.Tags()["tensors"]:
        for event in accumulator.Tensors(tag):
            text = b"".join(event.tensor_proto.string_val).decode()
            texts.setdefault(tag.removesuffix("/text_summary"), []).append((event.step, text))
    return texts


@dataclass
class EventFile:
    """One event file, raw: its purge marker's step (a resumed writer's) and its scalars."""

    path: Path
    purge_step: int | None = None
    scalars: Scalars = field(default_factory=dict)


def event_files(log_dir: Path) -> list[EventFile]:
    """The event files directly in ``log_dir``, in the order they were begun, read raw."""
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader
    from tensorboard.compat.proto.event_pb2 import SessionLog

    files: list[tuple[float, EventFile]] = []
    for path in log_dir.glob("events.out.tfevents.*"):
        read = EventFile(path)
        began: float | None = None
        for event in EventFileLoader(str(path)).Load():
            if began is None:
                began = event.wall_time
            if event.HasField("session_log") and event.session_log.status == SessionLog.START:
                read.purge_step = event.step
            for value in event.summary.value:
                scalar = _scalar(value)
                if scalar is not None:
                    read.scalars.setdefault(value.tag, []).append((event.step, scalar))
        files.append((began if began is not None else 0.0, read))
    return [read for _, read in sorted(files, key=lambda item: item[0])]


def _scalar(value: Any) -> float | None:
    """A summary value's scalar: ``simple_value`` as written, or the scalar tensor that
    ``EventFileLoader`` migrates it to; ``None`` for anything else (text)."""
    from tensorboard.util import tensor_util

    kind = value.WhichOneof("value")
    if kind == "simple_value":
        return float(value.simple_value)
    if kind == "tensor" and value.metadata.plugin_data.plugin_name == "scalars":
        return float(tensor_util.make_ndarray(value.tensor).item())
    return None


# --- MLflow --------------------------------------------------------------------------


def mlflow_runs(tracking_uri: str, experiment: str) -> list[Any]:
    """The runs of ``experiment`` (every status)."""
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri)
    found = client.get_experiment_by_name(experiment)
    assert found is not None, f"no MLflow experiment {experiment!r}"
    return list(client.search_runs([found.experiment_id], max_results=100))


def mlflow_only_run(tracking_uri: str, experiment: str) -> Any:
    """The one run of ``experiment`` (an ``AssertionError`` if there is not exactly one)."""
    runs = mlflow_runs(tracking_uri, experiment)
    assert len(runs) == 1, f"{len(runs)} MLflow runs in {experiment!r}: {runs}"
    return runs[0]


def mlflow_history(tracking_uri: str, run_id: str, key: str) -> Points:
    """Every value MLflow keeps for ``key``, ``(step, value)``, by step (ties kept)."""
    from mlflow import MlflowClient

    history = MlflowClient(tracking_uri).get_metric_history(run_id, key)
    return sorted((int(m.step), float(m.value)) for m in history)


def mlflow_metrics(tracking_uri: str, run_id: str) -> Scalars:
    """Every metric's whole history in the run, in step order (a step twice: twice)."""
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri)
    keys = client.get_run(run_id).data.metrics
    histories: Scalars = {}
    for key in keys:
        history = client.get_metric_history(run_id, key)
        points = [(int(m.step), float(m.value)) for m in history]
        histories[key] = sorted(points, key=lambda point: point[0])
    return histories
