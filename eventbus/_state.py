"""Stateful callbacks: the protocol, their keys, taking states and putting them back.

The format is Hugging Face's (``state()`` -> ``{"args": ..., "attributes": ...}``)
so states move between the two, but the bookkeeping avoids the bugs HF and
others shipped: every state has a unique key (two instances of one class are
told apart by ``state_key``, and a duplicate is an error instead of a lost
state); states are checked as strict JSON when they are taken, so a state
that would not round-trip is reported then, naming the callback and the path
inside its state, rather than discovered at resume; and restoring matches by
key, keeps the callbacks' order and reports every mismatch instead of
``zip``-truncating. This module does no I/O: files live in ``_state_files``.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from typing import Any, Literal, Protocol, Self, TypedDict, runtime_checkable

import msgspec

__all__ = [
    "MALFORMED",
    "STATE_FORMAT_VERSION",
    "CallbackState",
    "RestorePlan",
    "Snapshot",
    "StateError",
    "StateFormatError",
    "StateKeyConflict",
    "StateRestoreError",
    "Stateful",
    "StatefulCallback",
    "VettedState",
    "check_state",
    "is_stateful",
    "plan_restore",
    "rebuild",
    "rebuild_vetted",
    "state_key_of",
    "stateful_keys",
    "take_states",
    "vet_state",
]

#: Bumped when the snapshot file changes shape incompatibly; files carry it.
STATE_FORMAT_VERSION = 1

#: Starts the ``errors`` entry of a state found malformed when a snapshot was read
#: (as opposed to one that could not be saved).
MALFORMED = "malformed in"

#: Longest error message kept per callback: a ``state()`` that raises with a
#: megabyte message must not make the snapshot (or a warning) that big.
_MAX_REASON_CHARS = 2000

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
    """

    state_args: tuple[str, ...] = ()
    state_attributes: tuple[str, ...] = ()

    def state(self) -> CallbackState:
        return {
            "args": {name: getattr(self, name) for name in self.state_args},
            "attributes": {name: getattr(self, name) for name in self.state_attributes},
        }

    @classmethod
    def from_state(cls, state: CallbackState) -> Self:
        instance: Self = _rebuild_default(
            cls, _declared_only(state, cls.state_args, cls.state_attributes)[0]
        )
        return instance


def is_stateful(callback: object) -> bool:
    """Whether ``callback`` has a ``state()`` method (looked up on its class, so a
    plain data attribute named ``state`` does not count)."""
    return callable(getattr(type(callback), "state", None))


def state_key_of(callback: object) -> str:
    """``module.QualName``, plus ``[state_key]`` when the instance defines one."""
    cls = type(callback)
    key = f"{cls.__module__}.{cls.__qualname__}"
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
                f"callbacks #{positions[key]} {keyed[key]!r} and #{position} {callback!r} "
                f"share the state key {key!r}; give each a distinct `state_key` attribute"
            )
        keyed[key] = callback
        positions[key] = position
    return keyed


# --- strict JSON ---------------------------------------------------------------

_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


_encoder = msgspec.json.Encoder()
_decoder = msgspec.json.Decoder()


def _member(path: str, key: str) -> str:
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
                items = ((_member(path, key), item) for key, item in value.items())
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


def _shorten(text: str, limit: int = _MAX_REASON_CHARS) -> str:
    return text if len(text) <= limit else f"{text[: limit - 40]}... ({len(text)} chars)"


def _listed(names: Sequence[str]) -> str:
    """Names for a warning: each shortened, at most ``_MAX_LISTED`` of them, then a count."""
    shown = ", ".join(_shorten(name, 120) for name in names[:_MAX_LISTED])
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
            raise ValueError(f"{_member(where, part)}: must be a dict, got {kind}")
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
            errors[key] = _shorten(f"state() raised {type(exc).__name__}: {exc}")
            continue
        try:
            states[key] = check_state(raw)
        except ValueError as exc:
            errors[key] = _shorten(str(exc))
        except Exception as exc:  # a value whose __eq__ or __repr__ raises: still only this one
            errors[key] = _shorten(f"checking its state raised {type(exc).__name__}: {exc}")
    return states, errors


# --- snapshots ---------------------------------------------------------------------


