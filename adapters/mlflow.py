"""``MLflowLogger``: a run's rounds, configuration and callbacks' cost, in an MLflow run
(docs/operations/trackers.md). It uses an explicit ``MlflowClient``, leaving MLflow's
active-run globals to whatever other integration uses them."""

from __future__ import annotations

import os
import re
import time
from typing import Any

try:
    from mlflow import MlflowClient
    from mlflow.entities import Metric, Param, RunTag
except ImportError as _exc:  # pragma: no cover - depends on the environment
    raise ImportError(
        "adapters.mlflow needs MLflow: pip install 'train-eventbus[mlflow]'"
    ) from _exc

from eventbus import RunResult, TrainRunContext
from eventbus._logging import get_logger
from eventbus._text import describe as describe_exception

from ._tracker import TrackerCallback, backend_name, flat_config, safe_text

__all__ = ["MLflowLogger", "mlflow_key"]

_log = get_logger("adapters.mlflow")

#: What MLflow takes in one ``log_batch`` call (metrics, params and tags together).
_BATCH = 1000
#: MLflow's limits on a param's value and a tag's value, in characters.
_PARAM_LIMIT = 6000
_KEY_LIMIT = 250
_TAG_LIMIT = 5000
#: Rows wait for a checkpoint at most this long, seconds, and this many.
_HOLD_SECS = 30.0
_HOLD_ROWS = 5_000
#: How often rows MLflow refused are tried again, seconds (and at each checkpoint).
_RETRY_SECS = 5.0
#: Rows kept while MLflow refuses writes (about 250 bytes each).
_KEPT_ROWS = 50_000
_STATUS = {"finished": "FINISHED", "failed": "FAILED", "cancelled": "KILLED", "preempted": "KILLED"}
_REFUSED = re.compile(r"[^\w\-. /:]")
#: Path parts MLflow refuses.
_PATH_PARTS = {".": "_", "..": "__"}


def _mlflow_rule(name: str) -> str:
    """Any text as a name MLflow takes (its ``_validate_metric_name``)."""
    parts = _REFUSED.sub("_", name).split("/")
    fixed = "/".join(_PATH_PARTS.get(part, part) for part in parts if part) or "_"
    return "_" + fixed[1:] if fixed.startswith("..") else fixed


def mlflow_key(key: str) -> str:
    """``key`` as an MLflow metric, param or tag name: itself if MLflow takes it; else
    mended, cut to 250 characters, plus ``-`` and a hash, so keys that differ stay apart."""
    return backend_name(key, _mlflow_rule, _KEY_LIMIT)


