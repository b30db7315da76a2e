"""``MLflowLogger``: a run's rounds, configuration and callbacks' cost, in an MLflow run.

Metrics use TensorBoard's keys (``<metric>``, ``<metric>/rank_<i>``,
``callbacks/<handler>/share``, ...; characters MLflow refuses become ``_``),
at the round's step; the run's configuration becomes params; tags say our run
id and status; checkpoints are logged as artifacts when asked; the MLflow run
ends with our run's status (``FINISHED``, ``FAILED``, ``KILLED`` for a
cancelled run).

One run, once: MLflow keeps every value ever logged for a step (it has no
way to take one back), so by default a round is written when a checkpoint
makes it final, at that checkpoint, and the rounds after the last checkpoint
when the run finishes. A crash rolls back only rounds that were never
written; the resumed run, whose state holds the MLflow run id, continues the
same MLflow run and writes the redone rounds once. ``live=True`` writes each
round at once instead: MLflow is up to date, and a crash leaves the rounds it
rolled back in MLflow's history beside their redone values. A worker-group
restart inside one run keeps its MLflow run.

Everything goes through an explicit ``MlflowClient``: MLflow's active-run
globals (``mlflow.start_run``), which a user or another integration may be
using, are left alone.
"""

from __future__ import annotations

import os
import re
from typing import Any

try:
    from mlflow import MlflowClient
    from mlflow.entities import Metric, Param, RunTag
except ImportError as _exc:  # pragma: no cover - depends on the environment
    raise ImportError(
        "adapters.mlflow needs MLflow: pip install 'train-eventbus[mlflow]'"
    ) from _exc

from eventbus import RunResult, TrainRunContext, get_logger

from ._tracker import TrackerCallback

__all__ = ["MLflowLogger", "mlflow_key"]

_log = get_logger("adapters.mlflow")

#: What MLflow takes in one ``log_batch`` call (metrics, params and tags together).
_BATCH = 1000
#: MLflow's limits on a param's value and a tag's value, in characters.
_PARAM_LIMIT = 6000
_KEY_LIMIT = 250
_TAG_LIMIT = 5000
_STATUS = {"finished": "FINISHED", "failed": "FAILED", "cancelled": "KILLED", "preempted": "KILLED"}
_REFUSED = re.compile(r"[^\w\-. /:]")


def mlflow_key(key: str) -> str:
    """``key`` with each character MLflow refuses in a metric or param name as ``_``,
    cut to MLflow's 250 characters (a key it refuses would fail the whole batch)."""
    return _REFUSED.sub("_", key)[:_KEY_LIMIT]