class Snapshot(msgspec.Struct, frozen=True, kw_only=True):
    """The states of one checkpoint, in callback order.

    ``keyed_by`` is ``"qualname"`` for our keys (``module.QualName[state_key]``)
    and ``"class_name"`` for a snapshot read from Hugging Face, which keys by
    class name alone (``Name``, or ``Name[i]`` for its list form). ``errors``
    names the callbacks whose state could not be saved, and why.
    """

    format: int = STATE_FORMAT_VERSION
    checkpoint: str = ""
    run_id: str = ""
    keyed_by: Literal["qualname", "class_name"] = "qualname"
    states: dict[str, CallbackState] = msgspec.field(default_factory=dict)
    errors: dict[str, str] = msgspec.field(default_factory=dict)


# --- restoring ----------------------------------------------------------------------


def _class_of_key(key: str) -> str:
    """The class part of a key: ``pkg.mod.Cls[x]`` -> ``pkg.mod.Cls``.

    Module paths and qualnames never contain ``[``, so the first one starts the suffix.
    """
    return key.split("[", 1)[0]


_POSITION = re.compile(r"(.*)\[([0-9]{1,18})\]\Z", re.DOTALL)


def _hf_position(key: str) -> tuple[str, int]:
    """(class name, position) of a key of a snapshot keyed by class name: ``Name`` is
    HF's single form (position 0), ``Name[i]`` the i-th of its list form."""
    match = _POSITION.match(key)
    if match is None:
        return key, 0
    return match[1], int(match[2])


class RestorePlan(msgspec.Struct, frozen=True, kw_only=True):
    """Which live callback gets which saved state, and every mismatch found."""

    matches: dict[int, str]  # position in the live list -> saved key
    restored: tuple[str, ...]  # live keys that get a state
    missing: tuple[str, ...]  # saved keys with no live callback
    unsaved: tuple[str, ...]  # live keys with no saved state
    mismatched: tuple[str, ...]  # "Class: N saved, M live"
    warnings: tuple[str, ...]
    #: Saved keys passed over as stale: the earlier entries of an HF list that grew.
    stale: tuple[str, ...] = ()

    @property
    def clean(self) -> bool:
        return not self.warnings