class MLflowLogger(TrackerCallback, state_name="adapters.MLflowLogger"):
    """Logs the run to an MLflow run.

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
        live: write each round at once, not when a checkpoint makes it final.
        step_metric, per_rank, costs: as ``TensorBoardLogger``'s.

    Attributes:
        mlflow_run_id: the MLflow run's id (saved with each checkpoint: a resume
            continues that run).
        experiment_id: its experiment's id.
    """

    tracker = "MLflow"
    #: A slow store holds the hooks back sooner: the run's end has at most this many left.
    max_lag = 2_000
    name_limit = _KEY_LIMIT
    name_rule = (
        "MLflow takes at most 250 characters: letters, digits, '_', '-', '.', ':', ' ' and "
        "'/' between parts that are neither empty nor '.' or '..' (the rest become '_')"
    )
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

    _backend_rule = staticmethod(_mlflow_rule)

    @property
    def state_key(self) -> str:
        return f"MLflowLogger(experiment={self.experiment!r})"

    # --- in the writer thread ----------------------------------------------------------

    def _open(self, run_context: TrainRunContext, resumed_after: int | None) -> None:
        client = self._client = MlflowClient(self.tracking_uri)
        #: Rows not written yet, in order, and when they are written at the latest.
        self._rows: list[Metric] = []
        self._write_at = 0.0
        #: After a resume: the last step MLflow holds of each key, past the checkpoint.
        self._held: dict[str, int] = {}
        #: While MLflow refuses writes: the first error; rows lost to the bound, and steps.
        self._failing: str | None = None
        self._lost = 0
        self._lost_steps: tuple[int, int] | None = None
        self._checkpoints: list[str] = []
        run = self._saved_run(client) or self._run_of(client, run_context.run_id)
        if run is None:
            tags = {
                **self.tags,
                "eventbus.run_id": run_context.run_id,
                "eventbus.name": run_context.name,
                "eventbus.status": "running",
            }
            tags = {self._name(k, "tag"): safe_text(v)[:_TAG_LIMIT] for k, v in tags.items()}
            name = safe_text(self.run_name or run_context.name)
            run = client.create_run(self._experiment_id(client), run_name=name, tags=tags)
        else:
            client.update_run(run.info.run_id, status="RUNNING")
            client.set_tag(run.info.run_id, "eventbus.status", "running")
            if resumed_after is not None:
                self._held = self._steps_held(client, run, resumed_after)
        self.mlflow_run_id = run.info.run_id
        self.experiment_id = run.info.experiment_id
        try:
            self._log_params(run, run_context.config)
        except Exception as exc:  # the params lost, not the run's metrics
            self._writer().keep_error(exc)

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

    def _steps_held(self, client: Any, run: Any, resumed_after: int) -> dict[str, int]:
        """The last step the MLflow run holds of each metric past the resume's step: MLflow
        cannot take a value back, so those are not written again (one warning)."""
        held: dict[str, int] = {}
        for key in run.data.metrics:
            steps = [m.step for m in client.get_metric_history(run.info.run_id, key)]
            if steps and max(steps) > resumed_after:
                held[key] = max(steps)
        if held:
            _log.warning(
                f"{self!r}: MLflow run {run.info.run_id} already holds steps "
                f"{resumed_after + 1} to {max(held.values())}, which this resume redoes (they "
                "were written before a crash, or the run resumes from an earlier checkpoint "
                "than its last): MLflow cannot take a value back, so it keeps those values "
                "and gets only the steps it does not hold"
            )
        return held

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
        """The run's configuration as params; a resume adds only new ones (MLflow's params
        cannot change: a changed value is an info line)."""
        logged: dict[str, str] = dict(run.data.params)
        params = {
            self._name(k, "config key"): safe_text(str(v))[:_PARAM_LIMIT]
            for k, v in flat_config(config).items()
        }
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
        held = self._held
        if held and step > max(held.values()):
            held.clear()
        rows = self._rows
        if not rows:
            self._write_at = time.monotonic() + _HOLD_SECS
        rows.extend(
            Metric(k, v, timestamp, step)
            for k, v in scalars.items()
            if k not in held or step > held[k]
        )
        due = time.monotonic() >= self._write_at
        if due or (self._failing is None and (self.live or len(rows) >= _HOLD_ROWS)):
            self._write_rows()

    def _text(self, tag: str, text: str, step: int, wall_time: float) -> None:
        value = safe_text(f"step {step}: {text}")[:_TAG_LIMIT]
        self._client.set_tag(self.mlflow_run_id, f"eventbus.{tag}", value)

    def _checkpoint(self, checkpoint: str, round_: int, step: int, wall_time: float) -> None:
        value = safe_text(checkpoint)[:_TAG_LIMIT]
        self._client.set_tag(self.mlflow_run_id, "eventbus.checkpoint", value)
        if self.log_checkpoints:
            self._checkpoints.append(checkpoint)

    def _flush(self) -> None:
        self._write_rows()
        checkpoints, self._checkpoints = self._checkpoints, []
        for checkpoint in checkpoints:
            name = os.path.basename(os.path.normpath(checkpoint))
            if os.path.isdir(checkpoint):
                self._client.log_artifacts(self.mlflow_run_id, checkpoint, f"checkpoints/{name}")
            else:
                self._client.log_artifact(self.mlflow_run_id, checkpoint, "checkpoints")

    def _end(self, result: RunResult) -> None:
        try:
            if result.status == "finished":
                self._flush()
            elif self._rows and self._failing is None:
                steps = sorted({row.step for row in self._rows})
                self._rows = []
                _log.warning(
                    f"{self!r}: the rounds after the last checkpoint (steps {steps[0]} to "
                    f"{steps[-1]}) are not written to MLflow: the run {result.status}, and "
                    "a resume from that checkpoint redoes them (live=True writes every round "
                    "at once)"
                )
        finally:  # the MLflow run ends with ours, whatever the last writes did
            if self._rows or self._lost:
                _log.warning(
                    f"{self!r}: {self._unwritten()} are not written to MLflow, which refused "
                    f"them ({self._failing})"
                )
            ended = {
                "eventbus.status": result.status,
                "eventbus.stopped_by": result.stopped_by,
                "eventbus.error": result.error,
            }
            tags = [RunTag(k, safe_text(v)[:_TAG_LIMIT]) for k, v in ended.items() if v]
            self._client.log_batch(self.mlflow_run_id, tags=tags)
            self._client.set_terminated(self.mlflow_run_id, _STATUS.get(result.status, "FINISHED"))

    def _write_rows(self) -> None:
        """Write the rows waiting, a batch at a time; when MLflow refuses, keep them (at most
        ``_KEPT_ROWS``) and say so once, and once when it takes them again."""
        rows = self._rows
        while rows:
            try:
                self._client.log_batch(self.mlflow_run_id, metrics=rows[:_BATCH])
            except Exception as exc:
                self._refused(exc)
                return
            del rows[:_BATCH]
        if self._failing is not None:
            lost = f"; {self._unwritten()} lost" if self._lost else ""
            _log.warning(
                f"{self!r}: MLflow takes writes again (it refused them: {self._failing}); "
                f"the rows kept meanwhile are written{lost}"
            )
            self._failing, self._lost, self._lost_steps = None, 0, None

    def _refused(self, exc: Exception) -> None:
        rows = self._rows
        if len(rows) > _KEPT_ROWS:
            dropped = rows[: len(rows) - _KEPT_ROWS]
            del rows[: len(dropped)]
            first, last = self._lost_steps or (dropped[0].step, dropped[-1].step)
            self._lost_steps = (min(first, dropped[0].step), max(last, dropped[-1].step))
            self._lost += len(dropped)
        self._write_at = time.monotonic() + _RETRY_SECS
        if self._failing is None:
            self._failing = describe_exception(exc)
            exc.add_note(
                f"{len(rows):,} rows are kept (at most {_KEPT_ROWS:,}) and written when MLflow "
                "takes them"
            )
            self._writer().keep_error(exc)

    def _unwritten(self) -> str:
        """The rows lost and waiting, and their steps, for a message."""
        steps = [row.step for row in self._rows]
        if self._lost_steps is not None:
            steps += self._lost_steps
        count = len(self._rows) + self._lost
        return f"{count:,} rows (steps {min(steps)} to {max(steps)})"


def _absolute(uri: str | None) -> str | None:
    """A SQLite store's relative path taken from the current directory now: MLflow caches
    a store per address, so a relative one would keep meaning the first folder."""
    prefix = "sqlite:///"
    if uri is None or not uri.startswith(prefix) or uri[len(prefix) :].startswith("/"):
        return uri
    path = uri[len(prefix) :]
    return prefix + os.path.abspath(path) if path and path != ":memory:" else uri
