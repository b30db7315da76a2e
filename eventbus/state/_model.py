"""Stateful callbacks: the protocol, their keys, and taking their states.

The format is Hugging Face's (``state()`` -> ``{"args": ..., "attributes": ...}``) so states
move between the two, but every state has a unique key (a duplicate is an error, not a lost
state), and states are checked as strict JSON when taken, so one that would not round-trip
is reported then, naming the callback and the path, not discovered at resume. No I/O here.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from typing import Any, Literal, Protocol, Self, TypedDict, runtime_checkable

import msgspec

from .._events import RunPosition
from .._text import clip, describe, safe_str

#: Bumped when the snapshot file changes shape incompatibly; files carry it.
STATE_FORMAT_VERSION = 1

#: Starts the ``errors`` entry of a state found malformed when a snapshot was read
#: (as opposed to one that could not be saved).
MALFORMED = "malformed in"

#: Longest error message kept per callback: a ``state()`` that raises with a
#: megabyte message must not make the snapshot (or a warning) that big.
MAX_REASON_CHARS = 2000

#: How many names a warning lists before it only counts the rest.
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


@runtime_checkable
class Stateful(Protocol):
    """A callback whose state survives a resume.

    ``state()`` returns ``{"args": {...}, "attributes": {...}}`` of JSON
    values. Restoring calls ``cls.from_state(state)`` when the class defines
    it, else ``cls(**args)`` (so ``__init__`` runs) then sets each attribute.
    An instance may define ``state_key`` (a ``str``) to tell several instances
    of one class apart. ``isinstance(x, Stateful)`` only checks that a
    ``state`` attribute exists; the store uses ``is_stateful``, which wants a
    method on the class.
    """

    def state(self) -> CallbackState: ...


class StatefulCallback:
    """Base for stateful callbacks: list the names, get ``state``/``from_state``.

    ``state_args`` names the ``__init__`` arguments to rebuild with (each
    stored on the instance under the same name); ``state_attributes`` the
    attributes set after ``__init__``. Those names are also all that a
    restore sets: anything else in a saved state is ignored (and reported by
    the store), so a tampered snapshot cannot set ``__dict__`` or replace a
    hook. Override ``state``/``from_state`` for anything else; an overridden
    ``from_state`` gets the saved state unfiltered and must validate it.

    At a restore the saved args win over the ones the live callback was given (a resume
    continues the saved run), with a warning naming each that differs.
    ``state_live_args`` names the exceptions, whose live value always wins: options a
    snapshot, which anyone who can write the checkpoint can edit, must not switch on
    (``BestCheckpoints``' ``delete_worse``).
    """

    state_args: tuple[str, ...] = ()
    state_attributes: tuple[str, ...] = ()
    state_live_args: tuple[str, ...] = ()

    def __init_subclass__(cls, *, state_name: str | None = None, **kwargs: Any) -> None:
        """``state_name``: the stable name its states are saved under (see
        ``state_class_name``), so moving the class does not orphan its snapshots."""
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
    """Whether ``callback`` has a ``state()`` method (looked up on its class, so a
    plain data attribute named ``state`` does not count)."""
    return callable(getattr(type(callback), "state", None))


def callback_name(callback: object) -> str:
    """How messages and logs name a callback: its class name with its ``state_key``
    (``EarlyStopping(metric='loss', mode='min')`` as is, a key not starting with the
    class name as ``Trend[acc]``), or the class name alone. Never raises, so a
    ``state_key`` that fails costs only the suffix, not the message naming it."""
    cls = type(callback)
    try:
        extra = getattr(callback, "state_key", None)
    except Exception:
        extra = None
    if not isinstance(extra, str) or not extra:
        return cls.__qualname__
    extra = clip(extra, 200)
    return extra if extra.startswith(cls.__name__) else f"{cls.__qualname__}[{extra}]"


#: Class names that earlier versions wrote into snapshots -> the class's name now.
#: A state key is a public format: when a class's saved name changes, its old name
#: goes here, so snapshots taken before still restore (``current_state_key``).
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
    """The name a class's states are saved under: its own ``__state_name__`` (set
    with ``class C(StatefulCallback, state_name="pkg.C")``, or by hand on any
    class), else ``module.QualName``. A stable name keeps snapshots restoring
    when the class moves between modules; it is not inherited, so a subclass
    never takes its parent's states."""
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
    """The class's saved name (``state_class_name``), plus ``[state_key]`` when the
    instance defines one."""
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


def _round_trips(value: Any) -> bool:
    try:
        return bool(_decoder.decode(_encoder.encode(value)) == value)
    except (TypeError, ValueError, RecursionError, OverflowError):
        return False


def _first_problem(value: Any, path: str, active: set[int]) -> str | None:
    """Where and why ``value`` does not survive a JSON round trip (``None`` if it does).

    Only called once the fast check failed, so building paths costs nothing
    on the common path.
    """
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
    if _round_trips(value):
        return None  # a value-equal stand-in (an IntEnum, a numpy float): comes back plain
    hint = " (use a list)" if kind is tuple else ""
    name = (
        kind.__name__ if kind.__module__ == "builtins" else f"{kind.__module__}.{kind.__qualname__}"
    )
    return f"{path}: {name} is not a JSON value{hint}"


def listed(names: Sequence[str]) -> str:
    """Names for a warning: each shortened, at most ``_MAX_LISTED`` of them, then a count."""
    shown = ", ".join(clip(name, 120) for name in names[:_MAX_LISTED])
    more = len(names) - _MAX_LISTED
    return f"{shown} and {more} more" if more > 0 else shown


def check_state(state: Any, where: str = "") -> CallbackState:
    """A copy of one state that JSON round-trips to an equal value, or ``ValueError``
    naming the offending path (like ``attributes.best[2]``, prefixed by ``where``).

    The rule is "comes back equal": str, int, finite float, bool, None, and
    lists and str-keyed dicts of them. NaN and infinities are refused (JSON has
    no such numbers and msgspec would write ``null``), and so are tuples, sets,
    bytes and other objects, which would come back as something else. The copy
    is what gets saved, so later changes to the live state cannot leak into it.
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
    """Every callback's state, checked; one that fails goes to ``errors`` (key -> why),
    the others are still taken."""
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

    ``keyed_by`` is ``"qualname"`` for our keys (``module.QualName[state_key]``)
    and ``"class_name"`` for a snapshot read from Hugging Face, which keys by
    class name alone (``Name``, or ``Name[i]`` for its list form). ``errors``
    names the callbacks whose state could not be saved, and why; ``run``
    where the run stood, so a resume continues its rounds and report indices.
    """

    format: int = STATE_FORMAT_VERSION
    checkpoint: str = ""
    run_id: str = ""
    keyed_by: Literal["qualname", "class_name"] = "qualname"
    states: dict[str, CallbackState] = msgspec.field(default_factory=dict)
    errors: dict[str, str] = msgspec.field(default_factory=dict)
    #: Where the run stood at the checkpoint (``None`` in a snapshot made without a run).
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
