"""Hugging Face's ``trainer_state.json``: its ``stateful_callbacks`` section, both ways.

HF stores ``{ClassName: state}``, or ``{ClassName: [state, ...]}`` when several callbacks share
a class, and restores by class name with ``zip``: module and ``state_key`` are lost. A
snapshot read from HF is keyed by class name (``Name``, ``Name[i]``) and restored by class
name and position, mismatches reported; two different classes with one name are an error
when writing. The file is read as defensively as our snapshots and written back atomically
as HF formats it, so fields we do not own (NaN in ``log_history`` included) stay as they are.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from eventbus.state._files import DEFAULT_MAX_BYTES, atomic_write, read_regular_file
from eventbus.state._model import MALFORMED, CallbackState, Snapshot, StateFormatError, check_state

__all__ = [
    "HF_SECTION",
    "TRAINER_STATE_NAME",
    "from_hf_callbacks",
    "merge_stateful_callbacks",
    "read_hf_trainer_state",
    "to_hf_callbacks",
    "write_hf_trainer_state",
]

#: The Trainer's state file in a checkpoint directory (transformers' ``TRAINER_STATE_NAME``).
TRAINER_STATE_NAME = "trainer_state.json"
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
    section that is not a mapping at all is a ``StateError``.
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
    return _parse(path, read_regular_file(path, max_bytes=max_bytes))


def _parse(path: Path, data: bytes) -> dict[str, Any]:
    try:
        document = json.loads(data.decode("utf-8"))
    except (ValueError, RecursionError) as exc:  # also UnicodeDecodeError, huge int literals
        raise StateFormatError(f"{path}: not JSON: {exc}") from None
    if not isinstance(document, dict):
        raise StateFormatError(f"{path}: expected a JSON object (HF's TrainerState)")
    return document


def _rewrite_section(
    path: Path,
    section: Callable[[Any], HFCallbacks],
    *,
    max_bytes: int,
    create: bool,
) -> None:
    """Set ``stateful_callbacks`` to ``section(old section)``, keeping every other field,
    atomically and formatted as HF formats the file."""
    try:
        data = read_regular_file(path, max_bytes=max_bytes)
    except FileNotFoundError:
        if not create:
            raise
        data = b"{}"
    text = _spliced(data, section)
    if text is None:
        document = _parse(path, data)
        document[HF_SECTION] = section(document.get(HF_SECTION))
        text = json.dumps(document, indent=2, sort_keys=True) + "\n"
    # HF writes the file with a plain open(): atomic, yes; durable beyond HF's own, no.
    atomic_write(path, text.encode("utf-8"), durable=False)


#: Where HF's formatting (``indent=2``) puts the section's value: a top-level key is the
#: only one indented by two spaces, and JSON strings hold no raw newline.
_SECTION_AT = f'\n  "{HF_SECTION}": '
_DECODER = json.JSONDecoder()


def _spliced(data: bytes, section: Callable[[Any], HFCallbacks]) -> str | None:
    """HF's text with only the section's value replaced, or None where the file is not
    laid out as HF lays it out (then the whole document is re-encoded).

    Why: re-encoding HF's whole file at every save costs time per entry of its
    ``log_history`` (one per log), in the trainer's thread. The bytes are the same.
    """
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return None
    at = text.find(_SECTION_AT)
    whole = text.startswith("{") and text.rstrip().endswith("}")  # not cut short
    if not whole or at < 0 or text.find(_SECTION_AT, at + 1) >= 0:
        return None
    start = at + len(_SECTION_AT)
    try:
        old, end = _DECODER.raw_decode(text, start)
    except (ValueError, RecursionError):
        return None
    value = json.dumps(section(old), indent=2, sort_keys=True).replace("\n", "\n  ")
    return text[:start] + value + text[end:]


def read_hf_trainer_state(
    path: str | os.PathLike[str], *, max_bytes: int = DEFAULT_MAX_BYTES
) -> Snapshot:
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
    path: str | os.PathLike[str], snapshot: Snapshot, *, max_bytes: int = DEFAULT_MAX_BYTES
) -> None:
    """Replace the ``stateful_callbacks`` section of ``path`` with ``snapshot``'s states.

    Creates the file (with only that section) if it does not exist.
    """
    states = to_hf_callbacks(snapshot)
    _rewrite_section(Path(path), lambda _: states, max_bytes=max_bytes, create=True)


def merge_stateful_callbacks(
    path: str | os.PathLike[str], snapshot: Snapshot, *, max_bytes: int = DEFAULT_MAX_BYTES
) -> None:
    """Put ``snapshot``'s states in the ``stateful_callbacks`` of an existing HF
    ``trainer_state.json``, next to HF's own entries.

    HF's entries are kept; an entry named like one of our classes is replaced (after a
    resume HF carries ours along from the resumed checkpoint, stale).
    """
    path = Path(path)
    states = to_hf_callbacks(snapshot)

    def merged(section: Any) -> HFCallbacks:
        section = section or {}
        if not isinstance(section, dict):
            raise StateFormatError(f"{path}: {HF_SECTION} is not a mapping")
        return {**section, **states}

    _rewrite_section(path, merged, max_bytes=max_bytes, create=False)
