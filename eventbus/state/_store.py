"""The state store: snapshot every stateful callback at every checkpoint, restore on resume.
A worker's checkpoint (``snapshot``, ``path_of``) lies inside the root; the one the operator
resumes from (``load``, ``restore``) anywhere (``_files``)."""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Annotated, TypeVar, cast

import msgspec
from msgspec import Meta

from .._bus import EventBus, blocking_io
from .._events import CheckpointSaved, RunPosition, StateRestored, StateSnapshotted
from .._logging import get_logger
from .._stages import Stage
from .._subscription import Subscription
from .._text import clip, describe
from ..options import checked
from ._files import (
    DEFAULT_MAX_BYTES,
    atomic_write,
    encode_snapshot,
    read_snapshot,
    resume_state_path,
    state_path,
)
from ._model import (
    MAX_REASON_CHARS,
    Snapshot,
    StateFormatError,
    StateRestoreError,
    callback_name,
    state_key_of,
    stateful_keys,
    take_states,
)
from ._restore import VettedState, move_state, plan_restore, rebuild_vetted, vet_state

__all__ = ["StateStore"]

_log = get_logger("eventbus.state")
#: A callback's type, kept through ``restore`` (each is rebuilt as its own class).
C = TypeVar("C")

_compact = msgspec.json.Encoder()


