"""The state store: snapshot every stateful callback at every checkpoint, restore on resume.

It ties the pieces together: keys and checks (``_state``), confined atomic
files (``_state_files``) and the bus. Attached to a bus, it snapshots on each
``CheckpointSaved`` after the other handlers of that event (a high ``order``),
so the states include what those handlers did with the checkpoint.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from ._bus import EventBus
from ._events import CheckpointSaved, StateRestored, StateSnapshotted
from ._logging import get_logger
from ._state import (
    Snapshot,
    StateRestoreError,
    plan_restore,
    rebuild,
    stateful_keys,
    take_states,
)
from ._state_files import read_snapshot, state_path, write_snapshot
from ._subscription import Subscription

__all__ = ["SNAPSHOT_ORDER", "StateStore"]

_log = get_logger("eventbus.state")

#: Runs after every handler of ``CheckpointSaved`` with a lower order (the default is 0).
SNAPSHOT_ORDER = 1_000_000


class StateStore:
    """Keeps the states of a run's stateful callbacks, one file per checkpoint under ``root``.

    ``register`` the run's callbacks (the non-stateful ones are ignored; keys
    must be unique). ``snapshot(checkpoint)`` writes every registered state,
    replacing any earlier snapshot of that checkpoint; ``restore`` rebuilds
    callbacks from one. ``strict=True`` makes any mismatch at restore an error.
    """

    def __init__(self, root: str | Path, *, strict: bool = False) -> None:
        self.root = Path(root).resolve()
        self.strict = strict
        self._callbacks: dict[str, object] = {}

    @property
    def keys(self) -> tuple[str, ...]:
        """The registered state keys, in callback order."""
        return tuple(self._callbacks)

    def register(self, callbacks: Sequence[object]) -> None:
        """Track the stateful ones of ``callbacks`` (replacing any earlier registration).

        Two callbacks with one key are a ``StateKeyConflict`` naming both, and
        nothing is registered.
        """
        self._callbacks = stateful_keys(callbacks)

    def path_of(self, checkpoint: str) -> Path:
        """The snapshot file of ``checkpoint``; ``StatePathError`` if outside the root."""
        return state_path(self.root, checkpoint)

    def snapshot(self, checkpoint: str, *, run_id: str = "") -> StateSnapshotted:
        """Write the state of every registered callback for ``checkpoint``.

        A callback whose state fails (``state()`` raised, or not strict JSON)
        is listed in ``errors`` with the reason and the path inside its state;
        the others are written. A bad location raises ``StatePathError`` and
        an I/O failure ``OSError``; nothing is written then.
        """
        path = self.path_of(checkpoint)
        states, errors = take_states(self._callbacks)
        write_snapshot(
            path, Snapshot(checkpoint=checkpoint, run_id=run_id, states=states, errors=errors)
        )
        if errors:
            _log.warning("callback states not saved", checkpoint=checkpoint, errors=errors)
        return StateSnapshotted(
            run_id=run_id, checkpoint=checkpoint, path=str(path), keys=tuple(states), errors=errors
        )

    def load(self, checkpoint: str) -> Snapshot:
        """The snapshot of ``checkpoint``: ``FileNotFoundError`` if there is none,
        ``StateFormatError`` if it is malformed, ``StatePathError`` if outside the root."""
        return read_snapshot(self.path_of(checkpoint))

    def restore(
        self, callbacks: Sequence[object], checkpoint: str | Snapshot
    ) -> tuple[list[object], StateRestored]:
        """A new list, in the same order, with each saved callback rebuilt from its state.

        The new list becomes the registered one (later snapshots must read the
        new instances, not the replaced ones). Saved states with no live
        callback, live callbacks with no saved state, differing instance counts
        of a class and failed rebuilds are warned about through structlog and
        listed in the returned ``StateRestored``; with ``strict`` they raise
        ``StateRestoreError`` and nothing changes.
        """
        notes: tuple[str, ...] = ()
        if isinstance(checkpoint, Snapshot):
            snapshot = checkpoint
        else:
            try:
                snapshot = self.load(checkpoint)
            except FileNotFoundError:
                # A checkpoint written before the store was in use: every callback starts fresh.
                snapshot = Snapshot(checkpoint=checkpoint)
                notes = (f"no callback state snapshot at {self.path_of(checkpoint)}",)
        plan = plan_restore(callbacks, snapshot)
        if self.strict and (notes or not plan.clean):
            raise StateRestoreError(
                f"restoring {snapshot.checkpoint or 'snapshot'}: "
                + "; ".join(notes + plan.warnings)
            )
        restored = list(callbacks)
        restored_keys: list[str] = []
        failures: list[str] = []
        for (position, saved_key), live_key in zip(
            plan.matches.items(), plan.restored, strict=True
        ):
            try:
                restored[position] = rebuild(callbacks[position], snapshot.states[saved_key])
            except Exception as exc:
                problem = (
                    f"could not rebuild {saved_key} from its state "
                    f"({type(exc).__name__}: {exc}); it starts fresh"
                )
                if self.strict:
                    raise StateRestoreError(problem) from exc
                failures.append(problem)
            else:
                restored_keys.append(live_key)
        warnings = notes + plan.warnings + tuple(failures)
        # Checks the rebuilt callbacks' keys too (a from_state may change them).
        self.register(restored)
        if warnings:
            _log.warning(
                "callback state restore mismatch", checkpoint=snapshot.checkpoint, problems=warnings
            )
        return restored, StateRestored(
            run_id=snapshot.run_id,
            checkpoint=snapshot.checkpoint,
            restored=tuple(restored_keys),
            missing=plan.missing,
            unsaved=plan.unsaved,
            warnings=warnings,
            mismatched=plan.mismatched,
        )

    def attach(self, bus: EventBus, *, order: int = SNAPSHOT_ORDER) -> Subscription:
        """Snapshot on every ``CheckpointSaved`` of ``bus`` and publish a ``StateSnapshotted``.

        Never raises into the bus: a bad location or an I/O error is reported
        in the event's ``error`` and logged.
        """

        def on_checkpoint(event: CheckpointSaved) -> None:
            try:
                report = self.snapshot(event.checkpoint, run_id=event.run_id)
            except Exception as exc:
                _log.error(
                    "callback states not written", checkpoint=event.checkpoint, error=str(exc)
                )
                report = StateSnapshotted(
                    run_id=event.run_id,
                    checkpoint=event.checkpoint,
                    path="",
                    error=f"{type(exc).__name__}: {exc}",
                )
            # Emitted from inside the bus: a full inbox must not make this handler wait or fail.
            bus.emit(report)

        # barrier: the snapshot of a checkpoint must not see the next checkpoint's effects.
        return bus.subscribe(
            CheckpointSaved, on_checkpoint, name="state-store", order=order, barrier=True
        )
