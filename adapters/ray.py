"""Ray Train v2 adapter: our callbacks and bus behind a ``ray.train.UserCallback``.

Where it runs. Ray pickles the callback and calls it in the ``TrainController``
actor: a separate process on the driver's node, on that actor's asyncio loop
thread. So our bus, our callbacks and the event log all live in the
controller process; the object in the driver is never called. Results come
back through files: the event log recorded to the run's storage path
(``record=True``), which the driver reads or replays after ``fit()``.

What it does. ``after_report(run_context, metrics, checkpoint)`` becomes one
``Report`` per rank (rank ``i`` reported ``metrics[i]``) plus a
``CheckpointSaved`` when Ray persisted a checkpoint; ``after_exception``
becomes one ``WorkerFailure`` per failed rank. The events are handed to a bus
in its own thread (``adapters._bus_thread``), so Ray's loop waits at most for
a bounded hand-off, and every exception is caught here: one raised into Ray
would abort the run as a ``ControllerError``.

Run start and end. A ``UserCallback`` has no such hooks, so the callback
comes with a companion, ``lifecycle`` (a Ray ``ControllerCallback``): pass
both, ``RunConfig(callbacks=[cb, cb.lifecycle])``. It starts the run when the
controller starts and, when it finishes, publishes ``RunFinished``, drains
the bus (up to ``drain_timeout``, on Ray's loop: the run is over) and closes
the log. Without it the run starts at the first report and its end, with
``after_run``, never comes; the log holds what was flushed.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Literal

import msgspec

try:
    from ray.train import UserCallback
    from ray.train.v2._internal.execution.callback import ControllerCallback
except ImportError as _exc:  # pragma: no cover - depends on the environment
    raise ImportError(
        "adapters.ray needs Ray Train v2 (ray>=2.60): pip install 'train-eventbus[ray]'"
    ) from _exc

from eventbus import (
    BusClosed,
    CheckpointSaved,
    CloseReport,
    Event,
    EventBus,
    Report,
    RunFinished,
    RunStarted,
    WorkerFailure,
    get_logger,
)
from handlers import CallbackAttachment, attach_user_callbacks

from ._bus_thread import Backend, BusThread

__all__ = ["EventBusUserCallback", "RunLifecycleCallback", "recorded_logs"]

_log = get_logger("adapters.ray")

RunStatus = Literal["finished", "failed", "cancelled"]
#: Attributes that exist only in the controller, never pickled.
_RUNTIME = ("_thread", "_run_id", "_round", "_bus_lost", "_warned_lifecycle", "log_path")


def recorded_logs(storage_path: str | os.PathLike[str], name: str) -> list[Path]:
    """The event logs ``record=True`` wrote for runs named ``name``, oldest first.

    Each run writes ``<storage_path>/<name>/eventbus-<run_id>.msgpack``; the
    driver does not know the run id (Ray makes it in the controller), so it
    looks them up here after ``fit()``.
    """
    return sorted(
        Path(storage_path, name).glob("eventbus-*.msgpack"), key=lambda p: p.stat().st_mtime
    )


class EventBusUserCallback(UserCallback):  # type: ignore[misc]  # ray is untyped to mypy
    """Delivers Ray Train's reports and failures to ``callbacks`` (``handlers.UserCallback``s).

    ``record``: record the run's events, with ``True`` to
    ``<storage_path>/<name>/eventbus-<run_id>.msgpack`` (the run's storage,
    which must be a local or shared file system; see ``recorded_logs``), or
    to a given path.
    ``period``, ``timeout``, ``budget`` and ``buffer`` configure the bus;
    ``buffer`` also bounds the hand-off, which waits at most
    ``handoff_timeout`` seconds (on Ray's loop) before it drops and counts
    an event. Register ``lifecycle`` too (see the module docstring).
    """

    def __init__(
        self,
        callbacks: Iterable[Any] = (),
        *,
        record: bool | str | os.PathLike[str] = True,
        period: float = 2.0,
        timeout: float = 30.0,
        budget: float = 0.05,
        buffer: int = 1024,
        handoff_timeout: float = 1.0,
        drain_timeout: float = 10.0,
        backend: Backend = "asyncio",
    ) -> None:
        self.callbacks = list(callbacks)
        self.record = record if isinstance(record, bool) else os.fspath(record)
        self.handoff_timeout = handoff_timeout
        self.drain_timeout = drain_timeout
        self.backend: Backend = backend
        self.bus_options: dict[str, Any] = {
            "period": period,
            "timeout": timeout,
            "budget": budget,
            "buffer": buffer,
            "drain_timeout": drain_timeout,
        }
        self.lifecycle = RunLifecycleCallback(self)
        self._reset()

    def _reset(self) -> None:
        self._thread: BusThread | None = None
        self._run_id = ""
        self._round = 0
        self._bus_lost = False
        self._warned_lifecycle = False
        self.log_path: Path | None = None

    # Ray ships the object to its controller with cloudpickle: send the configuration
    # only; the thread, the bus and the log are made there, on first use.
    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        for name in _RUNTIME:
            state.pop(name, None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._reset()

    # --- what users read (in the controller process) -------------------------------------

    @property
    def run_id(self) -> str:
        return self._run_id

    @property
    def attachment(self) -> CallbackAttachment | None:
        result = self._thread.setup_result if self._thread is not None else None
        return result if isinstance(result, CallbackAttachment) else None

    @property
    def dropped(self) -> int:
        return self._thread.dropped if self._thread is not None else 0

    # --- Ray's hooks (the controller's loop thread) -------------------------------------

    def after_report(
        self, run_context: Any, metrics: list[dict[str, Any]], checkpoint: Any | None
    ) -> None:
        try:
            self._ensure_started(run_context, len(metrics))
            path = _checkpoint_path(checkpoint)
            index = self._round
            world_size = len(metrics)
            # Built first, handed off after: a bad entry must not leave a partial round.
            events: list[Event] = [
                Report(
                    run_id=self._run_id,
                    rank=rank,
                    world_size=world_size,
                    index=index,
                    metrics=dict(rank_metrics),
                    checkpoint=path,
                )
                for rank, rank_metrics in enumerate(metrics)
            ]
            if path is not None:
                events.append(
                    CheckpointSaved(
                        run_id=self._run_id,
                        checkpoint=path,
                        index=index,
                        ranks=tuple(range(world_size)),
                        metrics=dict(metrics[0]) if metrics else {},
                    )
                )
            self._round = index + 1
            for event in events:
                self._handoff(event)
        except Exception as exc:  # never into Ray: it would abort the run
            _log.error("after_report not delivered", error=f"{type(exc).__name__}: {exc}")

    def after_exception(self, run_context: Any, worker_exceptions: dict[int, Exception]) -> None:
        try:
            self._ensure_started(run_context, None)
            for rank, exc in sorted(worker_exceptions.items()):
                self._handoff(WorkerFailure.from_exception(self._run_id, int(rank), exc))
        except Exception as exc:
            _log.error("after_exception not delivered", error=f"{type(exc).__name__}: {exc}")

    # --- the run ------------------------------------------------------------------------

    def start(self, run_context: Any, world_size: int | None = None) -> None:
        """Start the bus and publish ``RunStarted`` (the lifecycle companion calls this)."""
        if self._thread is not None:
            return
        self._run_id = str(run_context.run_id)
        run_config = run_context.run_config
        name = str(run_config.name)
        workers = getattr(run_context.scaling_config, "num_workers", None)
        # 0 (unknown: an elastic range, say): the gatherer takes the first report's.
        size = workers if isinstance(workers, int) and workers > 0 else (world_size or 0)
        storage = _local_experiment_dir(run_config)
        self.log_path = self._log_path(storage)
        self._thread = self._start_bus(size)
        self._handoff(
            RunStarted(
                run_id=self._run_id,
                name=name,
                world_size=size,
                config=_json_config(run_context.train_loop_config, size),
                storage=storage,
                wall_time=time.time(),
            )
        )

    def finish(self, status: RunStatus, error: str | None = None) -> CloseReport | None:
        """Publish ``RunFinished``, drain the bus, close the log (bounded by ``drain_timeout``)."""
        thread = self._thread
        if thread is None or not thread.running:
            return None
        final = (
            [] if self._bus_lost else [RunFinished(run_id=self._run_id, status=status, error=error)]
        )
        return thread.close(final, timeout=self.drain_timeout + 5.0)

    def _ensure_started(self, run_context: Any, world_size: int | None) -> None:
        if self._thread is None:
            if not self._warned_lifecycle:
                self._warned_lifecycle = True
                _log.warning(
                    "run started by its first report: add the callback's `lifecycle` to "
                    "RunConfig(callbacks=[cb, cb.lifecycle]) for after_run and a complete log"
                )
            self.start(run_context, world_size)

    def _log_path(self, storage: str | None) -> Path | None:
        if self.record is False:
            return None
        if self.record is True:
            if storage is None:
                _log.warning("no local storage path for the run: its event log is not recorded")
                return None
            return Path(storage, f"eventbus-{self._run_id}.msgpack")
        return Path(self.record)

    def _start_bus(self, world_size: int) -> BusThread:
        callbacks = self.callbacks

        def setup(bus: EventBus) -> CallbackAttachment:
            return attach_user_callbacks(bus, callbacks, world_size=world_size or None)

        thread = BusThread(
            setup,
            log=self.log_path,
            run_id=self._run_id,
            name="eventbus-ray-controller",
            capacity=self.bus_options["buffer"],
            handoff_timeout=self.handoff_timeout,
            backend=self.backend,
            **self.bus_options,
        )
        thread.start()
        return thread

    def _handoff(self, event: Event) -> None:
        thread = self._thread
        if thread is None or self._bus_lost:
            return
        try:
            thread.handoff(event)
        except BusClosed:
            self._bus_lost = True
            _log.error(
                "the callbacks' bus stopped; the run goes on without our callbacks",
                run_id=self._run_id,
                error=repr(thread.error),
            )


class RunLifecycleCallback(ControllerCallback):  # type: ignore[misc]  # ray is untyped to mypy
    """Starts and ends the run of an ``EventBusUserCallback`` with Ray's controller.

    Made by the callback as its ``lifecycle``; Ray pickles both in one list,
    so in the controller this still refers to that callback's copy.
    """

    def __init__(self, owner: EventBusUserCallback) -> None:
        self.owner = owner

    def after_controller_start(self, train_run_context: Any) -> None:
        try:
            self.owner.start(train_run_context)
        except Exception as exc:
            _log.error("event bus not started", error=f"{type(exc).__name__}: {exc}")

    def after_controller_finish(self, result: Any) -> None:
        try:
            error = getattr(result, "error", None)
            if error is None:
                self.owner.finish("finished")
            else:
                self.owner.finish("failed", f"{type(error).__name__}: {error}")
        except Exception as exc:
            _log.error("event bus not closed cleanly", error=f"{type(exc).__name__}: {exc}")

    def before_controller_abort(self) -> None:
        try:
            self.owner.finish("cancelled", "the run was aborted")
        except Exception as exc:
            _log.error("event bus not closed cleanly", error=f"{type(exc).__name__}: {exc}")


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