class StateStore:
    """Keeps the states of a run's stateful callbacks, one file per checkpoint under ``root``.

    ``strict=True`` makes any mismatch at restore an error; ``max_bytes`` bounds a snapshot
    file, written (the biggest states are left out) and read (docs/state.md).
    """

    def __init__(
        self,
        root: str | os.PathLike[str],
        *,
        strict: bool = False,
        max_bytes: int = DEFAULT_MAX_BYTES,
    ) -> None:
        max_bytes = checked("max_bytes", max_bytes, Annotated[int, Meta(ge=1, le=1 << 40)])
        self.root = Path(root).resolve()
        self.strict = strict
        self.max_bytes = max_bytes
        self._callbacks: dict[str, object] = {}

    @property
    def keys(self) -> tuple[str, ...]:
        """The registered state keys, in callback order."""
        return tuple(self._callbacks)

    def register(self, callbacks: Sequence[object]) -> None:
        """Track the stateful ones of ``callbacks`` (replacing any earlier registration);
        two with one key are a ``StateError`` naming both, and nothing is registered."""
        self._callbacks = stateful_keys(callbacks)

    def path_of(self, checkpoint: str | os.PathLike[str]) -> Path:
        """The snapshot file of a worker-reported ``checkpoint`` (relative to the cwd);
        ``StateError`` unless it lies inside the root."""
        return state_path(self.root, checkpoint)

    def resume_path_of(self, checkpoint: str | os.PathLike[str]) -> Path:
        """The snapshot file of a checkpoint the operator resumes from, anywhere."""
        return resume_state_path(self.root, checkpoint)[0]

    def snapshot(
        self, checkpoint: str, *, run_id: str = "", position: RunPosition | None = None
    ) -> StateSnapshotted:
        """Write the state of every registered callback for ``checkpoint`` (and where the
        run stood); a state that fails is listed in ``errors``, the others written."""
        path, snapshot, data = self._encode(checkpoint, run_id, position)
        atomic_write(path, data, within=self.root)
        return self._written(path, snapshot)

    def _encode(
        self, checkpoint: str, run_id: str, position: RunPosition | None
    ) -> tuple[Path, Snapshot, bytes]:
        path = self.path_of(checkpoint)
        snapshot = self.capture(checkpoint, run_id=run_id, position=position)
        data = encode_snapshot(snapshot)
        if len(data) > self.max_bytes:
            snapshot, data = self._fit(snapshot, data, path)
        return path, snapshot, data

    def _written(self, path: Path, snapshot: Snapshot) -> StateSnapshotted:
        if snapshot.errors:
            _log.warning(
                "callback states not saved", checkpoint=snapshot.checkpoint, errors=snapshot.errors
            )
        return StateSnapshotted(
            run_id=snapshot.run_id,
            checkpoint=snapshot.checkpoint,
            path=str(path),
            keys=tuple(snapshot.states),
            errors=snapshot.errors,
        )

    def capture(
        self, checkpoint: str = "", *, run_id: str = "", position: RunPosition | None = None
    ) -> Snapshot:
        """Every registered callback's state now, as ``snapshot`` would write it, in memory
        (for a trainer that keeps the states inside its own checkpoint file)."""
        states, errors = take_states(self._callbacks)
        return Snapshot(
            checkpoint=checkpoint, run_id=run_id, states=states, errors=errors, run=position
        )

    def _fit(self, snapshot: Snapshot, data: bytes, path: Path) -> tuple[Snapshot, bytes]:
        """The snapshot without its biggest states (each named in ``errors`` with its
        size), until the file fits ``max_bytes``."""
        total = len(data)
        sizes = sorted(
            ((len(_compact.encode(state)), key) for key, state in snapshot.states.items()),
            reverse=True,
        )
        compact_total = sum(size for size, _ in sizes) or 1
        states, errors = dict(snapshot.states), dict(snapshot.errors)
        excess = total - self.max_bytes
        dropped = 0.0
        for size, key in sizes:
            del states[key]
            errors[key] = (
                f"its state is {size} bytes of JSON, and with it the snapshot would be {total} "
                f"bytes, over the limit of {self.max_bytes} (StateStore(max_bytes=...)); "
                "left out"
            )
            dropped += size * total / compact_total  # its share of the indented file
            if dropped < excess:
                continue
            fitted = msgspec.structs.replace(snapshot, states=states, errors=errors)
            data = encode_snapshot(fitted)
            if len(data) <= self.max_bytes:
                return fitted, data
        raise StateFormatError(
            f"{path}: the snapshot is {len(data)} bytes even without any state, over the "
            f"limit of {self.max_bytes} bytes (StateStore(max_bytes=...))"
        )

    def load(self, checkpoint: str | os.PathLike[str]) -> Snapshot:
        """The snapshot of the checkpoint the operator names (relative to the cwd, anywhere);
        ``FileNotFoundError`` if it has none (docs/state.md: "Reading a snapshot")."""
        path, within = resume_state_path(self.root, checkpoint)
        return read_snapshot(path, within=within, max_bytes=self.max_bytes)

    def restore(
        self,
        callbacks: Sequence[C],
        checkpoint: str | os.PathLike[str] | Snapshot,
        *,
        in_place: bool = False,
        require_snapshot: bool = False,
    ) -> tuple[list[C], StateRestored]:
        """A new list, in the same order, with each saved callback rebuilt from its state
        (as the given one's class); it becomes the registered one. Every mismatch is warned
        about and listed in the returned ``StateRestored``; ``strict`` raises
        ``StateRestoreError`` for it, nothing changed (docs/state.md).

        ``checkpoint`` is the operator's (see ``load``), or a snapshot (``load``'s).
        ``in_place=True``: each rebuilt state is moved onto the given object, so references
        the caller kept see it (one that cannot take it is replaced, with a warning).
        ``require_snapshot=True``: a checkpoint without a snapshot is a
        ``StateRestoreError`` instead of every callback starting fresh.
        """
        notes: tuple[str, ...] = ()
        if isinstance(checkpoint, Snapshot):
            snapshot = checkpoint
            source = snapshot.checkpoint
        else:
            # Named by the operator's location, not by the file's own (editable) field.
            source = os.fspath(checkpoint)
            try:
                snapshot = self.load(checkpoint)
            except FileNotFoundError as exc:
                if require_snapshot:
                    raise StateRestoreError(
                        f"no callback state snapshot at {exc.filename}: resume from a checkpoint "
                        "that has callback states, or allow starting them fresh "
                        "(open_run(allow_fresh_state=True); "
                        "StateStore.restore(require_snapshot=False))"
                    ) from exc
                # A checkpoint written before the store was in use: every callback starts fresh.
                snapshot = Snapshot(checkpoint=source)
                notes = (f"no callback state snapshot at {exc.filename}",)
        plan = plan_restore(callbacks, snapshot)
        vetted: dict[int, tuple[str, VettedState]] = {}
        problems: list[str] = []
        failures: list[str] = []
        for position, saved_key in plan.matches.items():
            live_key = state_key_of(callbacks[position])
            try:
                checked = vet_state(callbacks[position], snapshot.states[saved_key], live_key)
            except ValueError as exc:
                failures.append(f"could not restore {live_key}: {exc}; it starts fresh")
                continue
            problems.extend(checked.problems)
            vetted[position] = live_key, checked
        if self.strict and (notes or plan.warnings or problems or failures):
            raise StateRestoreError(
                f"restoring {clip(source, MAX_REASON_CHARS) or 'snapshot'}: "
                + "; ".join(notes + plan.warnings + tuple(problems) + tuple(failures))
            )
        if plan.moved:
            _log.info(
                "callback states matched across a move between __main__ and a module",
                checkpoint=source,
                moved=[f"{saved} -> {live}" for saved, live in plan.moved],
            )
        restored = list(callbacks)
        restored_keys: list[str] = []
        # Saved args that differ from the live ones: never silent, never a strict error
        # (which value wins is the rule, not a mismatch), and only for states restored.
        changed: list[str] = []
        for position, (live_key, checked) in vetted.items():
            try:
                # An instance of type(callbacks[position]) (rebuild_vetted checks it).
                restored[position] = cast(C, rebuild_vetted(callbacks[position], checked))
            except Exception as exc:
                problem = (
                    f"could not rebuild {plan.matches[position]} from its state "
                    f"({describe(exc)}); it starts fresh"
                )
                if self.strict:
                    raise StateRestoreError(problem) from exc
                failures.append(problem)
            else:
                restored_keys.append(live_key)
                if checked.args_note is not None:
                    changed.append(f"{callback_name(callbacks[position])}: {checked.args_note}")
        if in_place:
            # Only once every rebuild is done and the keys are known unique: a strict
            # failure or a key conflict must leave the caller's objects untouched.
            stateful_keys(restored)
            for position, (live_key, _) in vetted.items():
                live = callbacks[position]
                why = None if restored[position] is live else move_state(live, restored[position])
                if why is None:
                    restored[position] = live
                else:
                    failures.append(
                        f"{live_key} could not be restored in place ({why}): it was replaced "
                        "by a new instance, which the run's `callbacks` list (the returned list) "
                        "holds; references to the old object see its state from before the restore"
                    )
        warnings = notes + plan.warnings + tuple(problems) + tuple(changed) + tuple(failures)
        # Checks the rebuilt callbacks' keys too (a from_state may change them).
        self.register(restored)
        if warnings:
            _log.warning("callback state restore mismatch", checkpoint=source, problems=warnings)
        return restored, StateRestored(
            run_id=snapshot.run_id,
            checkpoint=source,
            restored=tuple(restored_keys),
            missing=plan.missing,
            unsaved=plan.unsaved,
            warnings=warnings,
            mismatched=plan.mismatched,
        )

    def attach(
        self,
        bus: EventBus,
        *,
        order: int = Stage.SNAPSHOT,
        position_of: Callable[[CheckpointSaved], RunPosition | None] | None = None,
    ) -> Subscription:
        """Snapshot on every ``CheckpointSaved`` of ``bus`` and publish a ``StateSnapshotted``
        (with ``error`` set, never raising into the bus, when it fails); ``position_of(event)``:
        where the run stood, saved with the states."""

        async def on_checkpoint(event: CheckpointSaved) -> None:
            try:
                position = position_of(event) if position_of is not None else None
                path, snapshot, data = self._encode(event.checkpoint, event.run_id, position)
                # The states are taken here, at their round; the write after.
                write = functools.partial(atomic_write, path, data, within=self.root)
                await blocking_io(bus, write)
                report = self._written(path, snapshot)
            except Exception as exc:
                _log.error(
                    "callback states not written",
                    checkpoint=event.checkpoint,
                    error=describe(exc),
                )
                report = StateSnapshotted(
                    run_id=event.run_id,
                    checkpoint=event.checkpoint,
                    path="",
                    error=describe(exc),
                )
            # Derived from the checkpoint: neither a full inbox nor a flood may refuse it.
            bus.emit(report, derived=True)

        # barrier: the snapshot of a checkpoint must not see the next checkpoint's effects.
        return bus.subscribe(
            CheckpointSaved, on_checkpoint, name="state-store", order=order, barrier=True
        )
