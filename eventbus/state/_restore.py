"""Putting saved states back: matched by key, never by position alone, every mismatch
reported; only what a callback declares as its state is set (a snapshot is editable data)."""

from __future__ import annotations

import inspect
import re
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

import msgspec

from .._text import clip, describe, safe_str
from ._model import (
    MALFORMED,
    MAX_REASON_CHARS,
    CallbackState,
    Snapshot,
    StatefulCallback,
    declared_only,
    listed,
    member,
    rebuild_default,
    stateful_keys,
)

__all__ = [
    "RestorePlan",
    "VettedState",
    "move_state",
    "plan_restore",
    "rebuild_vetted",
    "vet_state",
]

#: A class defined in a script and later imported from its module is the same callback.
MAIN_MODULE = "__main__"


def _class_of_key(key: str) -> str:
    """The class part of a key: ``pkg.mod.Cls[x]`` -> ``pkg.mod.Cls``."""
    return key.split("[", 1)[0]


#: A Hugging Face key: ``Name`` (position 0) or ``Name[i]``.
_POSITION = re.compile(r"(.*)\[([0-9]{1,18})\]\Z", re.DOTALL)


_MAX_AMBIGUOUS = 20

_MOVED_WHY = "its class moved between a script run as __main__ and a module, and several match"


def _match_moved(
    live: dict[str, type[Any]], saved: Sequence[str]
) -> tuple[dict[str, str], list[str]]:
    """Pair unmatched keys of a class that moved between ``__main__`` and its module
    (unique pairs only: a guess could hand one callback another's state). Returns live
    key -> saved key, and a warning per ambiguous key."""
    by_tail: dict[tuple[str, str], list[str]] = {}
    for key in saved:
        name = _class_of_key(key)
        by_tail.setdefault((name.rsplit(".", 1)[-1], key[len(name) :]), []).append(key)
    live_found: dict[str, list[str]] = {}
    saved_found: dict[str, list[str]] = {}
    for live_key, cls in live.items():
        module, qualname = cls.__module__, cls.__qualname__
        if _class_of_key(live_key) != f"{module}.{qualname}":
            continue  # saved under a stable name (``state_name``), whatever its module
        suffix = live_key[len(module) + len(qualname) + 1 :]
        for key in by_tail.get((qualname.rsplit(".", 1)[-1], suffix), []):
            name = _class_of_key(key)
            if module == MAIN_MODULE:
                other = name[: -len(qualname) - 1] if name.endswith(f".{qualname}") else ""
                fits = other not in ("", MAIN_MODULE)
            else:
                fits = name == f"{MAIN_MODULE}.{qualname}"
            if fits:
                live_found.setdefault(live_key, []).append(key)
                saved_found.setdefault(key, []).append(live_key)
    pairs = {
        live_key: found[0]
        for live_key, found in live_found.items()
        if len(found) == 1 and len(saved_found[found[0]]) == 1
    }
    notes = [
        f"live callback {clip(live_key, 120)} could take any of the saved states "
        f"{listed(found)} ({_MOVED_WHY}): none taken"
        for live_key, found in live_found.items()
        if len(found) > 1
    ]
    shared = [(key, found) for key, found in saved_found.items() if len(found) > 1]
    notes.extend(
        f"saved state {clip(key, 120)} could belong to any of the live callbacks "
        f"{listed(found)} ({_MOVED_WHY}): not matched"
        for key, found in shared[:_MAX_AMBIGUOUS]
    )
    if len(shared) > _MAX_AMBIGUOUS:
        notes.append(f"and {len(shared) - _MAX_AMBIGUOUS} more ambiguous saved states")
    return pairs, notes


class RestorePlan(msgspec.Struct, frozen=True, kw_only=True):
    """Which live callback gets which saved state, and every mismatch found."""

    matches: dict[int, str]  # position in the live list -> saved key
    missing: tuple[str, ...]  # saved keys with no live callback
    unsaved: tuple[str, ...]  # live keys with no saved state
    mismatched: tuple[str, ...]  # "Class: N saved, M live"
    warnings: tuple[str, ...]
    moved: tuple[tuple[str, str], ...] = ()  # (saved key, live key) matched across a move


