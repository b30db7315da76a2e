"""Ray Train v2 adapter: our callbacks and bus behind a ``ray.train.UserCallback``, in Ray's
controller (docs/trainers/ray.md). To stop the job or keep state across a resume, use
``RayEngine`` (``open_run(engine=...)``) instead.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, Unpack

import msgspec

try:
    from ray.train import UserCallback
    from ray.train.v2._internal.execution.callback import ControllerCallback
except ImportError as _exc:  # pragma: no cover - depends on the environment
    raise ImportError(
        "adapters.ray needs Ray Train v2 (ray>=2.60): pip install 'train-eventbus[ray]'"
    ) from _exc

from eventbus import Event, RunStatus, WorkerFailure
from eventbus._bus import CloseReport
from eventbus._logging import get_logger
from eventbus._text import describe as describe_exception
from handlers._core import RunCore
from handlers._user import training_callbacks

from ._options import AdapterKeywords, AdapterOptions
from ._ray_engine import RayEngine
from ._threaded_run import ThreadedAdapter, ThreadedRun, log_path

__all__ = [
    "EventBusUserCallback",
    "RayEngine",
    "recorded_logs",
]

_log = get_logger("adapters.ray")

#: Attributes that exist only in the controller, never pickled.
_RUNTIME = ("_warned_lifecycle", "log_path")


def _has_run_hooks(callback_class: type) -> bool:
    """Whether Ray calls ``before_run``/``after_run`` on a ``callback_class`` (its base class)."""
    return hasattr(callback_class, "before_run") and hasattr(callback_class, "after_run")


#: Whether the installed Ray's ``UserCallback`` has run hooks; else ``lifecycle`` does.
_RAY_RUN_HOOKS = _has_run_hooks(UserCallback)


def recorded_logs(storage_path: str | os.PathLike[str], name: str) -> list[Path]:
    """The event logs ``record=True`` wrote for runs named ``name``, oldest first (the
    driver does not know the run id: Ray makes it in the controller)."""
    return sorted(
        Path(storage_path, name).glob("eventbus-*.msgpack"), key=lambda p: p.stat().st_mtime
    )


class EventBusUserCallback(ThreadedAdapter, UserCallback):  # type: ignore[misc]  # untyped to mypy
    """Delivers Ray Train's reports and failures to ``callbacks`` (``handlers.UserCallback``s).

    ``record``: record the run's events, with ``True`` to
    ``<storage_path>/<name>/eventbus-<run_id>.msgpack``, or to a given path. ``options``
    (``adapters.AdapterOptions``) or its keywords configure the bus (``handoff_timeout``
    defaults to 1 s: Ray's loop waits). Register ``lifecycle`` too, unless the installed
    Ray's ``UserCallback`` has ``before_run`` and ``after_run``.
    """

    def __init__(
        self,
        callbacks: Iterable[Any] = (),
        *,
        record: bool | str | os.PathLike[str] = True,
        options: AdapterOptions | None = None,
        **keywords: Unpack[AdapterKeywords],
    ) -> None:
        self.callbacks = training_callbacks(callbacks)
        self.record = record if isinstance(record, bool) else os.fspath(record)
        if options is None:
            keywords.setdefault("handoff_timeout", 1.0)  # it is Ray's loop that waits
        self._run = ThreadedRun(
            "eventbus-ray-controller",
            AdapterOptions.build(options, **keywords),
            steps_in_hooks=False,  # Ray calls its callbacks in its controller's event loop
        )
        self.lifecycle = RunLifecycleCallback(self)
        self._reset()

    def _reset(self) -> None:
        self._warned_lifecycle = False
        self.log_path: Path | None = None

    # Ray ships the object to its controller: the configuration only.
    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        for name in _RUNTIME:
            state.pop(name, None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._reset()

    # --- Ray's hooks (the controller's loop thread) -------------------------------------

    def before_run(self, run_context: Any) -> None:
        """Ray's run start, where its ``UserCallback`` has it: start the run."""
        with _never_into_ray("event bus start"):
            self.start(run_context)

    def after_run(self, run_context: Any, result: Any) -> None:
        """Ray's run end, where its ``UserCallback`` has it: end the run by ``result.error``."""
        _finish_by_result(self, result)

    def after_report(
        self, run_context: Any, metrics: list[dict[str, Any]], checkpoint: Any | None
    ) -> None:
        """Ray's round, gathered already, goes to the run whole (``metrics[i]``: rank i's)."""
        whole: list[dict[str, Any]] | None = None
        with _never_into_ray("after_report"):
            self._ensure_started(run_context, len(metrics))
            path = _checkpoint_path(checkpoint)
            whole = [dict(rank_metrics) for rank_metrics in metrics]
        if whole is not None:  # a callback's failure of the run goes into Ray
            self._run.handoff((self._take_round, whole, path))

    def after_exception(self, run_context: Any, worker_exceptions: dict[int, Exception]) -> None:
        events: list[Event] = []
        with _never_into_ray("after_exception"):
            self._ensure_started(run_context, None)
            attachment = self._run.attachment
            for rank, exc in sorted(worker_exceptions.items()):
                failure = WorkerFailure.from_exception(self.run_id, int(rank), exc)
                if attachment is not None:  # our callbacks get Ray's object itself
                    attachment.keep_original(failure, exc)
                events.append(failure)
        for event in events:
            self._run.handoff(event)

    # --- the run ------------------------------------------------------------------------

    def start(self, run_context: Any, world_size: int | None = None) -> None:
        """Start the bus and publish ``RunStarted`` (the lifecycle companion calls this)."""
        if self._run.thread is not None:
            return
        run_id = str(run_context.run_id)
        run_config = run_context.run_config
        name = str(run_config.name)
        workers = getattr(run_context.scaling_config, "num_workers", None)
        # 0 (unknown: an elastic range, say): the gatherer takes the first report's.
        size = workers if isinstance(workers, int) and workers > 0 else (world_size or 0)
        storage = _local_experiment_dir(run_config)
        if self.record is True and storage is None:
            _log.warning("no local storage path for the run: its event log is not recorded")
        else:
            self.log_path = log_path(self.record, storage or "", run_id)
        core = RunCore(
            self.callbacks,
            name=name,
            world_size=size,
            run_id=run_id,
            config=_json_config(run_context.train_loop_config, size),
            storage=storage,
            # Ray's rounds name their checkpoints; this callback announces none of its own.
            announce_checkpoints=False,
        )
        # Ray's controller loop must not wait here: its workers start on their own anyway.
        self._run.start(core, log=self.log_path, before_run_first=False)

    def finish(self, status: RunStatus, error: str | None = None) -> CloseReport | None:
        """Publish ``RunFinished``, drain the bus, close the log; raise a callback's failure
        of the run not raised into Ray yet."""
        return self._run.finish(status, error)

    def _ensure_started(self, run_context: Any, world_size: int | None) -> None:
        if self._run.thread is None:
            if not self._warned_lifecycle:
                self._warned_lifecycle = True
                _log.warning(
                    "run started by its first report: Ray's before_run did not start it"
                    if _RAY_RUN_HOOKS
                    else "run started by its first report: add the callback's `lifecycle` to "
                    "RunConfig(callbacks=[cb, cb.lifecycle]) for after_run and a complete log"
                )
            self.start(run_context, world_size)


@contextlib.contextmanager
def _never_into_ray(hook: str) -> Iterator[None]:
    """Our own errors are logged: raised into Ray, they would abort the run."""
    try:
        yield
    except Exception as exc:
        _log.error(f"{hook} not delivered", error=describe_exception(exc))


class RunLifecycleCallback(ControllerCallback):  # type: ignore[misc]  # ray is untyped to mypy
    """Starts and ends the run of an ``EventBusUserCallback`` with Ray's controller (where
    Ray has run hooks, it only ends an aborted one)."""

    def __init__(self, owner: EventBusUserCallback) -> None:
        self.owner = owner

    def after_controller_start(self, train_run_context: Any) -> None:
        if not _RAY_RUN_HOOKS:
            with _never_into_ray("event bus start"):
                self.owner.start(train_run_context)

    def after_controller_finish(self, result: Any) -> None:
        if not _RAY_RUN_HOOKS:
            _finish_by_result(self.owner, result)

    def before_controller_abort(self) -> None:
        with _never_into_ray("event bus close"):
            self.owner.finish("cancelled", "the run was aborted")


def _finish_by_result(owner: EventBusUserCallback, result: Any) -> None:
    """End the run as Ray's ``result`` says (``failed`` when ``result.error``)."""
    # The run is over: a callback's failure in its last moments is logged, not raised.
    with _never_into_ray("event bus close"):
        error = getattr(result, "error", None)
        if error is None:
            owner.finish("finished")
        else:
            owner.finish("failed", describe_exception(error))


def _checkpoint_path(checkpoint: Any | None) -> str | None:
    if checkpoint is None:
        return None
    path = getattr(checkpoint, "path", None)
    return str(path) if path is not None else str(checkpoint)


def _local_experiment_dir(run_config: Any) -> str | None:
    """The run's directory when its storage is a local (or mounted) file system."""
    try:
        storage = run_config.storage_context
        if storage.storage_filesystem.type_name != "local":
            return None
        return str(storage.experiment_fs_path)
    except Exception as exc:
        _log.warning("run storage path unknown", error=f"{type(exc).__name__}: {exc}")
        return None


def _json_config(train_loop_config: Any, world_size: int) -> dict[str, Any]:
    """The run's config as JSON values (``train_loop_config`` left out if it is not JSON)."""
    config: dict[str, Any] = {"num_workers": world_size}
    if train_loop_config is not None:
        try:
            config["train_loop_config"] = msgspec.json.decode(
                msgspec.json.encode(train_loop_config)
            )
        except (TypeError, msgspec.EncodeError, ValueError):
            config["train_loop_config"] = repr(train_loop_config)
    return config