def plan_restore(callbacks: Sequence[object], snapshot: Snapshot) -> RestorePlan:
    """Match live stateful callbacks to saved states by key, never by position alone.

    For a Hugging Face snapshot (keyed by class name) the live instances of a
    class take the saved states of that class name by position. HF appends
    every save's states to its list form, so when more are saved than live
    the *last* ones are taken (the latest save) and the earlier ones are
    reported as stale, with their count; fewer saved than live is reported
    as a count mismatch, never truncated silently.
    """
    live = stateful_keys(callbacks)
    positions = {id(cb): i for i, cb in enumerate(callbacks)}
    saved = snapshot.states
    # A state found malformed or unsaved still holds its place (and its reason).
    failed = [key for key in snapshot.errors if key not in saved]
    taken: list[tuple[int, str, str]] = []  # (live position, live key, saved key)
    unsaved_at: list[tuple[int, str]] = []
    reasons: dict[str, str] = {}
    mismatched: list[str] = []
    stale: list[str] = []
    stale_notes: list[str] = []
    used: set[str] = set()

    def take(live_key: str, callback: object, saved_key: str | None) -> None:
        position = positions[id(callback)]
        if saved_key is not None and saved_key in saved:
            taken.append((position, live_key, saved_key))
            used.add(saved_key)
            return
        unsaved_at.append((position, live_key))
        if saved_key is not None:
            used.add(saved_key)
            reasons[live_key] = snapshot.errors[saved_key]
        elif live_key in snapshot.errors:
            reasons[live_key] = snapshot.errors[live_key]

    if snapshot.keyed_by == "class_name":
        entries: dict[str, list[tuple[int, int, str]]] = {}
        for order, key in enumerate([*saved, *failed]):
            name, position = _hf_position(key)
            entries.setdefault(name, []).append((position, order, key))
        groups: dict[str, list[tuple[str, object]]] = {}
        for key, callback in live.items():
            groups.setdefault(type(callback).__name__, []).append((key, callback))
        for name, group in groups.items():
            found = sorted(entries.get(name, []))
            if len(found) > len(group):
                cut = len(found) - len(group)
                stale.extend(key for *_, key in found[:cut])
                used.update(key for *_, key in found[:cut])
                found = found[cut:]
                mismatched.append(f"{name}: {cut + len(group)} saved, {len(group)} live")
                stale_notes.append(
                    f"{name}: {cut + len(group)} saved states for {len(group)} live "
                    f"callback(s): took the last {len(group)}, ignored {cut} earlier stale "
                    "one(s) (Hugging Face appends to the list on every save)"
                )
            elif found and len(found) < len(group):
                mismatched.append(f"{name}: {len(found)} saved, {len(group)} live")
            for index, (key, callback) in enumerate(group):
                take(key, callback, found[index][2] if index < len(found) else None)
    else:
        for key, callback in live.items():
            take(key, callback, key if key in saved or key in snapshot.errors else None)
        live_classes: dict[str, int] = {}
        for key in live:
            group_name = _class_of_key(key)
            live_classes[group_name] = live_classes.get(group_name, 0) + 1
        saved_classes: dict[str, int] = {}
        for key in [*saved, *failed]:
            group_name = _class_of_key(key)
            saved_classes[group_name] = saved_classes.get(group_name, 0) + 1
        mismatched = [
            f"{group_name}: {count} saved, {live_classes[group_name]} live"
            for group_name, count in saved_classes.items()
            if live_classes.get(group_name, count) != count
        ]
    missing = [key for key in saved if key not in used]
    taken.sort()
    matches = {position: saved_key for position, _, saved_key in taken}
    restored = [live_key for _, live_key, _ in taken]
    unsaved = [live_key for _, live_key in sorted(unsaved_at)]

    warnings: list[str] = []
    if missing:
        warnings.append(f"saved states with no live callback (dropped): {_listed(missing)}")
    for key in unsaved:
        why = reasons.get(key)
        why = None if why is None else _shorten(why)
        if why is None:
            warnings.append(f"live callback {key} has no saved state and starts fresh")
        elif why.startswith(MALFORMED):
            warnings.append(f"live callback {key} starts fresh: its saved state is {why}")
        else:
            warnings.append(
                f"live callback {key} has no saved state and starts fresh "
                f"(its state could not be saved: {why})"
            )
    stale_names = {note.split(":", 1)[0] for note in stale_notes}
    counts = [m for m in mismatched if m.split(":", 1)[0] not in stale_names]
    if counts:
        warnings.append(f"instance counts differ between save and resume: {'; '.join(counts)}")
    warnings.extend(stale_notes)
    return RestorePlan(
        matches=matches,
        restored=tuple(restored),
        missing=tuple(missing),
        unsaved=tuple(unsaved),
        mismatched=tuple(mismatched),
        warnings=tuple(warnings),
        stale=tuple(stale),
    )


# --- what a restore may set ---------------------------------------------------------------


class VettedState(msgspec.Struct, frozen=True, kw_only=True):
    """A saved state cut down to the names the live callback declares, and what was cut.

    ``ignored``: names in the saved state that its class does not declare
    (``args.x``, ``attributes.__dict__``), left out. ``wrong_types``: declared
    names whose saved JSON kind differs from the live value's. ``own_from_state``:
    the class restores itself (``from_state``), so the state is passed whole.
    """

    state: CallbackState
    ignored: tuple[str, ...] = ()
    wrong_types: tuple[str, ...] = ()
    own_from_state: bool = False

    def problems(self, key: str) -> tuple[str, ...]:
        """One line per kind of problem, naming the callback (``key``)."""
        lines = []
        if self.ignored:
            lines.append(
                f"{key}: ignored saved names its class does not declare as state: "
                f"{_listed(self.ignored)}"
            )
        if self.wrong_types:
            lines.append(f"{key}: {_listed(self.wrong_types)}")
        return tuple(lines)


_STATEFUL_FROM_STATE = StatefulCallback.__dict__["from_state"].__func__