def plan_restore(callbacks: Sequence[object], snapshot: Snapshot) -> RestorePlan:
    """Match live stateful callbacks to saved states by key, never by position alone (in a
    Hugging Face snapshot, by class name, the *last* saved states: HF appends every save's)."""
    live = stateful_keys(callbacks)
    saved = snapshot.states
    # A state found malformed or unsaved still holds its place (and its reason).
    stored = [*saved, *(key for key in snapshot.errors if key not in saved)]
    chosen: dict[str, str] = {}  # live key -> saved key
    passed_over: list[str] = []
    mismatched: list[str] = []
    stale_notes: dict[str, str] = {}  # class name -> the note on its stale states
    moved: dict[str, str] = {}  # live key -> saved key, matched across a module move
    moved_notes: list[str] = []
    if snapshot.keyed_by == "class_name":
        entries: dict[str, list[tuple[int, int, str]]] = {}
        for order, key in enumerate(stored):
            match = _POSITION.match(key)
            name, position = (key, 0) if match is None else (match[1], int(match[2]))
            entries.setdefault(name, []).append((position, order, key))
        groups: dict[str, list[str]] = {}
        for key, callback in live.items():
            groups.setdefault(type(callback).__name__, []).append(key)
        for name, group in groups.items():
            found = [key for *_, key in sorted(entries.get(name, []))]
            if found and len(found) != len(group):
                mismatched.append(f"{name}: {len(found)} saved, {len(group)} live")
            cut = len(found) - len(group)
            if cut > 0:
                passed_over.extend(found[:cut])
                found = found[cut:]
                stale_notes[name] = (
                    f"{name}: {cut + len(group)} saved states for {len(group)} live "
                    f"callback(s): took the last {len(group)}, ignored {cut} earlier stale "
                    "one(s) (Hugging Face appends to the list on every save)"
                )
            chosen.update(zip(group, found, strict=False))
    else:
        exact = {key for key in live if key in saved or key in snapshot.errors}
        moved, moved_notes = _match_moved(
            {key: type(cb) for key, cb in live.items() if key not in exact},
            [key for key in stored if key not in exact],
        )
        chosen = {key: key for key in exact} | moved
        live_classes = Counter(map(_class_of_key, live))
        # A class that moved counts as one: its saved keys are counted under the live name.
        aliases: dict[str, set[str]] = {}
        for live_key, saved_key in moved.items():
            aliases.setdefault(_class_of_key(saved_key), set()).add(_class_of_key(live_key))
        renamed = {saved_key: live_key for live_key, saved_key in moved.items()}
        saved_classes: Counter[str] = Counter()
        for key in stored:
            group_name = _class_of_key(key)
            targets = aliases.get(group_name, set())
            if len(targets) == 1:
                group_name = next(iter(targets))
            elif key in renamed:  # one saved class split over several live ones: per key
                group_name = _class_of_key(renamed[key])
            saved_classes[group_name] += 1
        mismatched = [
            f"{group_name}: {count} saved, {live_classes[group_name]} live"
            for group_name, count in saved_classes.items()
            if live_classes.get(group_name, count) != count
        ]
    used = {*chosen.values(), *passed_over}
    missing = [key for key in saved if key not in used]
    positions = {id(cb): i for i, cb in enumerate(callbacks)}
    matches = {positions[id(live[key])]: chosen[key] for key in live if chosen.get(key) in saved}
    unsaved = [key for key in live if chosen.get(key) not in saved]
    warnings: list[str] = []
    if missing:
        warnings.append(f"saved states with no live callback (dropped): {listed(missing)}")
    for key in unsaved:
        why = snapshot.errors.get(chosen.get(key, key))
        why = None if why is None else clip(why, MAX_REASON_CHARS)
        if why is None:
            warnings.append(f"live callback {key} has no saved state and starts fresh")
        elif why.startswith(MALFORMED):
            warnings.append(f"live callback {key} starts fresh: its saved state is {why}")
        else:
            warnings.append(
                f"live callback {key} has no saved state and starts fresh "
                f"(its state could not be saved: {why})"
            )
    counts = [m for m in mismatched if m.split(":", 1)[0] not in stale_notes]
    if counts:
        warnings.append(f"instance counts differ between save and resume: {'; '.join(counts)}")
    warnings.extend(stale_notes.values())
    warnings.extend(moved_notes)
    return RestorePlan(
        matches=matches,
        missing=tuple(missing),
        unsaved=tuple(unsaved),
        mismatched=tuple(mismatched),
        warnings=tuple(warnings),
        moved=tuple((moved[key], key) for key in live if key in moved),
    )


# --- saved args against live ones: the saved win (a resume continues the saved run),
# except ``state_live_args`` (a snapshot, editable data, must not switch them on); never silently

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


def _shown(name: str, value: Any) -> str:
    try:
        text = repr(value)
    except Exception:
        text = f"<{type(value).__qualname__}>"
    return f"{name}={clip(text, 100)}"


def settle_args(
    callback: object, saved: Mapping[str, Any], live: Mapping[str, Any]
) -> tuple[dict[str, Any], str | None]:
    """The args to rebuild ``callback`` with (the saved win but for ``state_live_args``),
    and a note naming each that differs (``None``: none does; docs/state.md)."""
    if not isinstance(callback, StatefulCallback):
        return dict(saved), None
    live_wins = set(type(callback).state_live_args) & set(live)
    try:
        signature = inspect.signature(type(callback)).parameters.values()
    except (TypeError, ValueError):  # no signature to read: no defaults
        signature = {}.values()
    defaults = {p.name: p.default for p in signature if p.default is not p.empty}
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


