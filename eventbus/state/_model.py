"""Stateful callbacks: the protocol (Hugging Face's format), their keys, and taking their
states, checked as strict JSON when taken so that one that would not round-trip is
reported then, not at resume."""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from typing import Any, Literal, Self, TypedDict

import msgspec

from .._events import RunPosition
from .._text import clip, describe, safe_str

#: Bumped when the snapshot file changes shape incompatibly; files carry it.
STATE_FORMAT_VERSION = 1

#: Starts the ``errors`` entry of a state found malformed when a snapshot was read.
MALFORMED = "malformed in"

#: Longest error message kept per callback, in characters.
MAX_REASON_CHARS = 2000


_MAX_LISTED = 20


class CallbackState(TypedDict):
    """One callback's state, as Hugging Face's ``ExportableState.state()`` returns it."""

    args: dict[str, Any]
    attributes: dict[str, Any]


class StateError(Exception):
    """Base of the state store's errors."""


class StateKeyConflict(StateError, ValueError):
    """Two callbacks have the same state key: one state would overwrite the other."""


class StateFormatError(StateError, ValueError):
    """A snapshot (file or Hugging Face section) is malformed; the message says where."""


class StateRestoreError(StateError):
    """Strict restore found saved and live callbacks that do not match, or a rebuild failed."""


class StatefulCallback:
    """Base for stateful callbacks: name the ``__init__`` arguments (``state_args``) and the
    attributes set after (``state_attributes``); a restore sets only those (docs/state.md)."""

    state_args: tuple[str, ...] = ()
    state_attributes: tuple[str, ...] = ()
    state_live_args: tuple[str, ...] = ()

    def __init_subclass__(cls, *, state_name: str | None = None, **kwargs: Any) -> None:
        """``state_name``: the stable name its states are saved under."""
        super().__init_subclass__(**kwargs)
        if state_name is not None:
            cls.__state_name__ = state_name  # type: ignore[attr-defined]
            state_class_name(cls)  # a bad name fails where the class is defined

    def __repr__(self) -> str:
        return callback_name(self)

    def state(self) -> CallbackState:
        return {
            "args": {name: getattr(self, name) for name in self.state_args},
            "attributes": {name: getattr(self, name) for name in self.state_attributes},
        }

    @classmethod
    def from_state(cls, state: CallbackState) -> Self:
        instance: Self = rebuild_default(
            cls, declared_only(state, cls.state_args, cls.state_attributes)[0]
        )
        return instance


def is_stateful(callback: object) -> bool:
    """Whether ``callback``'s class has a ``state()`` method."""
    return callable(getattr(type(callback), "state", None))


def callback_name(callback: object) -> str:
    """How messages name a callback: its class name with its ``state_key``
    (``Trend[acc]``). Never raises: a failing ``state_key`` costs only the suffix."""
    cls = type(callback)
    try:
        extra = getattr(callback, "state_key", None)
    except Exception:
        extra = None
    if not isinstance(extra, str) or not extra:
        return cls.__qualname__
    extra = clip(extra, 200)
    return extra if extra.startswith(cls.__name__) else f"{cls.__qualname__}[{extra}]"


#: Saved class names -> the class's name now, so older snapshots still restore.
RENAMED_STATE_CLASSES: dict[str, str] = {
    # 0.1: the built-ins keyed by their private modules, before and after they moved.
    "handlers._early_stopping.EarlyStopping": "handlers.EarlyStopping",
    "handlers.builtins._early_stopping.EarlyStopping": "handlers.EarlyStopping",
    "handlers._best_checkpoints.BestCheckpoints": "handlers.BestCheckpoints",
    "handlers.builtins._best_checkpoints.BestCheckpoints": "handlers.BestCheckpoints",
    "adapters.cli._demo_trainer.FinalLoss": "eventbus.demo.FinalLoss",
}

_STATE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*\Z")


