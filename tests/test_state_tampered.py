"""Tampered snapshots: a restore sets only what a callback declares as its state (issue 16).

A snapshot file is data anyone with write access to the checkpoint can edit.
Restoring used to ``setattr`` every attribute in it: ``__dict__``, or
``after_report = "not callable"``, which silently unsubscribed that hook.
Now only declared names are restored (``state_args``/``state_attributes`` of
a ``StatefulCallback``; the names the live instance's own ``state()`` returns
otherwise); the rest is reported, and strict mode also checks JSON kinds.
One bad state in a file costs only that state. The property test at the end
throws random tampering at the loader and checks the promises hold.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from structlog.testing import capture_logs

from adapters._hf_state import read_hf_trainer_state
from eventbus import StatefulCallback
from eventbus.state import StateRestoreError, StateStore
from eventbus.state._files import STATE_FILENAME
from eventbus.state._model import CallbackState, Snapshot, StateFormatError
from handlers import EarlyStopping as BuiltinEarly


class Patience(StatefulCallback):
    """Declares its state; has a hook a tampered file would like to replace."""

    state_args = ("patience",)
    state_attributes = ("counter", "best", "history")

    def __init__(self, patience: int = 3) -> None:
        self.patience = patience
        self.limit = patience
        self.counter = 0
        self.best: float | None = None
        self.history: list[float] = []
        self.calls = 0

    def after_report(self) -> None:
        self.calls += 1


class Tally:
    """HF style: its own ``state()``, restored by ``cls(**args)`` and ``setattr``."""

    def __init__(self, start: int = 0) -> None:
        self.start = start
        self.count = start
        self.label = "tally"

    def state(self) -> CallbackState:
        return {"args": {"start": self.start}, "attributes": {"count": self.count}}

    def after_report(self) -> None:
        self.count += 1


class SelfRestoring:
    """Its own ``from_state``: gets the saved state whole and validates it itself."""

    seen: list[CallbackState] = []  # noqa: RUF012

    def __init__(self) -> None:
        self.value = 0

    def state(self) -> CallbackState:
        return {"args": {}, "attributes": {"value": self.value}}

    @classmethod
    def from_state(cls, state: CallbackState) -> SelfRestoring:
        cls.seen.append(state)
        instance = cls()
        value = state["attributes"].get("value")
        instance.value = value if type(value) is int else 0
        return instance


def key(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def live_callbacks() -> list[object]:
    return [Patience(), Tally(), SelfRestoring()]


def saved_file(root: Path) -> tuple[StateStore, str, dict[str, Any]]:
    """A genuine snapshot of the three callbacks, and its JSON to tamper with."""
    patience, tally, custom = Patience(patience=5), Tally(2), SelfRestoring()
    patience.counter, patience.best, patience.history = 2, 0.25, [0.5, 0.25]
    tally.count = 7
    custom.value = 4
    store = StateStore(root)
    store.register([patience, tally, custom])
    checkpoint = str(root / "ckpt")
    store.snapshot(checkpoint)
    return store, checkpoint, json.loads(store.path_of(checkpoint).read_text())


def write(store: StateStore, checkpoint: str, document: dict[str, Any]) -> None:
    store.path_of(checkpoint).write_text(json.dumps(document))


def test_undeclared_names_in_a_tampered_snapshot_are_not_set_but_reported(
    tmp_path: Path,
) -> None:
    store, checkpoint, document = saved_file(tmp_path)
    patience = document["states"][key(Patience)]
    patience["attributes"].update(
        {"__dict__": {"counter": 99}, "after_report": "not callable", "__class__": "Tally"}
    )
    patience["args"]["evil"] = 1
    tally = document["states"][key(Tally)]
    tally["attributes"].update({"after_report": None, "label": "hacked", "start": 100})
    document["checkpoint"] = "/somewhere/else"  # the event names the operator's location
    write(store, checkpoint, document)

    with capture_logs() as logs:
        restored, report = store.restore(live_callbacks(), checkpoint)
    p, t, _ = restored
    assert isinstance(p, Patience) and isinstance(t, Tally)
    assert (p.patience, p.limit, p.counter, p.best, p.history) == (5, 5, 2, 0.25, [0.5, 0.25])
    p.after_report()  # still the method: the hook stays subscribed
    t.after_report()
    assert p.calls == 1 and t.count == 8 and t.label == "tally" and t.start == 2
    assert set(vars(p)) == set(vars(Patience())) and set(vars(t)) == set(vars(Tally()))
    assert len(report.restored) == 3 and report.checkpoint == checkpoint
    ignored = [w for w in report.warnings if "does not declare" in w]
    assert ignored[0].startswith(f"{key(Patience)}: ignored saved names")
    for name in ("args.evil", "attributes.__dict__", "attributes.after_report", "__class__"):
        assert name in ignored[0]
    assert ignored[1].startswith(f"{key(Tally)}: ignored saved names")
    assert "attributes.label" in ignored[1] and "attributes.start" in ignored[1]
    assert logs[0]["problems"] == report.warnings

    # Strict: an error naming the callback and the names, and nothing changes.
    strict = StateStore(tmp_path, strict=True)
    live = live_callbacks()
    strict.register(live)
    with pytest.raises(StateRestoreError, match=r"Patience: ignored saved names.*after_report"):
        strict.restore(live, checkpoint)
    assert strict.keys == (key(Patience), key(Tally), key(SelfRestoring))


def test_builtin_hook_cannot_be_replaced_by_a_tampered_attribute(tmp_path: Path) -> None:
    """The issue's case: ``after_report = "not callable"`` on a built-in callback (HF
    style: its names are those of its live ``state()``)."""
    early = BuiltinEarly("loss", patience=4)
    early.best, early.wait = 0.5, 1
    store = StateStore(tmp_path)
    store.register([early])
    checkpoint = str(tmp_path / "ckpt")
    store.snapshot(checkpoint)
    document = json.loads(store.path_of(checkpoint).read_text())
    (state,) = document["states"].values()
    state["attributes"]["after_report"] = "not callable"
    write(store, checkpoint, document)
    restored, report = store.restore([BuiltinEarly("loss")], checkpoint)
    new = restored[0]
    assert isinstance(new, BuiltinEarly) and callable(new.after_report)
    assert (new.patience, new.best, new.wait) == (4, 0.5, 1)
    assert "attributes.after_report" in report.warnings[0]


def test_own_from_state_gets_the_state_whole(tmp_path: Path) -> None:
    """A class with its own ``from_state`` keeps full control, and the duty to validate."""
    store, checkpoint, document = saved_file(tmp_path)
    document["states"][key(SelfRestoring)]["attributes"] = {"value": "x", "__dict__": {}}
    write(store, checkpoint, document)
    SelfRestoring.seen.clear()
    restored, report = StateStore(tmp_path, strict=True).restore(live_callbacks(), checkpoint)
    assert SelfRestoring.seen == [{"args": {}, "attributes": {"value": "x", "__dict__": {}}}]
    assert isinstance(restored[2], SelfRestoring) and restored[2].value == 0
    assert report.warnings == ()


def test_from_state_returning_another_type_keeps_the_live_callback(tmp_path: Path) -> None:
    class Liar(SelfRestoring):
        @classmethod
        def from_state(cls, state: CallbackState) -> Any:
            return None

    snapshot = Snapshot(states={key(Liar): {"args": {}, "attributes": {}}})
    live = Liar()
    restored, report = StateStore(tmp_path).restore([live], snapshot)
    assert restored[0] is live and report.restored == ()
    assert "from_state returned NoneType" in report.warnings[0]


@pytest.mark.parametrize(
    ("part", "name", "value", "kinds"),
    [
        ("attributes", "counter", "3", "is a string in the snapshot, the live value is a number"),
        ("attributes", "history", {"a": 1}, "is an object in the snapshot, the live value is an"),
        ("args", "patience", [3], "is an array in the snapshot, the live value is a number"),
        ("attributes", "counter", True, "is a boolean in the snapshot, the live value is a number"),
    ],
)
def test_strict_restore_checks_json_kinds_naming_callback_and_attribute(
    tmp_path: Path, part: str, name: str, value: Any, kinds: str
) -> None:
    store, checkpoint, document = saved_file(tmp_path)
    document["states"][key(Patience)][part][name] = value
    write(store, checkpoint, document)
    with pytest.raises(StateRestoreError) as info:
        StateStore(tmp_path, strict=True).restore(live_callbacks(), checkpoint)
    assert f"{key(Patience)}: {part}.{name} {kinds}" in str(info.value)
    # Not strict: restored as saved, with a warning that says the same.
    _, report = StateStore(tmp_path).restore(live_callbacks(), checkpoint)
    assert any(f"{part}.{name} {kinds}" in w for w in report.warnings)


def test_strict_kind_check_accepts_ints_for_floats_and_none_either_way(tmp_path: Path) -> None:
    store, checkpoint, document = saved_file(tmp_path)
    state = document["states"][key(Patience)]
    state["attributes"].update({"best": 1, "history": None})  # live: 0.25 (None below), list
    state["args"]["patience"] = 4.0
    write(store, checkpoint, document)
    live = live_callbacks()
    restored, report = StateStore(tmp_path, strict=True).restore(live, checkpoint)
    assert report.warnings == ()
    assert isinstance(restored[0], Patience) and restored[0].best == 1


def test_state_method_failing_at_restore_costs_only_its_callback(tmp_path: Path) -> None:
    """The declared names of an HF-style callback come from its live ``state()``."""
    _, checkpoint, _ = saved_file(tmp_path)

    class Broken(Tally):
        def state(self) -> CallbackState:
            raise RuntimeError("no state now")

    broken = Broken()
    snapshot = StateStore(tmp_path).load(checkpoint)
    states = dict(snapshot.states)
    states[key(Broken)] = states.pop(key(Tally))
    tampered = Snapshot(checkpoint=checkpoint, states=states)
    restored, report = StateStore(tmp_path).restore([Patience(), broken], tampered)
    assert restored[1] is broken and report.restored == (key(Patience),)
    assert any("no state now" in w and "starts fresh" in w for w in report.warnings)
    with pytest.raises(StateRestoreError, match="no state now"):
        StateStore(tmp_path, strict=True).restore([Patience(), Broken()], tampered)


@pytest.mark.parametrize(
    "bad",
    [
        {"args": 5, "attributes": {}},
        {"args": {}},
        [1, 2],
        None,
        {"args": {}, "attributes": {}, "extra": 1},
        "__HUGE_INT__",
        {"args": {}, "attributes": {"x": "__INFINITY__"}},
    ],
)
def test_one_malformed_state_in_a_file_costs_only_that_callback(tmp_path: Path, bad: Any) -> None:
    store, checkpoint, document = saved_file(tmp_path)
    document["states"][key(Tally)] = bad
    text = json.dumps(document)
    text = text.replace('"__HUGE_INT__"', "9" * 5000).replace('"__INFINITY__"', "1e999")
    store.path_of(checkpoint).write_text(text)
    snapshot = store.load(checkpoint)
    assert key(Tally) not in snapshot.states
    assert snapshot.errors[key(Tally)].startswith(f"malformed in {STATE_FILENAME}: states[")
    restored, report = store.restore(live_callbacks(), checkpoint)
    assert report.restored == (key(Patience), key(SelfRestoring))
    assert report.unsaved == (key(Tally),)
    assert any(
        w.startswith(f"live callback {key(Tally)} starts fresh: its saved") for w in report.warnings
    )
    assert isinstance(restored[0], Patience) and restored[0].counter == 2


@pytest.mark.parametrize(
    "payload",
    [b"[" * 100_000 + b"]" * 100_000, b'{"format": 1, "states": {"k": ' + b"[" * 50_000 + b"}}"],
)
def test_nesting_too_deep_is_a_format_error_not_a_recursion_error(
    tmp_path: Path, payload: bytes
) -> None:
    store, checkpoint, _ = saved_file(tmp_path)
    store.path_of(checkpoint).write_bytes(payload)
    with pytest.raises(StateFormatError, match=STATE_FILENAME):
        store.load(checkpoint)
    hf = tmp_path / "trainer_state.json"
    hf.write_bytes(payload)
    with pytest.raises(StateFormatError, match=r"trainer_state\.json"):
        read_hf_trainer_state(hf)


def test_hf_trainer_state_with_huge_numbers_is_a_format_error(tmp_path: Path) -> None:
    hf = tmp_path / "trainer_state.json"
    hf.write_text('{"global_step": ' + "9" * 5000 + "}")
    with pytest.raises(StateFormatError, match=r"trainer_state\.json: not JSON"):
        read_hf_trainer_state(hf)
    hf.write_bytes(b'{"x": "\xff"}')
    with pytest.raises(StateFormatError, match=r"trainer_state\.json: not JSON"):
        read_hf_trainer_state(hf)


# --- at save time: one bad state never costs the others -----------------------------


class Deep:
    def __init__(self, depth: int = 0) -> None:
        self.depth = depth

    def state(self) -> CallbackState:
        nested: list[Any] = []
        for _ in range(self.depth):
            nested = [nested]
        return {"args": {}, "attributes": {"nested": nested}}


class Loud:
    def state(self) -> CallbackState:
        raise RuntimeError("x" * 1_000_000)


class Touchy(str):
    def __eq__(self, other: object) -> bool:
        raise RuntimeError("cannot compare")

    __hash__ = str.__hash__


class Sneaky:
    def state(self) -> CallbackState:
        return {"args": {}, "attributes": {"name": Touchy("a")}}


def test_save_survives_deep_loud_and_uncomparable_states(tmp_path: Path) -> None:
    store = StateStore(tmp_path)
    store.register([Deep(100_000), Loud(), Sneaky(), Tally(3)])
    event = store.snapshot(str(tmp_path / "ckpt"))
    assert event.keys == (key(Tally),)
    assert "nested too deeply" in event.errors[key(Deep)]
    assert len(event.errors[key(Loud)]) < 3000 and event.errors[key(Loud)].endswith("…")  # cut
    assert key(Sneaky) in event.errors
    assert store.load(str(tmp_path / "ckpt")).states[key(Tally)]["attributes"] == {"count": 3}


# --- property: random tampering -------------------------------------------------------

_SPECIAL = ("__HUGE_INT__", "__DEEP__", "__INFINITY__", "__NAN__")
_NAMES = st.sampled_from(
    [
        "__dict__",
        "__class__",
        "__init__",
        "__setattr__",
        "after_report",
        "state",
        "from_state",
        "limit",
        "calls",
        "label",
        "start",
        "value",
        "counter",
        "best",
        "history",
        "patience",
        "count",
    ]
) | st.text(max_size=12)

_json = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(10**40), max_value=10**40)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20)
    | st.sampled_from(_SPECIAL)
    | st.just("x" * 100_000),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(_NAMES, inner, max_size=4),
    max_leaves=12,
)


@st.composite
def tampering(draw: st.DrawFn) -> Any:
    """One tampered state: replaced whole, or with names added or values changed."""
    how = draw(st.sampled_from(["replace", "add", "change", "top"]))
    if how == "replace":
        return ("replace", draw(_json))
    if how == "top":
        return ("top", draw(st.dictionaries(_NAMES, _json, min_size=1, max_size=3)))
    part = draw(st.sampled_from(["args", "attributes"]))
    return (how, part, draw(st.dictionaries(_NAMES, _json, min_size=1, max_size=4)))


def apply(state: dict[str, Any], change: Any) -> Any:
    if change[0] == "replace":
        return change[1]
    if change[0] == "top":
        return {**state, **change[1]}
    how, part, names = change
    target = dict(state[part])
    if how == "change":
        names = {name: value for name, value in zip(target, names.values(), strict=False)}
    target.update(names)
    return {**state, part: target}


def render(document: dict[str, Any]) -> str:
    text = json.dumps(document)
    return (
        text.replace('"__HUGE_INT__"', "9" * 5000)
        .replace('"__DEEP__"', "[" * 5000 + "]" * 5000)
        .replace('"__INFINITY__"', "-1e999")
        .replace('"__NAN__"', "NaN")
    )


@settings(
    max_examples=150,
    deadline=None,
    derandomize=True,  # the same examples on every CI run
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(
    changes=st.dictionaries(
        st.sampled_from([key(Patience), key(Tally), key(SelfRestoring)]),
        tampering(),
        min_size=1,
        max_size=2,
    ),
    top=st.fixed_dictionaries(
        {},
        optional={
            "errors": st.dictionaries(
                st.sampled_from([key(Patience), key(Tally), key(SelfRestoring)]) | st.text(),
                st.text(max_size=50) | st.just("malformed in " + "y" * 10_000),
            ),
            "run_id": st.text(max_size=20),
            "checkpoint": st.just("c" * 100_000) | st.text(max_size=20),
            "unknown": _json,
            "__class__": _json,
        },
    ),
)
def test_random_tampering_never_sets_undeclared_names_nor_costs_untampered_callbacks(
    tmp_path_factory: pytest.TempPathFactory, changes: dict[str, Any], top: dict[str, Any]
) -> None:
    root = tmp_path_factory.mktemp("tampered")
    store, checkpoint, document = saved_file(root)
    original = {k: json.loads(json.dumps(v)) for k, v in document["states"].items()}
    for name, change in changes.items():
        document["states"][name] = apply(document["states"][name], change)
    document.update(top)  # fields of the file itself: unknown ones are ignored
    store.path_of(checkpoint).write_text(render(document))

    text = store.path_of(checkpoint).read_text()
    # Not JSON (NaN) or nested past the decoder's depth: the file as a whole is refused.
    unreadable = "NaN" in text or "[" * 2000 in text
    for strict in (False, True):
        live = live_callbacks()
        try:
            restored, report = StateStore(root, strict=strict).restore(live, checkpoint)
        except StateFormatError as exc:
            assert unreadable and STATE_FILENAME in str(exc)
            continue
        except StateRestoreError:
            assert strict  # lenient mode reports, it does not raise
            continue
        for old, new in zip(live, restored, strict=True):
            assert type(new) is type(old)
            # Nothing but what __init__ makes: no undeclared name was set.
            assert set(vars(new)) == set(vars(type(old)()))
            assert callable(new.after_report) if hasattr(new, "after_report") else True
            if isinstance(new, Patience):
                assert (isinstance(new.calls, int) and new.limit == new.patience) or new is old
            if isinstance(new, Tally):
                assert new.label == "tally"
        for name, state in original.items():
            if name in changes:
                continue
            assert name in report.restored
            position = [key(Patience), key(Tally), key(SelfRestoring)].index(name)
            assert restored[position].state() == state  # type: ignore[attr-defined]
        for name in report.restored:
            value = restored[[key(Patience), key(Tally), key(SelfRestoring)].index(name)]
            for part in value.state().values():  # type: ignore[attr-defined]
                assert all(not isinstance(v, float) or math.isfinite(v) for v in part.values())
        assert all(len(warning) < 10_000 for warning in report.warnings)  # bounded
