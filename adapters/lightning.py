"""PyTorch Lightning adapter: our callbacks, bus and state store behind one Lightning ``Callback``.

Rank 0 runs the bus and our callbacks; under DDP the other ranks' metrics are gathered to it.
The mapping, stopping and resume are in docs/trainers/lightning.md.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, Unpack

import msgspec

try:
    from lightning.fabric.plugins import CheckpointIO
    from lightning.pytorch import Callback
    from lightning.pytorch.utilities.exceptions import SIGTERMException
except ImportError as _exc:  # pragma: no cover - depends on the environment
    raise ImportError(
        "adapters.lightning needs PyTorch Lightning: pip install 'train-eventbus[lightning]'"
    ) from _exc

from eventbus import CheckpointSaved, StateRestored
from eventbus._events import RunPosition
from eventbus._logging import get_logger
from eventbus._text import describe as describe_exception
from eventbus.state import StateError, StateStore
from eventbus.state._model import Snapshot
from handlers import Preempted
from handlers._core import RunCore
from handlers._resume import Resume
from handlers._user import training_callbacks

from ._options import AdapterKeywords, AdapterOptions
from ._threaded_run import ThreadedAdapter, ThreadedRun, log_path
from ._tracker import STEP_METRIC

__all__ = ["EventBusCallback"]

_log = get_logger("adapters.lightning")


class EventBusCallback(ThreadedAdapter, Callback):  # type: ignore[misc]  # untyped to mypy
    """Runs ``callbacks`` (``handlers.UserCallback``s) on a bus fed by a Lightning Trainer.

    The options are those of ``adapters.transformers.EventBusCallback``; ``state_root``
    defaults to the ``ModelCheckpoint`` folder, else the Trainer's ``default_root_dir``.
    A resume restores the callbacks in place (read them from ``callbacks``).
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
        options: AdapterOptions | None = None,
        **keywords: Unpack[AdapterKeywords],
    ) -> None:
        self._callbacks = training_callbacks(callbacks)
        self.name = name
        self.requested_run_id = run_id
        self.state_enabled = state
        self.state_root = state_root
        self.strict_state = strict_state
        #: Not ``self.log``, which Lightning sets on every callback.
        self.event_log = log
        self._run = ThreadedRun("eventbus-lightning", AdapterOptions.build(options, **keywords))
        self.restored: StateRestored | None = None
        self.log_path: Path | None = None
        self._writes_states = False
        self._reset()

    def _reset(self) -> None:
        self._trainer: Any = None
        self._store: StateStore | None = None
        #: The states Lightning's checkpoint held, until the run starts.
        self._loaded: Snapshot | None = None
        #: For a ``last.ckpt`` copy: where the run stood at the last checkpoint, and the
        #: step and file of the last save.
        self._saved_position: tuple[str, RunPosition | None] | None = None
        self._saved_at: tuple[int, str] | None = None
        self._rank = 0
        self._world_size = 1
        self._index = 0
        self._last_metrics: dict[str, Any] = {}
        #: This step's round, until a save names it or the step ends.
        self._held: list[dict[str, Any]] = []
        #: Under DDP, every rank asks rank 0 whether to stop at the next step.
        self._sync_stop = False

    def __getstate__(self) -> dict[str, Any]:
        """What a spawned process (``ddp_spawn``) needs: the configuration, no run."""
        state = dict(self.__dict__)
        state.update(_trainer=None, _store=None)
        return state

    @property
    def callbacks(self) -> list[Any]:
        """Our callbacks, as the bus calls them (restored ones after a resume)."""
        return self._callbacks

    # --- Lightning's checkpoint ------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """Our callbacks' states for Lightning's checkpoint, as the run left them (during a
        run ``_before_save`` puts them in, once the checkpoint's round was handled)."""
        if self._store is None or (self._run.running and self._writes_states):
            return {}
        return msgspec.to_builtins(self._store.capture(run_id=self.run_id))  # type: ignore[no-any-return]

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Kept until the run starts, which restores it in place."""
        try:
            self._loaded = msgspec.convert(state_dict, Snapshot)
        except msgspec.ValidationError as exc:
            if self.strict_state:
                raise StateError(f"callback states in the checkpoint are malformed: {exc}") from exc
            _log.warning(
                "callback states in the checkpoint are malformed: not restored", error=str(exc)
            )

    # --- Trainer hooks ------------------------------------------------------------------

    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        """Every checkpoint Lightning writes goes through us (``_StatesIntoCheckpoints``)."""
        if stage == "fit":
            strategy = trainer.strategy
            self._writes_states = True
            if not isinstance(strategy.checkpoint_io, _StatesIntoCheckpoints):
                strategy.checkpoint_io = _StatesIntoCheckpoints(
                    strategy.checkpoint_io,
                    owner=self,
                    before=self._before_save,
                    after=self._after_save,
                    removed=self._removed,
                )

    def teardown(self, trainer: Any, pl_module: Any, stage: str) -> None:
        strategy = trainer.strategy
        io = strategy.checkpoint_io
        if isinstance(io, _StatesIntoCheckpoints) and io.owner is self:
            strategy.checkpoint_io = io.inner
        self._writes_states = False

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        if self._run.running:
            self._close("failed", "fit() ended without on_train_end (an exception?)")
        loaded = self._loaded
        self._reset()
        self._rank, self._world_size = int(trainer.global_rank), int(trainer.world_size)
        if self._rank != 0:
            return
        self._trainer = trainer
        name = self._run_name(trainer)
        root = Path(self.state_root) if self.state_root is not None else _checkpoint_dir(trainer)
        self._store = StateStore(root, strict=self.strict_state) if self.state_enabled else None
        resumed_from = str(Path(trainer.ckpt_path).resolve()) if trainer.ckpt_path else None

        resume = self._resume_in(self._store, resumed_from, loaded)
        self.restored = (
            self._restore_from(
                self._store, resumed_from, lambda s, c: self._saved_states(s, c, loaded)
            )
            if resumed_from
            else None
        )
        if self._store is not None:
            self._store.register(self._callbacks)
        self._watch_stops(self._callbacks)
        if int(trainer.log_every_n_steps) <= 0:
            _log.warning(
                "log_every_n_steps=0: Lightning logs nothing, so our callbacks get rounds "
                "only at saves, of {'step': N} alone"
            )
        core = RunCore(
            self._callbacks,
            name=name,
            world_size=self._world_size,
            run_id=self.requested_run_id,
            config={
                "default_root_dir": str(trainer.default_root_dir),
                "max_steps": int(trainer.max_steps),
                "max_epochs": trainer.max_epochs,
                "log_every_n_steps": int(trainer.log_every_n_steps),
                "resumed_from": resumed_from,
                "global_step": int(trainer.global_step),
                # The trackers' x-axis: Lightning's global step.
                STEP_METRIC: "step",
                **_hparams(pl_module),
            },
            storage=str(root),
            store=self._store,
            position_of=self._position_of,
            # Lightning writes a checkpoint after its round: ``_after_save`` announces it.
            announce_checkpoints=False,
        )
        core.resumed(resume, restored=self.restored)
        self._index = core.first_index(0)
        self.log_path = log_path(self.event_log, trainer.default_root_dir, core.run_id)
        self._start_run(core, log=self.log_path, name="eventbus-lightning")

    def on_train_batch_start(
        self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int
    ) -> None:
        """The previous step ended: its round goes; then a stop asked for is passed on (under
        DDP to every rank at once, so rank 0 raises a failure only once all were told)."""
        handed_off = bool(self._held)
        if self._world_size == 1:
            if handed_off:
                self._release(None)
            if self._run.running:
                self._check(trainer, handed_off)
        elif self._sync_stop:  # every rank, at the same step, learns rank 0's decision
            self._sync_stop = False
            failure: BaseException | None = None
            try:
                if handed_off:
                    self._release(None)
                if self._run.running:
                    self._check(None, handed_off)
            except BaseException as exc:
                failure = exc
            stop = self._rank == 0 and (failure is not None or self.stop_requested)
            if trainer.strategy.broadcast(stop, src=0):
                trainer.should_stop = True
            if failure is not None:
                raise failure

    def on_train_batch_end(
        self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        """A step at which Lightning logs: its round, held until the step's saves."""
        if not _logs_now(trainer):
            return
        metrics = _floats(trainer.callback_metrics)
        metrics["step"] = int(trainer.global_step)
        everyone = self._gather(metrics)
        self._sync_stop = self._world_size > 1
        if everyone is None or not self._run.running:
            return
        self._hold(everyone)

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        self._trainer = None
        if self._run.running:
            self._end_training()

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        """``fit`` failed on this rank: the run fails (an interrupt: cancelled)."""
        self._trainer = None
        if self._rank != 0:
            _log.error(
                f"training failed on rank {self._rank}; our callbacks run on rank 0, which "
                "records it only if it fails too",
                error=describe_exception(exception),
            )
            return
        if isinstance(exception, SIGTERMException):  # Lightning's own SIGTERM handler's
            exception = Preempted(signal.SIGTERM)
        self._fail(exception, self._rank)

    # --- saves (rank 0: the only one that writes) ------------------------------------

    def _before_save(self, checkpoint: dict[str, Any], path: str | os.PathLike[str]) -> str | None:
        """Before Lightning writes ``path``: this step's round names it and is handled, and
        our states go into ``checkpoint``. Returns the location our snapshot is for, if any."""
        trainer = self._trainer
        if not self._run.running or trainer is None:
            return None
        location = str(Path(path).resolve())
        is_copy = _is_last_copy(trainer, location)
        if not is_copy and not self._held:  # a save at a step that did not log
            step = int(trainer.global_step)
            self._hold([{"step": step} for _ in range(self._world_size)])
        self._release(None if is_copy else location)
        waited = self._run.drain_timeout
        if not self.wait_idle(waited):
            _log.warning(
                f"callback states for a checkpoint taken while the bus was still busy after "
                f"{waited:g} s (drain_timeout): they may miss the checkpoint's round",
                checkpoint=location,
            )
        if self._store is not None and "callbacks" in checkpoint:  # not weights_only
            position = self._copied_position(trainer) if is_copy else None
            states = self._store.capture(location, run_id=self.run_id, position=position)
            checkpoint["callbacks"][self.state_key] = msgspec.to_builtins(states)
        if not is_copy:
            self._saved_at = (int(trainer.global_step), location)
        return None if is_copy else location

    def _copied_position(self, trainer: Any) -> RunPosition | None:
        """Where the run stood at the file this step saved, for its ``last.ckpt`` copy."""
        saved_at, saved = self._saved_at, self._saved_position
        if saved_at is None or saved is None or saved_at[0] != int(trainer.global_step):
            return None
        return saved[1] if saved[0] == saved_at[1] else None

    def _after_save(self, location: str) -> None:
        """Once written: our snapshot beside it, after its round; a stop asked for then."""
        event = CheckpointSaved(
            run_id=self.run_id,
            checkpoint=location,
            index=self._index - 1,
            ranks=tuple(range(self._world_size)),
            metrics=self._last_metrics,
        )
        self._run.handoff(event, after_idle=True)
        if self._world_size == 1 and self._trainer is not None:
            self._check(self._trainer)

    def _removed(self, path: str | os.PathLike[str]) -> None:
        """Lightning removed a checkpoint (top-k): our snapshot beside it goes too."""
        store = self._store
        if store is None or not self._run.running:
            return
        self.wait_idle(self._run.drain_timeout)  # its snapshot may still be on its way
        try:
            store.path_of(path).unlink(missing_ok=True)
        except (StateError, OSError) as exc:
            _log.warning("snapshot of a removed checkpoint left", path=str(path), error=str(exc))

    # --- internals ------------------------------------------------------------------------

    def _gather(self, metrics: dict[str, Any]) -> list[dict[str, Any]] | None:
        """Every rank's metrics, in rank order, on rank 0 (None on the others)."""
        if self._world_size == 1:
            return [metrics]
        import torch.distributed as dist

        gathered: list[Any] | None = [None] * self._world_size if self._rank == 0 else None
        dist.gather_object(metrics, gathered, dst=0)
        return gathered

    def _hold(self, everyone: list[dict[str, Any]]) -> None:
        if self._held:  # two rounds in one step (a save, then a log): the first goes alone
            self._release(None)
        self._index += 1
        self._last_metrics = everyone[0]
        self._held = everyone

    def _release(self, checkpoint: str | None) -> None:
        """Hand off the held round whole, naming ``checkpoint`` (its step's save) if any."""
        held, self._held = self._held, []
        if held:  # none after a save that was its step's second (the ``last.ckpt`` copy)
            self._run.handoff((self._take_round, held, checkpoint))

    def _check(self, trainer: Any | None, handed_off: bool = False) -> None:
        """Step the bus; raise a callback's failure now; pass a wish to stop to ``trainer``."""
        if self._looked(handed_off) and trainer is not None:
            trainer.should_stop = True

    def _run_name(self, trainer: Any) -> str:
        if self.name:
            return self.name
        return Path(str(trainer.default_root_dir)).name or "lightning"

    def _position_of(self, event: CheckpointSaved) -> RunPosition | None:
        """Keep where the run stood at ``event``'s checkpoint, for the ``last.ckpt`` copy."""
        core = self._run.core
        position = core.position_of(event) if core is not None else None
        self._saved_position = (event.checkpoint, position)
        return position

    def _resume_in(
        self, store: StateStore | None, checkpoint: str | None, loaded: Snapshot | None
    ) -> Resume | None:
        """What the fit resumes: our snapshot beside the file, else the states in
        Lightning's checkpoint (``last.ckpt`` has none beside it)."""
        resume = self._resume_of(store, checkpoint)
        if resume is None or checkpoint is None or resume.position is not None:
            return resume
        if loaded is not None and loaded.run is not None:
            return Resume(checkpoint, loaded.run, loaded.run_id)
        return resume

    @staticmethod
    def _saved_states(
        store: StateStore, checkpoint: str, loaded: Snapshot | None
    ) -> Snapshot | None:
        """The states Lightning's checkpoint held, else our snapshot beside its file."""
        if loaded is not None:
            return msgspec.structs.replace(loaded, checkpoint=checkpoint)
        try:
            return store.load(checkpoint)
        except FileNotFoundError:
            return None