def state_class_name(cls: type) -> str:
    """The name a class's states are saved under: its own ``__state_name__`` (not
    inherited), else ``module.QualName``."""
    name = cls.__dict__.get("__state_name__")
    if name is None:
        return f"{cls.__module__}.{cls.__qualname__}"
    if not isinstance(name, str) or not _STATE_NAME.match(name):
        raise TypeError(
            f"{cls.__qualname__}.__state_name__ must be a dotted name such as "
            f"'mypackage.MyCallback', got {name!r}"
        )
    return name


def current_state_key(key: str) -> str:
    """A saved key under its class's current name (``RENAMED_STATE_CLASSES``)."""
    name, bracket, extra = key.partition("[")
    renamed = RENAMED_STATE_CLASSES.get(name)
    return key if renamed is None else f"{renamed}{bracket}{extra}"


def state_key_of(callback: object) -> str:
    """The class's saved name, plus ``[state_key]`` when the instance defines one."""
    key = state_class_name(type(callback))
    extra = getattr(callback, "state_key", None)
    if extra is None:
        return key
    if not isinstance(extra, str):
        raise TypeError(
            f"{key}.state_key must be a str that tells its instances apart, got {extra!r}"
        )
    return f"{key}[{extra}]"


def stateful_keys(callbacks: Sequence[object]) -> dict[str, object]:
    """Key -> callback for the stateful ones, in order; a duplicate key is an error naming both."""
    keyed: dict[str, object] = {}
    positions: dict[str, int] = {}
    for position, callback in enumerate(callbacks):
        if not is_stateful(callback):
            continue
        key = state_key_of(callback)
        if key in keyed:
            raise StateKeyConflict(
                f"callbacks #{positions[key]} {callback_name(keyed[key])} and "
                f"#{position} {callback_name(callback)} "
                f"share the state key {key!r}; give each a distinct `state_key` attribute"
            )
        keyed[key] = callback
        positions[key] = position
    return keyed


# --- strict JSON ---------------------------------------------------------------

_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


_encoder = msgspec.json.Encoder()
_decoder = msgspec.json.Decoder()


def member(path: str, key: str) -> str:
    if _IDENTIFIER.match(key):
        return f"{path}.{key}" if path else key
    return f"{path}[{key!r}]"


def _first_problem(value: Any, path: str, active: set[int]) -> str | None:
    """Where and why ``value`` does not survive a JSON round trip (``None`` if it does)."""
    kind = type(value)
    if kind is str or kind is bool or kind is int or value is None:
        return None
    if kind is float:
        if math.isfinite(value):
            return None
        return f"{path}: {value!r} is not a JSON number (use None or a finite float)"
    if isinstance(value, dict | list):
        if id(value) in active:
            return f"{path}: {kind.__name__} contains itself"
        active.add(id(value))
        try:
            if isinstance(value, list):
                items = ((f"{path}[{i}]", item) for i, item in enumerate(value))
            else:
                for key in value:
                    if not isinstance(key, str):
                        kind_name = type(key).__name__
                        return f"{path}: key {key!r} ({kind_name}) is not a str, as JSON keys are"
                items = ((member(path, key), item) for key, item in value.items())
            for where, item in items:
                problem = _first_problem(item, where, active)
                if problem is not None:
                    return problem
            return None
        finally:
            active.discard(id(value))
    try:
        if _decoder.decode(_encoder.encode(value)) == value:
            return None  # a value-equal stand-in (an IntEnum, a numpy float): comes back plain
    except (TypeError, ValueError, RecursionError, OverflowError):
        pass
    hint = " (use a list)" if kind is tuple else ""
    name = (
        kind.__name__ if kind.__module__ == "builtins" else f"{kind.__module__}.{kind.__qualname__}"
    )
    return f"{path}: {name} is not a JSON value{hint}"


def listed(names: Sequence[str]) -> str:

    shown = ", ".join(clip(name, 120) for name in names[:_MAX_LISTED])
    more = len(names) - _MAX_LISTED
    return f"{shown} and {more} more" if more > 0 else shown


