"""Hugging Face's ``trainer_state.json``: its ``stateful_callbacks`` section, both ways.

HF stores ``{ClassName: state}``, or a list when several callbacks share a class, so a
snapshot read from HF is keyed by class name (``Name``, ``Name[i]``). The file is written
back as HF formats it, so fields we do not own stay as they are.
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


TRAINER_STATE_NAME = "trainer_state.json"

HF_SECTION = "stateful_callbacks"

HFCallbacks = dict[str, CallbackState | list[CallbackState]]


def to_hf_callbacks(snapshot: Snapshot) -> HFCallbacks:
    """The snapshot as HF's ``stateful_callbacks`` mapping (states not saved left out)."""
    groups: dict[str, list[CallbackState]] = {}
    owners: dict[str, str] = {}
    listed: set[str] = set()
    for key, state in snapshot.states.items():
        owner = key.split("[", 1)[0]  # the class: HF keys its state by the name alone
        name = owner if snapshot.keyed_by == "class_name" else owner.rsplit(".", 1)[-1]
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

    A state that is not strict JSON costs only itself (its key goes to ``errors``); a
    section that is not a mapping is a ``StateError``.
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
    """Set ``stateful_callbacks`` to ``section(old section)``, atomically, as HF formats it."""
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


#: Where HF's ``indent=2`` puts the section's value (only top-level keys are at two spaces).
_SECTION_AT = f'\n  "{HF_SECTION}": '
_DECODER = json.JSONDecoder()


def _spliced(data: bytes, section: Callable[[Any], HFCallbacks]) -> str | None:
    """HF's text with only the section's value replaced (re-encoding the whole file costs
    time per ``log_history`` entry); None where it is not laid out as HF lays it out."""
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
    """The callback states of an HF ``trainer_state.json`` (none if it has no section);
    ``StateFormatError`` for a non-regular file or one over ``max_bytes``."""
    path = Path(path)
    # Read as defensively as our own files, but following links (Hub downloads).
    document = _parse(path, read_regular_file(path, max_bytes=max_bytes))
    return from_hf_callbacks(
        document.get(HF_SECTION, {}), checkpoint=str(path.parent), where=f"{path}: {HF_SECTION}"
    )


def write_hf_trainer_state(
    path: str | os.PathLike[str], snapshot: Snapshot, *, max_bytes: int = DEFAULT_MAX_BYTES
) -> None:
    """Replace the ``stateful_callbacks`` section of ``path`` (made if missing)."""
    states = to_hf_callbacks(snapshot)
    _rewrite_section(Path(path), lambda _: states, max_bytes=max_bytes, create=True)


def merge_stateful_callbacks(
    path: str | os.PathLike[str], snapshot: Snapshot, *, max_bytes: int = DEFAULT_MAX_BYTES
) -> None:
    """Put ``snapshot``'s states in an existing ``trainer_state.json``, next to HF's own;
    an entry named like one of our classes is replaced (HF carries ours along, stale)."""
    path = Path(path)
    states = to_hf_callbacks(snapshot)

    def merged(section: Any) -> HFCallbacks:
        section = section or {}
        if not isinstance(section, dict):
            raise StateFormatError(f"{path}: {HF_SECTION} is not a mapping")
        return {**section, **states}

    _rewrite_section(path, merged, max_bytes=max_bytes, create=False)