class _StatesIntoCheckpoints(CheckpointIO):  # type: ignore[misc]  # untyped to mypy
    """The strategy's checkpoint IO, telling ``EventBusCallback`` of every save: ``before``
    may change the checkpoint; ``after`` gets its result once the file is written."""

    def __init__(
        self,
        inner: Any,
        *,
        owner: EventBusCallback,
        before: Callable[[dict[str, Any], Any], str | None],
        after: Callable[[str], None],
        removed: Callable[[Any], None],
    ) -> None:
        self.inner, self.owner = inner, owner
        self.before, self.after, self.removed = before, after, removed

    def save_checkpoint(
        self, checkpoint: dict[str, Any], path: Any, storage_options: Any | None = None
    ) -> None:
        location = self.before(checkpoint, path)
        self.inner.save_checkpoint(checkpoint, path, storage_options=storage_options)
        if location is not None:
            self.after(location)

    def load_checkpoint(self, *args: Any, **kwargs: Any) -> Any:
        return self.inner.load_checkpoint(*args, **kwargs)

    def remove_checkpoint(self, path: Any) -> None:
        self.inner.remove_checkpoint(path)
        self.removed(path)

    def teardown(self) -> None:
        self.inner.teardown()


def _hparams(pl_module: Any) -> dict[str, Any]:
    """``{"hparams": ...}``: the module's hyperparameters as JSON values, for the trackers."""
    hparams = dict(getattr(pl_module, "hparams", None) or {})
    if not hparams:
        return {}
    return {"hparams": msgspec.to_builtins(hparams, str_keys=True, enc_hook=repr)}