# --- what a restore may set ---------------------------------------------------------------


class VettedState(msgspec.Struct, frozen=True, kw_only=True):
    """A saved state cut down to the names the live callback declares; ``problems``: what
    was cut, or saved with another JSON kind."""

    state: CallbackState
    problems: tuple[str, ...] = ()
    args_note: str | None = None


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
    """(args, attributes) a restore of ``callback`` may set, each name -> its live value
    (``state_args``/``state_attributes``, else what ``state()`` returns now)."""
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


_JSON_KINDS = (
    (bool, "a boolean"),
    (int | float, "a number"),
    (str, "a string"),
    (list | tuple, "an array"),
    (dict, "an object"),
)


def _json_kind(value: Any) -> str | None:
    """The JSON kind of a value (int and float alike); None for null or a non-JSON value."""
    return next((kind for types, kind in _JSON_KINDS if isinstance(value, types)), None)


def vet_state(callback: object, state: CallbackState, key: str) -> VettedState:
    """What of ``state`` a restore of ``callback`` (``key``) may set: only its declared names
    (a class with its own ``from_state`` gets the state whole). ``ValueError`` if the state
    is misshapen or the callback's ``state()`` raised."""
    if not _is_state(state):
        raise ValueError("the saved state is not {'args': {...}, 'attributes': {...}}")
    if _own_from_state(type(callback)) is not None:
        if not isinstance(callback, StatefulCallback):
            return VettedState(state=state)
        live = {name: getattr(callback, name, None) for name in type(callback).state_args}
        args, note = settle_args(callback, state["args"], live)
        whole: CallbackState = {"args": args, "attributes": state["attributes"]}
        return VettedState(state=whole, args_note=note)
    try:
        live_args, live_attributes = _declared_names(callback)
    except Exception as exc:
        raise ValueError(
            f"reading its declared state failed ({type(exc).__name__}: {clip(safe_str(exc), 200)})"
        ) from exc
    kept, ignored = declared_only(state, list(live_args), list(live_attributes))
    kept["args"], note = settle_args(callback, kept["args"], live_args)
    wrong: list[str] = []
    problems = []
    if ignored:
        problems.append(
            f"{key}: ignored saved names its class does not declare as state: {listed(ignored)}"
        )
    for part, live in (("args", live_args), ("attributes", live_attributes)):
        for name, value in kept[part].items():  # type: ignore[literal-required]
            saved_kind, live_kind = _json_kind(value), _json_kind(live[name])
            if saved_kind is not None and live_kind is not None and saved_kind != live_kind:
                wrong.append(
                    f"{member(part, name)} is {saved_kind} in the snapshot, "
                    f"the live value is {live_kind}"
                )
    if wrong:
        problems.append(f"{key}: {listed(wrong)}")
    return VettedState(state=kept, problems=tuple(problems), args_note=note)


def rebuild_vetted(callback: object, vetted: VettedState) -> object:
    """A new instance of ``callback``'s class from a vetted state: ``cls.from_state``,
    else ``cls(**args)`` then each declared attribute."""
    cls = type(callback)
    own = _own_from_state(cls)
    if own is None:
        return rebuild_default(cls, vetted.state)
    instance = own(vetted.state)
    if not isinstance(instance, cls):
        raise TypeError(
            f"{cls.__qualname__}.from_state returned {type(instance).__qualname__}, "
            f"not a {cls.__qualname__}"
        )
    return instance


def _slot_names(cls: type[Any]) -> list[str]:
    """The slots of ``cls`` and its bases that hold state (``__dict__``/``__weakref__`` do not)."""
    names: list[str] = []
    for klass in cls.__mro__:
        slots = klass.__dict__.get("__slots__", ())
        for name in [slots] if isinstance(slots, str) else slots:
            if name not in ("__dict__", "__weakref__"):
                names.append(name)
    return names


def move_state(live: object, rebuilt: object) -> str | None:
    """Move ``rebuilt``'s state onto ``live``, so the object the user holds is the restored
    one. Returns why it cannot be (nothing changed then): no ``__dict__``, slots, a subclass."""
    if type(rebuilt) is not type(live):
        return (
            f"its from_state returned a {type(rebuilt).__qualname__}, "
            f"not a {type(live).__qualname__}"
        )
    slots = _slot_names(type(live))
    if slots:
        return f"its class keeps state in __slots__ ({listed(slots)})"
    try:
        target, source = vars(live), dict(vars(rebuilt))
    except TypeError:
        return "it has no __dict__ to update"
    except Exception as exc:  # a __dict__ property of its own that raises
        return f"reading its __dict__ raised {describe(exc)}"
    target.update(source)
    return None
