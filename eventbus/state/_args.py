"""Saved args against the ones the live callback was given: which win, and saying so.

A resume continues the saved run, so the saved args rebuild the callback (as
Hugging Face and Lightning restore it), except those a ``StatefulCallback``
declares in ``state_live_args``: options a snapshot, which anyone who can
write the checkpoint can edit, must not switch on. Either way a difference is
never silent: the note returned says what was used instead of what.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any

import msgspec

from .._text import clip
from ._model import StatefulCallback

__all__ = ["settle_args"]

_SAVED_WIN = "a resume continues the saved run"
_LIVE_WIN = "the value given now always wins for it: a snapshot may not switch it on"

_encoder = msgspec.json.Encoder()
_decoder = msgspec.json.Decoder()


def _as_json(value: Any) -> Any:
    """``value`` as a snapshot would hold it (a tuple as a list), to compare with a saved one."""
    try:
        return _decoder.decode(_encoder.encode(value))
    except Exception:  # not a JSON value: compared as it is (and so differs)
        return value


def _same(saved: Any, live: Any) -> bool:
    try:
        return bool(saved == _as_json(live))
    except Exception:  # an __eq__ that raises or cannot say (an array)
        return False


def _defaults(callback: object) -> dict[str, Any]:
    """The defaults of its class's ``__init__`` (none if it has no signature to read)."""
    try:
        parameters = inspect.signature(type(callback)).parameters
    except (TypeError, ValueError):
        return {}
    return {n: p.default for n, p in parameters.items() if p.default is not p.empty}


def _shown(name: str, value: Any) -> str:
    try:
        text = repr(value)
    except Exception:
        text = f"<{type(value).__qualname__}>"
    return f"{name}={clip(text, 100)}"


def settle_args(
    callback: object, saved: Mapping[str, Any], live: Mapping[str, Any]
) -> tuple[dict[str, Any], str | None]:
    """The args to rebuild ``callback`` with, and a note naming each that differs.

    ``saved`` (the snapshot's) win, except the live-wins ones of the callback's
    class, which take their ``live`` value (also when the snapshot lacks them).
    The note (``None`` when nothing differs) reads ``resumed with the saved
    patience=3, not patience=10 given now (a resume continues the saved run)``.
    A saved arg that wins over a live one left at its default is not noted: a
    callback built with defaults to take a saved state asked for nothing else.
    Only a ``StatefulCallback`` declares its args as what it was built with; any
    other stateful object's saved args win unnoted (Hugging Face's
    ``TrainerControl`` saves its per-step flags as args).
    """
    if not isinstance(callback, StatefulCallback):
        return dict(saved), None
    live_wins = set(type(callback).state_live_args) & set(live)
    defaults = _defaults(callback)
    settled = dict(saved)
    settled.update({name: live[name] for name in live_wins})
    saved_used: list[str] = []
    live_used: list[str] = []
    for name, value in saved.items():
        if name not in live or _same(value, live[name]):
            continue
        if (
            name not in live_wins
            and name in defaults
            and _same(_as_json(defaults[name]), live[name])
        ):
            continue
        given, stored = _shown(name, live[name]), _shown(name, value)
        if name in live_wins:
            live_used.append(f"{given} given now, not the saved {stored}")
        else:
            saved_used.append(f"the saved {stored}, not {given} given now")
    groups = []
    if saved_used:
        groups.append(f"{'; '.join(saved_used)} ({_SAVED_WIN})")
    if live_used:
        groups.append(f"{'; '.join(live_used)} ({_LIVE_WIN})")
    note = f"resumed with {'; with '.join(groups)}" if groups else None
    return settled, note