def _logs_now(trainer: Any) -> bool:
    """Whether Lightning logs at this step (its own test, where it has one)."""
    connector = getattr(trainer, "_logger_connector", None)
    if connector is not None:
        return bool(connector.should_update_logs)
    every = int(trainer.log_every_n_steps)
    return every > 0 and int(trainer.global_step) % every == 0


def _floats(metrics: Mapping[str, Any]) -> dict[str, Any]:
    """Lightning's logged values as floats; one that is not a scalar is left out."""
    values: dict[str, Any] = {}
    for name, value in metrics.items():
        try:
            values[name] = float(value)
        except (TypeError, ValueError, RuntimeError):  # a tensor of several values
            continue
    return values


def _checkpoint_dir(trainer: Any) -> Path:
    """Where the Trainer's ``ModelCheckpoint`` writes (resolved by its ``setup``)."""
    checkpoint = getattr(trainer, "checkpoint_callback", None)
    directory = getattr(checkpoint, "dirpath", None)
    return Path(directory if directory else trainer.default_root_dir)


def _is_last_copy(trainer: Any, location: str) -> bool:
    """Whether ``location`` is a ``ModelCheckpoint``'s ``last.ckpt``."""
    for callback in getattr(trainer, "checkpoint_callbacks", ()):
        last = getattr(callback, "last_model_path", "")
        if last and str(Path(last).resolve()) == location:
            return True
    return False