def check_state(state: Any, where: str = "") -> CallbackState:
    """A copy of one state that JSON round-trips to an equal value, or ``ValueError``
    naming the offending path (``attributes.best[2]``).

    Allowed: str, int, finite float, bool, None, and lists and str-keyed dicts of them.
    """
    if type(state) is not dict:
        raise ValueError(
            f"{where or '<state>'}: state() must return a dict, got {type(state).__name__}"
        )
    unexpected = [f"{k!r}" for k in state if k not in ("args", "attributes")]
    if unexpected:
        raise ValueError(
            f"{where or '<state>'}: unexpected key {', '.join(unexpected)}; "
            "a state has only 'args' and 'attributes'"
        )
    for part in ("args", "attributes"):
        if type(state.get(part)) is not dict:
            kind = type(state.get(part)).__name__
            raise ValueError(f"{member(where, part)}: must be a dict, got {kind}")
    try:
        copy = _decoder.decode(_encoder.encode(state))
    except (TypeError, ValueError, RecursionError, OverflowError):
        copy = None
    if copy != state:
        try:
            problem = _first_problem(state, where, set())
        except RecursionError:
            problem = f"{where or '<state>'}: nested too deeply to be saved as JSON"
        raise ValueError(problem or f"{where or '<state>'}: does not survive a JSON round trip")
    return {"args": copy["args"], "attributes": copy["attributes"]}


def take_states(callbacks: dict[str, object]) -> tuple[dict[str, CallbackState], dict[str, str]]:
    """Every callback's state, checked; one that fails goes to ``errors`` (key -> why)."""
    states: dict[str, CallbackState] = {}
    errors: dict[str, str] = {}
    for key, callback in callbacks.items():
        try:
            raw = callback.state()  # type: ignore[attr-defined]
        except Exception as exc:
            errors[key] = clip(f"state() raised {describe(exc)}", MAX_REASON_CHARS)
            continue
        try:
            states[key] = check_state(raw)
        except ValueError as exc:
            errors[key] = clip(safe_str(exc), MAX_REASON_CHARS)
        except Exception as exc:  # a value whose __eq__ or __repr__ raises: still only this one
            errors[key] = clip(f"checking its state raised {describe(exc)}", MAX_REASON_CHARS)
    return states, errors


# --- snapshots ---------------------------------------------------------------------


class Snapshot(msgspec.Struct, frozen=True, kw_only=True):
    """The states of one checkpoint, in callback order.

    ``keyed_by``: ``"qualname"`` for our keys, ``"class_name"`` for Hugging Face's.
    ``errors``: the callbacks whose state could not be saved, and why.
    """

    format: int = STATE_FORMAT_VERSION
    checkpoint: str = ""
    run_id: str = ""
    keyed_by: Literal["qualname", "class_name"] = "qualname"
    states: dict[str, CallbackState] = msgspec.field(default_factory=dict)
    errors: dict[str, str] = msgspec.field(default_factory=dict)
    #: Where the run stood at the checkpoint (``None``: no run).
    run: RunPosition | None = None


def rebuild_default(cls: type[Any], state: CallbackState) -> Any:
    instance = cls(**state["args"])
    for name, value in state["attributes"].items():
        setattr(instance, name, value)
    return instance


def declared_only(
    state: CallbackState, args: Sequence[str], attributes: Sequence[str]
) -> tuple[CallbackState, list[str]]:
    """``state`` without the names not declared, and those names (``args.x``)."""
    kept: CallbackState = {"args": {}, "attributes": {}}
    ignored: list[str] = []
    for part, declared in (("args", set(args)), ("attributes", set(attributes))):
        saved: dict[str, Any] = state[part]  # type: ignore[literal-required]
        target: dict[str, Any] = kept[part]  # type: ignore[literal-required]
        for name, value in saved.items():
            if name in declared:
                target[name] = value
            else:
                ignored.append(member(part, name))
    return kept, ignored