def _own_from_state(cls: type[Any]) -> Any:
    """The class's ``from_state`` when it has its own (not ``StatefulCallback``'s), else None."""
    method = getattr(cls, "from_state", None)
    if not callable(method) or getattr(method, "__func__", None) is _STATEFUL_FROM_STATE:
        return None
    return method


def _is_state(state: Any) -> bool:
    return (
        type(state) is dict
        and type(state.get("args")) is dict
        and type(state.get("attributes")) is dict
    )


def _declared_names(callback: object) -> tuple[dict[str, Any], dict[str, Any]]:
    """(args, attributes) a restore of ``callback`` may set, each name -> its live value.

    A ``StatefulCallback`` declares them in ``state_args``/``state_attributes``;
    any other stateful callback by what its own ``state()`` returns now.
    """
    if isinstance(callback, StatefulCallback):
        cls = type(callback)
        return (
            {name: getattr(callback, name, None) for name in cls.state_args},
            {name: getattr(callback, name, None) for name in cls.state_attributes},
        )
    live = callback.state()  # type: ignore[attr-defined]
    if not _is_state(live):
        raise ValueError("its live state() does not return {'args': {...}, 'attributes': {...}}")
    return live["args"], live["attributes"]


def _declared_only(
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
                ignored.append(_member(part, name))
    return kept, ignored


def _json_kind(value: Any) -> str | None:
    """The JSON kind of a value (int and float are one: numbers); None for null or
    for a live value that is no JSON value at all (nothing to compare with)."""
    if value is None:
        return None
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list | tuple):
        return "an array"
    if isinstance(value, dict):
        return "an object"
    return None


def vet_state(callback: object, state: CallbackState) -> VettedState:
    """What of ``state`` a restore of ``callback`` may set.

    Only the names the callback declares as its state are kept (see
    ``_declared_names``): a tampered snapshot cannot set ``__dict__`` or
    replace a method. A class with its own ``from_state`` gets the state
    whole and must validate it itself. ``ValueError`` if the saved state is
    not shaped like one or the live callback's declared names cannot be
    read (its ``state()`` raised).
    """
    if not _is_state(state):
        raise ValueError("the saved state is not {'args': {...}, 'attributes': {...}}")
    if _own_from_state(type(callback)) is not None:
        return VettedState(state=state, own_from_state=True)
    try:
        live_args, live_attributes = _declared_names(callback)
    except Exception as exc:
        raise ValueError(
            f"reading its declared state failed ({type(exc).__name__}: {_shorten(str(exc), 200)})"
        ) from exc
    kept, ignored = _declared_only(state, list(live_args), list(live_attributes))
    wrong: list[str] = []
    for part, live in (("args", live_args), ("attributes", live_attributes)):
        for name, value in kept[part].items():  # type: ignore[literal-required]
            saved_kind, live_kind = _json_kind(value), _json_kind(live[name])
            if saved_kind is not None and live_kind is not None and saved_kind != live_kind:
                wrong.append(
                    f"{_member(part, name)} is {saved_kind} in the snapshot, "
                    f"the live value is {live_kind}"
                )
    return VettedState(state=kept, ignored=tuple(ignored), wrong_types=tuple(wrong))


def _rebuild_default(cls: type[Any], state: CallbackState) -> Any:
    instance = cls(**state["args"])
    for name, value in state["attributes"].items():
        setattr(instance, name, value)
    return instance


def rebuild_vetted(callback: object, vetted: VettedState) -> object:
    """A new instance of ``callback``'s class from a vetted state.

    ``cls.from_state`` when the class defines one (and it must return an
    instance of the class), else ``cls(**args)`` so ``__init__`` logic runs,
    then each declared attribute is set.
    """
    cls = type(callback)
    own = _own_from_state(cls)
    if own is None:
        return _rebuild_default(cls, vetted.state)
    instance = own(vetted.state)
    if not isinstance(instance, cls):
        raise TypeError(
            f"{cls.__qualname__}.from_state returned {type(instance).__qualname__}, "
            f"not a {cls.__qualname__}"
        )
    return instance


def rebuild(callback: object, state: CallbackState) -> object:
    """A new instance of ``callback``'s class carrying the declared part of ``state``
    (``vet_state`` then ``rebuild_vetted``)."""
    return rebuild_vetted(callback, vet_state(callback, state))
