"""Hugging Face Trainer adapter: our callbacks, bus and state store behind one ``TrainerCallback``.

``EventBusCallback`` turns the Trainer's hooks into our events and hands
them to a bus running in a background thread (``adapters._bus_thread``), so
the training loop never waits for our callbacks beyond a bounded hand-off:

- ``on_train_begin`` -> ``RunStarted`` (rank ``args.process_index``, world
  size ``args.world_size``), after restoring our callbacks' state when the
  Trainer resumes from a checkpoint;
- ``on_log`` -> ``Report`` (a copy of ``logs`` plus ``step``; the index
  counts this rank's reports);
- ``on_save`` -> ``CheckpointSaved`` naming the real ``checkpoint-<step>``
  directory. It is published once the reports before it were handled, so the
  state store's snapshot, written into that directory, holds every callback's
  state as of the checkpoint; the states are also merged into the
  checkpoint's ``trainer_state.json`` (``stateful_callbacks``), atomically;
- ``on_train_end`` -> ``RunFinished``, then the bus is drained and closed.

The Trainer has no hook for exceptions: ``run_with_failures(trainer)`` (or
``with callback.failures(): trainer.train()``) turns an exception escaping
``train()`` into a ``WorkerFailure`` and a failed ``RunFinished``.

Our callbacks ask to stop by setting ``should_stop`` (as ``EarlyStopping``
does); the next Trainer hook sets ``control.should_training_stop``. Callbacks
run in the bus thread, so that is usually a step or so after the report that
decided it.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import time
import uuid
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, Literal

try:
    from transformers import TrainerCallback
    from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR, get_last_checkpoint
except ImportError as _exc:  # pragma: no cover - depends on the environment
    raise ImportError(
        "adapters.transformers needs Hugging Face transformers: "
        "pip install 'train-eventbus[transformers]'"
    ) from _exc

from eventbus import (
    BusClosed,
    CheckpointSaved,
    CloseReport,
    EventBus,
    Report,
    RunFinished,
    RunStarted,
    Snapshot,
    StateError,
    StateRestored,
    StateSnapshotted,
    StateStore,
    WorkerFailure,
    atomic_write,
    get_logger,
    is_stateful,
    read_hf_trainer_state,
    to_hf_callbacks,
)
from handlers import CallbackAttachment, attach_user_callbacks

from ._bus_thread import Backend, BusThread

__all__ = [
    "TRAINER_STATE_NAME",
    "EventBusCallback",
    "merge_stateful_callbacks",
    "run_with_failures",
]

_log = get_logger("adapters.transformers")

#: The Trainer's state file in a checkpoint directory (transformers' ``TRAINER_STATE_NAME``).
TRAINER_STATE_NAME = "trainer_state.json"
_HF_SECTION = "stateful_callbacks"
#: After the state store (which emits ``StateSnapshotted`` from its own handler).
_MERGE_ORDER = 2_000_000

RunStatus = Literal["finished", "failed", "cancelled"]


class EventBusCallback(TrainerCallback):  # type: ignore[misc]  # transformers is untyped to mypy
    """Runs ``callbacks`` (``handlers.UserCallback``s) on a bus fed by the Trainer's hooks.

    ``state_root``: where callback states are kept (default: the Trainer's
    ``output_dir``); the checkpoints the Trainer saves must lie inside it, the one
    resumed from may be anywhere. ``state=False``
    turns the state store off. ``log``: record the run's events, to that
    path, or with ``True`` to ``<output_dir>/eventbus-<run_id>.msgpack``.
    ``period``, ``timeout``, ``budget`` and ``buffer`` configure the bus;
    ``buffer`` also bounds the hand-off, which waits at most
    ``handoff_timeout`` seconds for room before it drops (and counts) an
    event. ``drain_timeout`` bounds the drain at the end of training.

    After a resume the restored callbacks are new objects in the same order:
    read them from ``callbacks``, not from references kept from before.
    """

    def __init__(
        self,
        callbacks: Iterable[Any] = (),
        *,
        name: str | None = None,
        run_id: str | None = None,
        state: bool = True,
        state_root: str | os.PathLike[str] | None = None,
        strict_state: bool = False,
        log: bool | str | os.PathLike[str] = False,
        period: float = 2.0,
        timeout: float = 30.0,
        budget: float = 0.05,
        buffer: int = 1024,
        handoff_timeout: float = 5.0,
        drain_timeout: float = 10.0,
        backend: Backend = "asyncio",
    ) -> None:
        self._callbacks = list(callbacks)
        self.name = name
        self.requested_run_id = run_id
        self.state_enabled = state
        self.state_root = state_root
        self.strict_state = strict_state
        self.log = log
        self.handoff_timeout = handoff_timeout
        self.drain_timeout = drain_timeout
        self.backend: Backend = backend
        self._bus_options: dict[str, Any] = {
            "period": period,
            "timeout": timeout,
            "budget": budget,
            "buffer": buffer,
            "drain_timeout": drain_timeout,
        }
        #: Checkpoint the next ``train()`` resumes from, when it cannot be inferred
        #: (``run_with_failures`` sets it from ``resume_from_checkpoint``).
        self.resume_from: str | None = None
        #: What the last resume restored (None if nothing was restored).
        self.restored: StateRestored | None = None
        #: The last run's close report (None while running, or if the bus was abandoned).
        self.close_report: CloseReport | None = None
        self.log_path: Path | None = None
        self.run_id = ""
        self._thread: BusThread | None = None
        self._store: StateStore | None = None
        self._rank = 0
        self._world_size = 1
        self._index = 0
        self._last_metrics: dict[str, Any] = {}
        self._stop = False
        self._stoppers: list[Any] = [cb for cb in self._callbacks if hasattr(cb, "should_stop")]
        self._bus_lost = False
        self._dropped_before = 0

    # --- what users read -------------------------------------------------------------

    @property
    def callbacks(self) -> list[Any]:
        """Our callbacks, as the bus calls them (restored ones after a resume)."""
        return self._callbacks

    @property
    def attachment(self) -> CallbackAttachment | None:
        """The handlers wired on the current (or last) run's bus."""
        thread = self._thread
        result = thread.setup_result if thread is not None else None
        return result if isinstance(result, CallbackAttachment) else None

    @property
    def bus_thread(self) -> BusThread | None:
        return self._thread

    @property
    def dropped(self) -> int:
        """Events dropped at the hand-off, over every run of this callback."""
        return self._dropped_before + (self._thread.dropped if self._thread else 0)

    def request_stop(self) -> None:
        """Ask the Trainer to stop at its next hook."""
        self._stop = True

    @property
    def stop_requested(self) -> bool:
        """Whether ``request_stop`` was called or a callback's ``should_stop`` is true."""
        if self._stop:
            return True
        return any(callback.should_stop is True for callback in self._stoppers)

    def wait_idle(self, timeout: float = 30.0) -> bool:
        """Block until every event handed off so far was handled (for tests, mostly)."""
        return self._thread.wait_idle(timeout) if self._thread is not None else True

    # --- Trainer hooks (the training thread) ---------------------------------------------

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self._thread is not None and self._thread.running:
            self._close("failed", "train() ended without on_train_end (an exception?)")
        self._rank = int(args.process_index)
        self._world_size = int(args.world_size)
        self._index = 0
        self._last_metrics = {}
        self._stop = False
        self._bus_lost = False
        self.close_report = None
        self.run_id = self.requested_run_id or f"{self._run_name(args)}-{uuid.uuid4().hex[:8]}"
        root = Path(self.state_root if self.state_root is not None else args.output_dir)
        self._store = StateStore(root, strict=self.strict_state) if self.state_enabled else None
        checkpoint = self._resume_checkpoint(args, state)
        self.restored = self._restore(checkpoint) if checkpoint is not None else None
        if self._store is not None:
            self._store.register(self._callbacks)
        self._stoppers = [cb for cb in self._callbacks if hasattr(cb, "should_stop")]
        self.log_path = self._log_path(args)
        self._thread = self._start_bus(bool(args.should_save))
        self._handoff(
            RunStarted(
                run_id=self.run_id,
                name=self._run_name(args),
                world_size=self._world_size,
                config={
                    "output_dir": str(args.output_dir),
                    "max_steps": int(state.max_steps),
                    "rank": self._rank,
                    "resumed_from": checkpoint,
                    "global_step": int(state.global_step),
                },
                storage=str(root),
                wall_time=time.time(),
            )
        )
        if self.restored is not None:
            self._handoff(self.restored)

    def on_log(
        self,
        args: Any,
        state: Any,
        control: Any,
        logs: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        thread = self._thread
        if logs is not None and thread is not None and not self._bus_lost:
            metrics = dict(logs)  # HF's PrinterCallback pops from the shared dict
            if "step" not in metrics:
                metrics["step"] = state.global_step
            index = self._index
            self._index = index + 1
            self._last_metrics = metrics
            event = Report(
                run_id=self.run_id,
                rank=self._rank,
                world_size=self._world_size,
                index=index,
                metrics=metrics,
            )
            try:
                thread.handoff(event)
            except BusClosed:
                self._lost_bus()
        if self.stop_requested:
            control.should_training_stop = True

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.stop_requested:
            control.should_training_stop = True

    def on_evaluate(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.stop_requested:
            control.should_training_stop = True

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        thread = self._thread
        if thread is None or self._bus_lost:
            return
        checkpoint = Path(args.output_dir, f"{PREFIX_CHECKPOINT_DIR}-{state.global_step}")
        event = CheckpointSaved(
            run_id=self.run_id,
            checkpoint=str(checkpoint.resolve()),
            index=self._index - 1,
            ranks=(self._rank,),
            metrics=self._last_metrics,
        )
        try:
            thread.handoff_after_idle(event)
        except BusClosed:
            self._lost_bus()

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._close("finished", None)

    # --- failures -----------------------------------------------------------------------

    def fail(self, exc: BaseException) -> None:
        """End the current run because ``exc`` escaped ``train()``.

        An ``Exception`` becomes a ``WorkerFailure`` of this rank and a failed
        run; anything else (``KeyboardInterrupt``) a cancelled run.
        """
        if self._thread is None or not self._thread.running:
            _log.warning(
                "training failed outside a run (before on_train_begin?)",
                error=f"{type(exc).__name__}: {exc}",
            )
            return
        error = f"{type(exc).__name__}: {exc}"
        if isinstance(exc, Exception):
            self._handoff(WorkerFailure.from_exception(self.run_id, self._rank, exc))
            self._close("failed", error)
        else:
            self._close("cancelled", error)

    @contextlib.contextmanager
    def failures(self) -> Iterator[None]:
        """``with callback.failures(): trainer.train()``: an escaping exception ends the run
        as failed (see ``fail``) and propagates."""
        try:
            yield
        except BaseException as exc:
            self.fail(exc)
            raise

    # --- internals ------------------------------------------------------------------------

    def _run_name(self, args: Any) -> str:
        if self.name:
            return self.name
        run_name = getattr(args, "run_name", None)
        return str(run_name) if run_name else Path(str(args.output_dir)).name or "hf-trainer"

    def _log_path(self, args: Any) -> Path | None:
        if self.log is False:
            return None
        if self.log is True:
            return Path(args.output_dir) / f"eventbus-{self.run_id}.msgpack"
        return Path(self.log)

    def _start_bus(self, writes_checkpoints: bool) -> BusThread:
        if self._thread is not None:
            self._dropped_before += self._thread.dropped
        callbacks = self._callbacks
        store = self._store if writes_checkpoints else None
        world_size, rank = self._world_size, self._rank

        def setup(bus: EventBus) -> CallbackAttachment:
            # Each process runs its own bus and sees only its own rank's logs.
            attachment = attach_user_callbacks(
                bus, callbacks, world_size=world_size, required_ranks=[rank]
            )
            if store is not None:
                store.attach(bus)
                bus.subscribe(
                    StateSnapshotted,
                    self._merge_into_trainer_state,
                    name="adapters.transformers.trainer_state",
                    order=_MERGE_ORDER,
                )
            return attachment

        thread = BusThread(
            setup,
            log=self.log_path,
            run_id=self.run_id,
            name=f"eventbus-hf-rank{rank}",
            capacity=self._bus_options["buffer"],
            handoff_timeout=self.handoff_timeout,
            backend=self.backend,
            **self._bus_options,
        )
        thread.start()
        # A process that exits without on_train_end still ends the run and closes the log.
        atexit.register(self._close_at_exit)
        return thread

    def _handoff(self, event: Any) -> None:
        thread = self._thread
        if thread is None or self._bus_lost:
            return
        try:
            thread.handoff(event)
        except BusClosed:
            self._lost_bus()

    def _lost_bus(self) -> None:
        """The bus stopped on its own (a callback with on_error="raise" failed it)."""
        self._bus_lost = True
        thread = self._thread
        _log.error(
            "the callbacks' bus stopped; training goes on without our callbacks",
            run_id=self.run_id,
            error=repr(thread.error) if thread is not None else None,
        )

    def _close_at_exit(self) -> None:
        if self._thread is not None and self._thread.running:
            self._close("failed", "the process exited during training")

    def _close(self, status: RunStatus, error: str | None) -> None:
        thread = self._thread
        if thread is None:
            return
        atexit.unregister(self._close_at_exit)
        final = [RunFinished(run_id=self.run_id, status=status, error=error)]
        self.close_report = thread.close(
            [] if self._bus_lost else final, timeout=self.drain_timeout + 5.0
        )

    def _resume_checkpoint(self, args: Any, state: Any) -> str | None:
        """The checkpoint this ``train()`` resumed from, or None for a fresh run.

        The Trainer does not pass it to callbacks. ``resume_from`` (set by
        ``run_with_failures``) names it exactly; otherwise a run that starts
        past step 0 resumed from ``<output_dir>/checkpoint-<global_step>``,
        the Trainer's own naming.
        """
        explicit, self.resume_from = self.resume_from, None
        if explicit is not None:
            return str(Path(explicit).resolve())
        step = int(state.global_step)
        if step <= 0:
            return None
        candidate = Path(args.output_dir, f"{PREFIX_CHECKPOINT_DIR}-{step}")
        if candidate.is_dir():
            return str(candidate.resolve())
        _log.warning(
            "resumed at a step whose checkpoint is not in output_dir; callback states not "
            "restored (train through run_with_failures(trainer, resume_from_checkpoint=...))",
            global_step=step,
            looked_for=str(candidate),
        )
        return None

    def _restore(self, checkpoint: str) -> StateRestored | None:
        """Rebuild our stateful callbacks from ``checkpoint``: our snapshot file, else the
        ``stateful_callbacks`` of its ``trainer_state.json``."""
        store = self._store
        if store is None:
            return None
        try:
            snapshot = self._saved_states(store, checkpoint)
            if snapshot is None:
                _log.warning("no callback states in the resumed checkpoint", checkpoint=checkpoint)
                return None
            self._callbacks, restored = store.restore(self._callbacks, snapshot)
        except (StateError, OSError, ValueError) as exc:
            if self.strict_state:
                raise
            _log.warning("callback states not restored", checkpoint=checkpoint, error=f"{exc}")
            return None
        return restored

    def _saved_states(self, store: StateStore, checkpoint: str) -> Snapshot | None:
        try:
            return store.load(checkpoint)  # the operator's checkpoint: it may be anywhere
        except FileNotFoundError:
            pass
        trainer_state = Path(checkpoint, TRAINER_STATE_NAME)
        if not trainer_state.is_file():
            return None
        hf = read_hf_trainer_state(trainer_state)
        # HF keeps its own callbacks' states there too: take only our classes'.
        ours = {type(cb).__name__ for cb in self._callbacks if is_stateful(cb)}
        states = {k: v for k, v in hf.states.items() if k.split("[", 1)[0] in ours}
        if not states:
            return None
        return Snapshot(checkpoint=checkpoint, keyed_by="class_name", states=states)

    def _merge_into_trainer_state(self, event: StateSnapshotted) -> None:
        """Bus handler: our states into the checkpoint's ``trainer_state.json``."""
        if event.error or not event.path or self._store is None:
            return
        path = Path(event.checkpoint, TRAINER_STATE_NAME)
        if path.is_file():
            merge_stateful_callbacks(path, self._store.load(event.checkpoint))


def merge_stateful_callbacks(path: str | os.PathLike[str], snapshot: Snapshot) -> None:
    """Put ``snapshot``'s states in the ``stateful_callbacks`` of an HF ``trainer_state.json``.

    HF's own entries (its ``TrainerControl``, its stateful callbacks) are
    kept; an entry named like one of our classes is replaced (after a resume
    HF carries our entries from the resumed checkpoint along, stale). The file
    is rewritten atomically and formatted as HF writes it: HF itself writes it
    with a plain ``open`` just before ``on_save``.
    """
    path = Path(path)
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: not JSON: {exc}") from None
    if not isinstance(document, dict):
        raise ValueError(f"{path}: expected a JSON object (HF's TrainerState)")
    section = document.get(_HF_SECTION) or {}
    if not isinstance(section, dict):
        raise ValueError(f"{path}: {_HF_SECTION} is not a mapping")
    section.update(to_hf_callbacks(snapshot))
    document[_HF_SECTION] = section
    atomic_write(path, (json.dumps(document, indent=2, sort_keys=True) + "\n").encode("utf-8"))


def run_with_failures(trainer: Any, **train_kwargs: Any) -> Any:
    """``trainer.train(**train_kwargs)`` with our ``EventBusCallback`` told about failures.

    An exception escaping ``train()`` becomes a ``WorkerFailure`` and a
    failed ``RunFinished`` (then propagates). ``resume_from_checkpoint`` is
    passed on to the callback, so the exact checkpoint's callback states are
    restored even when it is not ``<output_dir>/checkpoint-<step>``.
    """
    matches = [cb for cb in trainer.callback_handler.callbacks if isinstance(cb, EventBusCallback)]
    if len(matches) != 1:
        raise ValueError(
            f"run_with_failures needs exactly one EventBusCallback on the trainer, found "
            f"{len(matches)}"
        )
    callback = matches[0]
    resume = train_kwargs.get("resume_from_checkpoint")
    if resume is True:
        resume = get_last_checkpoint(trainer.args.output_dir)
    if isinstance(resume, str | os.PathLike):
        callback.resume_from = os.fspath(resume)
    with callback.failures():
        return trainer.train(**train_kwargs)