class MLflowLogger(TrackerCallback, state_name="adapters.MLflowLogger"):
    """Logs the run to an MLflow run (see the module docstring).

    Args:
        tracking_uri: where MLflow tracks (``sqlite:///mlflow.db``, a server's
            address); ``None``: MLflow's default (``MLFLOW_TRACKING_URI``). A
            relative SQLite path is taken from the current directory.
        experiment: the experiment's name, made if missing; ``None``: MLflow's
            default (``MLFLOW_EXPERIMENT_NAME``, else ``Default``).
        run_name: the MLflow run's name; by default our run's name.
        tags: more tags for the MLflow run.
        log_checkpoints: log each checkpoint's files as artifacts
            (``checkpoints/<folder name>``).
        live: write each round at once (see the module docstring).
        step_metric, per_rank, costs: as ``TensorBoardLogger``'s.

    Attributes:
        mlflow_run_id: the MLflow run's id (saved with each checkpoint: a resume
            continues that run).
        experiment_id: its experiment's id.
    """

    tracker = "MLflow"
    state_args = (
        "tracking_uri",
        "experiment",
        "run_name",
        "tags",
        "log_checkpoints",
        "live",
        "step_metric",
        "per_rank",
        "costs",
    )
    state_attributes = (*TrackerCallback.state_attributes, "mlflow_run_id", "experiment_id")

    def __init__(
        self,
        tracking_uri: str | None = None,
        experiment: str | None = None,
        *,
        run_name: str | None = None,
        tags: dict[str, str] | None = None,
        log_checkpoints: bool = False,
        live: bool = False,
        step_metric: str | None = None,
        per_rank: bool = True,
        costs: bool = True,
    ) -> None:
        super().__init__(step_metric=step_metric, per_rank=per_rank, costs=costs)
        self.tracking_uri = _absolute(tracking_uri)
        self.experiment = experiment
        self.run_name = run_name
        self.tags = {str(k): str(v) for k, v in (tags or {}).items()}
        self.log_checkpoints = log_checkpoints
        self.live = live
        self.mlflow_run_id: str | None = None
        self.experiment_id: str | None = None
        self._client: Any = None
        self._held: list[Any] = []
        self._held_steps: set[int] = set()
        self._checkpoints: list[str] = []

    @property
    def state_key(self) -> str:
        return f"MLflowLogger(experiment={self.experiment!r})"

    # --- in the writer thread ----------------------------------------------------------

    def _open(self, run_context: TrainRunContext, resumed_after: int | None) -> None:
        client = self._client = MlflowClient(self.tracking_uri)
        run = self._saved_run(client) or self._run_of(client, run_context.run_id)
        if run is None:
            tags = {
                **self.tags,
                "eventbus.run_id": run_context.run_id,
                "eventbus.name": run_context.name,
                "eventbus.status": "running",
            }
            run = client.create_run(
                self._experiment_id(client), run_name=self.run_name or run_context.name, tags=tags
            )
        else:
            client.update_run(run.info.run_id, status="RUNNING")
            client.set_tag(run.info.run_id, "eventbus.status", "running")
            if resumed_after is not None:
                self._warn_if_ahead(client, run, resumed_after)
        self.mlflow_run_id = run.info.run_id
        self.experiment_id = run.info.experiment_id
        self._log_params(run, run_context.config)

    def _saved_run(self, client: Any) -> Any:
        """The run a restored state names, if the tracking store still has it."""
        if self.mlflow_run_id is None:
            return None
        try:
            return client.get_run(self.mlflow_run_id)
        except Exception as exc:
            _log.warning(
                f"{self!r}: the saved MLflow run {self.mlflow_run_id} is not in the tracking "
                f"store ({exc}); the run is looked up by its id, or a new one is started"
            )
            return None

    def _warn_if_ahead(self, client: Any, run: Any, resumed_after: int) -> None:
        """One warning if the MLflow run holds steps the resume is about to redo: they
        were written live before a crash, or the run resumes from an earlier checkpoint
        than its last one. MLflow cannot take a value back, so it will keep both."""
        key = next((k for k in run.data.metrics if not k.startswith("callbacks/")), None)
        if key is None:
            return
        ahead = [m.step for m in client.get_metric_history(run.info.run_id, key)]
        ahead = [step for step in ahead if step > resumed_after]
        if ahead:
            _log.warning(
                f"{self!r}: MLflow run {run.info.run_id} already holds steps "
                f"{min(ahead)} to {max(ahead)}, which this resume redoes (written live "
                "before a crash, or the run resumes from an earlier checkpoint than its "
                "last): MLflow keeps every value, so those steps will have two"
            )

    def _run_of(self, client: Any, run_id: str) -> Any:
        """The MLflow run tagged with our run's id: a resume whose state did not save it."""
        found = client.search_runs(
            [self._experiment_id(client)],
            filter_string=f"tags.`eventbus.run_id` = '{run_id}'",
            max_results=1,
        )
        return found[0] if found else None

    def _experiment_id(self, client: Any) -> str:
        if self.experiment_id is not None:
            return self.experiment_id
        name = self.experiment or os.environ.get("MLFLOW_EXPERIMENT_NAME")
        if name is None:
            self.experiment_id = "0"  # MLflow's Default experiment
        else:
            found = client.get_experiment_by_name(name)
            self.experiment_id = (
                found.experiment_id if found is not None else client.create_experiment(name)
            )
        return self.experiment_id

    def _log_params(self, run: Any, config: dict[str, Any]) -> None:
        """The run's configuration as params; a resume adds only new ones (MLflow's
        params cannot change, so a changed value is one info line, not an error: the
        framework adapters' configuration says where a resumed run starts)."""
        logged: dict[str, str] = dict(run.data.params)
        params = {mlflow_key(k): str(v)[:_PARAM_LIMIT] for k, v in _flat(config).items()}
        changed = sorted(k for k, v in params.items() if k in logged and logged[k] != v)
        if changed:
            _log.info(
                f"{self!r}: the run's configuration changed since the MLflow run began; "
                f"MLflow keeps the first values of {', '.join(changed)}"
            )
        new = [Param(k, v) for k, v in params.items() if k not in logged]
        for start in range(0, len(new), 100):  # MLflow: at most 100 params a batch
            self._client.log_batch(run.info.run_id, params=new[start : start + 100])

    def _scalars(self, scalars: dict[str, float], step: int, wall_time: float) -> None:
        timestamp = int(wall_time * 1000)
        rows = [Metric(mlflow_key(k), v, timestamp, step) for k, v in scalars.items()]
        if self.live:
            self._write(rows)
        else:
            self._held.extend(rows)
            self._held_steps.add(step)

    def _text(self, tag: str, text: str, step: int, wall_time: float) -> None:
        value = f"step {step}: {text}"[:_TAG_LIMIT]
        self._client.set_tag(self.mlflow_run_id, f"eventbus.{tag}", value)

    def _checkpoint(self, checkpoint: str, round_: int, step: int, wall_time: float) -> None:
        self._client.set_tag(self.mlflow_run_id, "eventbus.checkpoint", checkpoint[:_TAG_LIMIT])
        if self.log_checkpoints:
            self._checkpoints.append(checkpoint)

    def _flush(self) -> None:
        # Cleared once written: a flush that fails keeps them for the next one (MLflow's
        # store takes a row it already has as written, so a retry writes each once).
        self._write(self._held)
        self._held = []
        self._held_steps.clear()
        checkpoints, self._checkpoints = self._checkpoints, []
        for checkpoint in checkpoints:
            name = os.path.basename(os.path.normpath(checkpoint))
            if os.path.isdir(checkpoint):
                self._client.log_artifacts(self.mlflow_run_id, checkpoint, f"checkpoints/{name}")
            else:
                self._client.log_artifact(self.mlflow_run_id, checkpoint, "checkpoints")

    def _end(self, result: RunResult) -> None:
        if self._client is None or self.mlflow_run_id is None:
            return
        if result.status == "finished":
            self._flush()
        elif self._held_steps:
            steps = sorted(self._held_steps)
            _log.warning(
                f"{self!r}: the rounds after the last checkpoint (steps {steps[0]} to "
                f"{steps[-1]}) are not written to MLflow: the run {result.status}, and "
                "a resume from that checkpoint redoes them (live=True writes every round "
                "at once)"
            )
        tags = [RunTag("eventbus.status", result.status)]
        if result.stopped_by:
            tags.append(RunTag("eventbus.stopped_by", result.stopped_by[:_TAG_LIMIT]))
        if result.error:
            tags.append(RunTag("eventbus.error", result.error[:_TAG_LIMIT]))
        self._client.log_batch(self.mlflow_run_id, tags=tags)
        self._client.set_terminated(self.mlflow_run_id, _STATUS.get(result.status, "FINISHED"))

    def _write(self, rows: list[Any]) -> None:
        for start in range(0, len(rows), _BATCH):
            self._client.log_batch(self.mlflow_run_id, metrics=rows[start : start + _BATCH])


def _absolute(uri: str | None) -> str | None:
    """A SQLite store's relative path taken from the current directory now, as every
    path a run is given: MLflow caches a store per address, so the same relative
    address would go on meaning the first folder it was opened from."""
    prefix = "sqlite:///"
    if uri is None or not uri.startswith(prefix) or uri[len(prefix) :].startswith("/"):
        return uri
    path = uri[len(prefix) :]
    return prefix + os.path.abspath(path) if path and path != ":memory:" else uri


def _flat(config: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested dicts as ``outer.inner`` keys."""
    flat: dict[str, Any] = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            flat.update(_flat(value, f"{name}."))
        else:
            flat[name] = value
    return flat
