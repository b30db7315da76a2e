"""Hugging Face interop: the ``stateful_callbacks`` section of ``trainer_state.json``.

HF's ``TrainerState`` stores ``{ClassName: state}``, or ``{ClassName: [state,
state, ...]}`` when several callbacks share a class, and its
``trainer.py:_load_callback_state`` restores by class name, pairing saved and
live instances with ``zip``. So HF keys by class *name* only: module and
``state_key`` are lost on the way in. A snapshot read from HF is therefore
keyed by class name (``Name``, or ``Name[i]`` for the i-th of the list form)
and restored by class name and position, with count mismatches reported.
Writing our snapshot to HF groups states by class name in callback order; two
different classes with one name cannot be told apart there, so that is an
error rather than a silently merged list.

The file itself is read with the standard ``json`` module and written back
the way HF writes it (``indent=2, sort_keys=True``, trailing newline), so
fields we do not own, NaN in ``log_history`` included, are kept as they are.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ._state import MALFORMED, CallbackState, Snapshot, StateFormatError, check_state
from ._state_files import DEFAULT_MAX_BYTES, atomic_write, read_regular_file

__all__ = [
    "HF_SECTION",
    "from_hf_callbacks",
    "read_hf_trainer_state",
    "to_hf_callbacks",
    "write_hf_trainer_state",
]

#: The key of the callbacks' section in HF's ``trainer_state.json``.
HF_SECTION = "stateful_callbacks"

HFCallbacks = dict[str, CallbackState | list[CallbackState]]


def _class_name(key: str, keyed_by: str) -> tuple[str, str]:
    """(HF class name, identity of the class) of a snapshot key."""
    path = key.split("[", 1)[0]
    return (path, path) if keyed_by == "class_name" else (path.rsplit(".", 1)[-1], path)


def to_hf_callbacks(snapshot: Snapshot) -> HFCallbacks:
    """The snapshot as HF's ``stateful_callbacks`` mapping.

    A class with one state maps to that state; several map to a list in
    callback order (a snapshot read from HF's list form keeps its list form).
    States that could not be saved (``snapshot.errors``) have no place in HF's
    format and are left out.
    """
    groups: dict[str, list[CallbackState]] = {}
    owners: dict[str, str] = {}
    listed: set[str] = set()
    for key, state in snapshot.states.items():
        name, owner = _class_name(key, snapshot.keyed_by)
        if owners.setdefault(name, owner) != owner:
            raise StateFormatError(
                f"{owners[name]} and {owner} are both named {name!r}; Hugging Face keys states "
                "by class name only, so they cannot both be written to stateful_callbacks"
            )
        groups.setdefault(name, []).append(state)
        if snapshot.keyed_by == "class_name" and key != name:
            listed.add(name)
    return {
        name: states if len(states) > 1 or name in listed else states[0]
        for name, states in groups.items()
    }


def from_hf_callbacks(section: Any, *, checkpoint: str = "", where: str = HF_SECTION) -> Snapshot:
    """A snapshot (keyed by class name) from HF's ``stateful_callbacks`` mapping.

    Every state is checked as strict JSON. A bad one costs only itself: it
    is left out of ``states`` and its key goes to ``errors`` with the path
    of the problem (``malformed in stateful_callbacks.EarlyStoppingCallback[1].args:
    ...``), so a restore reports that callback and restores the others. A
    section that is not a mapping at all is a ``StateFormatError``.
    """
    if not isinstance(section, dict):
        raise StateFormatError(f"{where}: expected a mapping of class name to state")
    states: dict[str, CallbackState] = {}
    errors: dict[str, str] = {}
    for name, data in section.items():
        items = list(enumerate(data)) if isinstance(data, list) else [(None, data)]
        for index, item in items:
            key = name if index is None else f"{name}[{index}]"
            try:
                states[key] = check_state(item, f"{where}.{key}")
            except ValueError as exc:
                errors[key] = f"{MALFORMED} {exc}"
    return Snapshot(checkpoint=checkpoint, keyed_by="class_name", states=states, errors=errors)


def _read_json(path: Path, max_bytes: int) -> dict[str, Any]:
    """HF's file, read as defensively as our own (regular file, size bound), except
    that links are followed: Hub downloads are symlinks into a blob cache."""
    data = read_regular_file(path, max_bytes=max_bytes)
    try:
        document = json.loads(data.decode("utf-8"))
    except (ValueError, RecursionError) as exc:  # also UnicodeDecodeError, huge int literals
        raise StateFormatError(f"{path}: not JSON: {exc}") from None
    if not isinstance(document, dict):
        raise StateFormatError(f"{path}: expected a JSON object (HF's TrainerState)")
    return document


def read_hf_trainer_state(path: str | Path, *, max_bytes: int = DEFAULT_MAX_BYTES) -> Snapshot:
    """The callback states of an HF ``trainer_state.json`` (none if it has no section).

    A FIFO, device or directory in its place, or a file over ``max_bytes``,
    is a ``StateFormatError`` before anything is read.
    """
    path = Path(path)
    document = _read_json(path, max_bytes)
    return from_hf_callbacks(
        document.get(HF_SECTION, {}), checkpoint=str(path.parent), where=f"{path}: {HF_SECTION}"
    )


def write_hf_trainer_state(
    path: str | Path, snapshot: Snapshot, *, max_bytes: int = DEFAULT_MAX_BYTES
) -> None:
    """Set the ``stateful_callbacks`` section of ``path``, keeping every other field.

    Creates the file (with only that section) if it does not exist; writes
    atomically, formatted as HF formats it.
    """
    path = Path(path)
    try:
        document = _read_json(path, max_bytes)
    except FileNotFoundError:
        document = {}
    document[HF_SECTION] = to_hf_callbacks(snapshot)
    text = json.dumps(document, indent=2, sort_keys=True) + "\n"
    atomic_write(path, text.encode("utf-8"))
