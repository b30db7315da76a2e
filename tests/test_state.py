"""State store: snapshot every stateful callback at every save, restore on resume.

Each test is named after the bug it guards; several are bugs Hugging Face,
Lightning or Composer shipped (see issue 5).
"""

from __future__ import annotations

import enum
import json
import math
from pathlib import Path
from typing import Any

import pytest
from _builders import Custom
from structlog.testing import capture_logs

from eventbus import (
    CheckpointSaved,
    EventBus,
    HandlerFailed,
    StatefulCallback,
    StateRestored,
    StateSnapshotted,
)
from eventbus.state import StateRestoreError, StateStore
from eventbus.state._model import (
    CallbackState,
    Snapshot,
    StateFormatError,
    StateKeyConflict,
    is_stateful,
    state_key_of,
)
from handlers import BestCheckpoints as BuiltinBest
from handlers import EarlyStopping as BuiltinEarly


class EarlyStopping(StatefulCallback):
    """Like a built-in early stopping: ``__init__`` derives ``limit`` from its args."""

    state_args = ("patience", "mode")
    state_attributes = ("counter", "best")

    def __init__(self, patience: int = 3, mode: str = "min") -> None:
        self.patience = patience
        self.mode = mode
        self.limit = patience  # derived in __init__: must exist after a restore
        self.counter = 0
        self.best: float | None = None


class BestCheckpoints(StatefulCallback):
    """Several instances per run, told apart by ``state_key``."""

    state_args = ("metric", "k")
    state_attributes = ("best",)

    def __init__(self, metric: str = "loss", k: int = 2) -> None:
        self.metric = metric
        self.k = k
        self.best: list[list[Any]] = []

    @property
    def state_key(self) -> str:
        return self.metric


class Counter:
    """The bare protocol: ``state()`` and nothing else (restored by ``cls(**args)``)."""

    def __init__(self, start: int = 0) -> None:
        self.start = start
        self.count = start

    def state(self) -> CallbackState:
        return {"args": {"start": self.start}, "attributes": {"count": self.count}}


class Validated(StatefulCallback):
    """``__init__`` refuses some values: a saved state can make the rebuild fail."""

    state_args = ("k",)

    def __init__(self, k: int = 1) -> None:
        if k < 1:
            raise ValueError(f"k must be at least 1, got {k}")
        self.k = k


class Plain:
    """Not stateful: a data attribute named ``state`` is not a ``state()`` method."""

    def __init__(self) -> None:
        self.state = "running"


class Bad:
    """Whatever ``payload`` holds goes into its attributes."""

    def __init__(self, payload: Any = None) -> None:
        self.payload = payload

    def state(self) -> CallbackState:
        return {"args": {}, "attributes": {"best": [1.0, 2.0, self.payload]}}


class Raises:
    def state(self) -> CallbackState:
        raise RuntimeError("cannot read my state")


class TensorLike:
    def __repr__(self) -> str:
        return "tensor(0.5)"


def key(cls: type, suffix: str | None = None) -> str:
    name = f"{cls.__module__}.{cls.__qualname__}"
    return name if suffix is None else f"{name}[{suffix}]"


def saved(store: StateStore, checkpoint: str) -> dict[str, Any]:
    return json.loads(store.path_of(checkpoint).read_text())  # type: ignore[no-any-return]


# --- protocol and keys ---------------------------------------------------------------


def test_protocol_recognises_state_methods_not_state_attributes(tmp_path: Path) -> None:
    assert is_stateful(Counter()) and is_stateful(EarlyStopping())
    assert not is_stateful(Plain())
    store = StateStore(tmp_path)
    store.register([Plain(), Counter(), object(), EarlyStopping()])
    assert store.keys == (key(Counter), key(EarlyStopping))


def test_keys_are_module_qualname_plus_state_key() -> None:
    assert state_key_of(EarlyStopping()) == f"{__name__}.EarlyStopping"
    assert state_key_of(BestCheckpoints("acc")) == f"{__name__}.BestCheckpoints[acc]"


def test_duplicate_keys_rejected_naming_both_composer_lost_one_of_two(tmp_path: Path) -> None:
    first, second = EarlyStopping(patience=1), EarlyStopping(patience=2)
    store = StateStore(tmp_path)
    store.register([Counter()])
    with pytest.raises(StateKeyConflict) as info:
        store.register([first, Plain(), second])
    message = str(info.value)
    assert "#0" in message and "#2" in message and key(EarlyStopping) in message
    assert repr(first) in message and repr(second) in message
    assert store.keys == (key(Counter),)  # nothing half-registered


def test_state_key_that_is_not_a_str_is_rejected(tmp_path: Path) -> None:
    class Weird(Counter):
        state_key = 3

    with pytest.raises(TypeError, match="state_key must be a str"):
        StateStore(tmp_path).register([Weird()])


# --- snapshot ----------------------------------------------------------------------


def test_round_trip_rebuilds_from_args_then_sets_attributes(tmp_path: Path) -> None:
    early, best, count, custom = (
        EarlyStopping(patience=5),
        BestCheckpoints("acc", 3),
        Counter(2),
        Custom(),
    )
    early.counter, early.best = 2, 0.25
    best.best = [[0.9, "ckpt-3"], [0.8, "ckpt-1"]]
    count.count = 7
    custom.value = 4
    store = StateStore(tmp_path)
    store.register([early, best, count, custom])
    event = store.snapshot(str(tmp_path / "ckpt-1"), run_id="run")
    assert event.keys == (
        key(EarlyStopping),
        key(BestCheckpoints, "acc"),
        key(Counter),
        key(Custom),
    )
    assert event.errors == {} and event.path == str(tmp_path / "ckpt-1" / "callback_state.json")

    fresh = [EarlyStopping(), BestCheckpoints("acc"), Counter(), Custom()]
    restored, report = StateStore(tmp_path).restore(fresh, str(tmp_path / "ckpt-1"))
    e, b, c, u = restored
    assert isinstance(e, EarlyStopping) and e is not fresh[0]
    assert (e.patience, e.limit, e.counter, e.best) == (5, 5, 2, 0.25)
    assert isinstance(b, BestCheckpoints) and (b.k, b.best) == (
        3,
        [[0.9, "ckpt-3"], [0.8, "ckpt-1"]],
    )
    assert isinstance(c, Counter) and (c.start, c.count) == (2, 7)
    assert isinstance(u, Custom) and (u.value, u.via) == (40, "from_state")
    assert report.restored == event.keys and report.warnings == ()
    assert report.run_id == "run" and report.checkpoint == str(tmp_path / "ckpt-1")


def test_every_stateful_callback_snapshotted_at_every_save_hf_refreshed_only_one(
    tmp_path: Path,
) -> None:
    callbacks = [EarlyStopping(), BestCheckpoints("loss"), BestCheckpoints("acc"), Counter()]
    store = StateStore(tmp_path)
    store.register(callbacks)
    for step in range(1, 4):
        for cb in callbacks:
            if isinstance(cb, EarlyStopping):
                cb.counter = step
            elif isinstance(cb, BestCheckpoints):
                cb.best = [[step, f"ckpt-{step}"]]
            elif isinstance(cb, Counter):
                cb.count = step
        store.snapshot(str(tmp_path / f"ckpt-{step}"))
    for step in range(1, 4):
        states = store.load(str(tmp_path / f"ckpt-{step}")).states
        assert len(states) == 4
        assert states[key(EarlyStopping)]["attributes"]["counter"] == step
        assert states[key(BestCheckpoints, "loss")]["attributes"]["best"] == [
            [step, f"ckpt-{step}"]
        ]
        assert states[key(BestCheckpoints, "acc")]["attributes"]["best"] == [[step, f"ckpt-{step}"]]
        assert states[key(Counter)]["attributes"]["count"] == step


def test_repeated_save_of_one_checkpoint_replaces_not_appends_hf_list_grew(tmp_path: Path) -> None:
    callbacks = [BestCheckpoints("loss"), BestCheckpoints("acc")]
    store = StateStore(tmp_path)
    store.register(callbacks)
    for round_ in range(3):
        callbacks[0].best = [[round_, "x"]]
        store.snapshot(str(tmp_path / "ckpt"))
    snapshot = store.load(str(tmp_path / "ckpt"))
    assert list(snapshot.states) == [key(BestCheckpoints, "loss"), key(BestCheckpoints, "acc")]
    assert snapshot.states[key(BestCheckpoints, "loss")]["attributes"]["best"] == [[2, "x"]]
    assert len(saved(store, str(tmp_path / "ckpt"))["states"]) == 2


def test_a_callback_dropped_since_the_last_save_is_not_kept_in_the_replaced_snapshot(
    tmp_path: Path,
) -> None:
    store = StateStore(tmp_path)
    store.register([Counter(), EarlyStopping()])
    store.snapshot(str(tmp_path / "ckpt"))
    store.register([EarlyStopping()])
    store.snapshot(str(tmp_path / "ckpt"))
    assert list(store.load(str(tmp_path / "ckpt")).states) == [key(EarlyStopping)]


def test_snapshot_is_a_copy_not_a_view_of_live_state(tmp_path: Path) -> None:
    best = BestCheckpoints()
    best.best = [[1, "a"]]
    store = StateStore(tmp_path)
    store.register([best])
    store.snapshot(str(tmp_path / "ckpt"))
    best.best.append([2, "b"])
    assert store.load(str(tmp_path / "ckpt")).states[key(BestCheckpoints, "loss")]["attributes"][
        "best"
    ] == [[1, "a"]]


@pytest.mark.parametrize(
    ("payload", "problem"),
    [
        ({1, 2}, "attributes.best[2]: set is not a JSON value"),
        (TensorLike(), f"attributes.best[2]: {__name__}.TensorLike is not a JSON value"),
        (math.nan, "attributes.best[2]: nan is not a JSON number"),
        (math.inf, "attributes.best[2]: inf is not a JSON number"),
        ((1, 2), "attributes.best[2]: tuple is not a JSON value (use a list)"),
        ({"ok": [{3: "x"}]}, r"attributes.best[2].ok[0]: key 3 (int) is not a str"),
        ({"a key": b"raw"}, "attributes.best[2]['a key']: bytes is not a JSON value"),
    ],
)
def test_non_json_state_reported_with_its_path_and_other_states_still_written(
    tmp_path: Path, payload: Any, problem: str
) -> None:
    store = StateStore(tmp_path)
    counter = Counter(4)
    store.register([EarlyStopping(), Bad(payload), counter])
    with capture_logs() as logs:
        event = store.snapshot(str(tmp_path / "ckpt"))
    assert list(event.errors) == [key(Bad)]
    assert event.errors[key(Bad)].startswith(problem)
    assert event.keys == (key(EarlyStopping), key(Counter))
    snapshot = store.load(str(tmp_path / "ckpt"))
    assert list(snapshot.states) == [key(EarlyStopping), key(Counter)]
    assert snapshot.errors == event.errors
    assert [log["event"] for log in logs] == ["callback states not saved"]


class Level(enum.IntEnum):
    LOW = 1


def test_value_equal_stand_ins_are_accepted_and_come_back_plain(tmp_path: Path) -> None:
    """The rule is "comes back equal": an IntEnum or a big int passes, as itself in value."""
    store = StateStore(tmp_path)
    store.register([Bad({"level": Level.LOW, "big": 2**70, "nested": {"ok": [None, True, -0.5]}})])
    assert store.snapshot(str(tmp_path / "ckpt")).errors == {}
    best = store.load(str(tmp_path / "ckpt")).states[key(Bad)]["attributes"]["best"]
    assert best[2] == {"level": 1, "big": 2**70, "nested": {"ok": [None, True, -0.5]}}
    assert type(best[2]["level"]) is int


def test_state_that_contains_itself_is_reported_not_a_recursion_error(tmp_path: Path) -> None:
    loop: list[Any] = []
    loop.append(loop)
    store = StateStore(tmp_path)
    store.register([Bad(loop)])
    assert (
        store.snapshot(str(tmp_path / "ckpt")).errors[key(Bad)]
        == "attributes.best[2][0]: list contains itself"
    )


def test_state_method_that_raises_is_reported_and_others_still_written(tmp_path: Path) -> None:
    store = StateStore(tmp_path)
    store.register([Raises(), Counter()])
    event = store.snapshot(str(tmp_path / "ckpt"))
    assert event.errors == {key(Raises): "state() raised RuntimeError: cannot read my state"}
    assert list(store.load(str(tmp_path / "ckpt")).states) == [key(Counter)]


@pytest.mark.parametrize(
    ("state", "problem"),
    [
        (["args"], "state() must return a dict"),
        ({"args": {}}, "attributes: must be a dict"),
        ({"args": [], "attributes": {}}, "args: must be a dict"),
        ({"args": {}, "attributes": {}, "extra": 1}, "unexpected key 'extra'"),
    ],
)
def test_state_of_the_wrong_shape_is_reported(tmp_path: Path, state: Any, problem: str) -> None:
    class Shaped:
        def state(self) -> Any:
            return state

    store = StateStore(tmp_path)
    store.register([Shaped()])
    assert problem in store.snapshot(str(tmp_path / "ckpt")).errors[key(Shaped)]


def test_state_written_before_a_bad_one_is_unaffected_by_it(tmp_path: Path) -> None:
    """The snapshot holds copies: one bad state cannot leave a half-copied neighbour."""
    store = StateStore(tmp_path)
    store.register([Bad({"fine": [1, 2, 3], "bad": {1}}), Counter(9)])
    event = store.snapshot(str(tmp_path / "ckpt"))
    assert event.errors[key(Bad)].startswith("attributes.best[2].bad: set")
    assert store.load(str(tmp_path / "ckpt")).states[key(Counter)]["attributes"] == {"count": 9}


# --- restore ---------------------------------------------------------------------


def test_restore_keeps_callback_order_hf_reappended_at_the_end(tmp_path: Path) -> None:
    store = StateStore(tmp_path)
    store.register([EarlyStopping(), Counter(), BestCheckpoints("acc")])
    store.snapshot(str(tmp_path / "ckpt"))

    plain_a, plain_b = Plain(), Plain()
    live = [plain_a, BestCheckpoints("acc"), plain_b, Counter(), EarlyStopping()]
    restored, _ = store.restore(live, str(tmp_path / "ckpt"))
    assert [type(cb) for cb in restored] == [Plain, BestCheckpoints, Plain, Counter, EarlyStopping]
    assert restored[0] is plain_a and restored[2] is plain_b
    assert all(new is not old for new, old in zip(restored[1::2], live[1::2], strict=True))
    assert live[1] is not restored[1]  # the input list is left alone
    assert store.keys == (key(BestCheckpoints, "acc"), key(Counter), key(EarlyStopping))


def test_restored_instances_are_the_ones_snapshotted_afterwards(tmp_path: Path) -> None:
    store = StateStore(tmp_path)
    store.register([Counter(1)])
    store.snapshot(str(tmp_path / "ckpt-1"))
    restored, _ = store.restore([Counter()], str(tmp_path / "ckpt-1"))
    assert isinstance(restored[0], Counter)
    restored[0].count = 42
    store.snapshot(str(tmp_path / "ckpt-2"))
    assert store.load(str(tmp_path / "ckpt-2")).states[key(Counter)]["attributes"]["count"] == 42


def test_count_mismatch_flagged_never_silently_truncated_hf_zip(tmp_path: Path) -> None:
    store = StateStore(tmp_path)
    store.register([BestCheckpoints("loss"), BestCheckpoints("acc"), BestCheckpoints("f1")])
    store.snapshot(str(tmp_path / "ckpt"))
    with capture_logs() as logs:
        restored, report = store.restore(
            [BestCheckpoints("loss"), BestCheckpoints("acc")], str(tmp_path / "ckpt")
        )
    assert len(restored) == 2
    assert report.missing == (key(BestCheckpoints, "f1"),)
    assert report.mismatched == (f"{key(BestCheckpoints)}: 3 saved, 2 live",)
    assert any("instance counts differ" in w for w in report.warnings)
    assert logs[0]["log_level"] == "warning" and logs[0]["problems"] == report.warnings


def test_warns_both_ways_saved_but_missing_and_live_but_unsaved_hf_gave_no_warning(
    tmp_path: Path,
) -> None:
    store = StateStore(tmp_path)
    store.register([EarlyStopping(), Counter()])
    store.snapshot(str(tmp_path / "ckpt"))
    live = [EarlyStopping(), BestCheckpoints()]
    with capture_logs() as logs:
        restored, report = store.restore(live, str(tmp_path / "ckpt"))
    assert isinstance(report, StateRestored)
    assert report.restored == (key(EarlyStopping),)
    assert report.missing == (key(Counter),)
    assert report.unsaved == (key(BestCheckpoints, "loss"),)
    assert report.mismatched == ()
    assert len(report.warnings) == 2
    assert key(Counter) in report.warnings[0] and key(BestCheckpoints, "loss") in report.warnings[1]
    assert restored[1] is live[1]  # unsaved: kept as it is
    assert len(logs) == 1 and logs[0]["event"] == "callback state restore mismatch"


def test_live_callback_whose_state_failed_to_save_is_unsaved_with_the_reason(
    tmp_path: Path,
) -> None:
    store = StateStore(tmp_path)
    store.register([Bad({1})])
    store.snapshot(str(tmp_path / "ckpt"))
    _, report = store.restore([Bad()], str(tmp_path / "ckpt"))
    assert report.unsaved == (key(Bad),)
    assert "could not be saved: attributes.best[2]: set" in report.warnings[0]


@pytest.mark.parametrize(
    "live",
    [
        [EarlyStopping()],  # saved Counter missing
        [EarlyStopping(), Counter(), BestCheckpoints()],  # BestCheckpoints unsaved
    ],
)
def test_strict_mode_raises_instead_of_warning_and_changes_nothing(
    tmp_path: Path, live: list[object]
) -> None:
    store = StateStore(tmp_path, strict=True)
    store.register([EarlyStopping(), Counter()])
    store.snapshot(str(tmp_path / "ckpt"))
    with pytest.raises(StateRestoreError, match="ckpt"):
        store.restore(live, str(tmp_path / "ckpt"))
    assert store.keys == (key(EarlyStopping), key(Counter))


def test_strict_mode_accepts_an_exact_match(tmp_path: Path) -> None:
    store = StateStore(tmp_path, strict=True)
    store.register([EarlyStopping(patience=9)])
    store.snapshot(str(tmp_path / "ckpt"))
    restored, report = store.restore([EarlyStopping()], str(tmp_path / "ckpt"))
    assert isinstance(restored[0], EarlyStopping) and restored[0].limit == 9
    assert report.warnings == ()


def test_rebuild_failure_keeps_the_live_callback_and_warns_or_raises_when_strict(
    tmp_path: Path,
) -> None:
    snapshot = Snapshot(
        checkpoint="c",
        states={key(Validated): {"args": {"k": 0}, "attributes": {}}},
    )
    live = Validated(3)
    restored, report = StateStore(tmp_path).restore([live], snapshot)
    assert restored[0] is live and report.restored == ()
    assert (
        "could not rebuild" in report.warnings[0] and "k must be at least 1" in report.warnings[0]
    )
    with pytest.raises(StateRestoreError, match="could not rebuild"):
        StateStore(tmp_path, strict=True).restore([Validated()], snapshot)


class _Unprintable(Exception):
    def __str__(self) -> str:
        raise RuntimeError("__str__ fails too")


class RebuildsBadly(StatefulCallback):
    """``__init__`` raises an exception that cannot even be printed."""

    state_args = ("n",)

    def __init__(self, n: int = 0) -> None:
        if n < 0:
            raise _Unprintable
        self.n = n


def test_a_rebuild_raising_an_unprintable_exception_is_reported_not_raised(
    tmp_path: Path,
) -> None:
    snapshot = Snapshot(
        checkpoint="c", states={key(RebuildsBadly): {"args": {"n": -1}, "attributes": {}}}
    )
    live = RebuildsBadly(2)
    restored, report = StateStore(tmp_path).restore([live], snapshot)
    assert restored[0] is live and report.restored == ()
    assert "could not rebuild" in report.warnings[0] and "_Unprintable" in report.warnings[0]
    with pytest.raises(StateRestoreError, match="_Unprintable"):
        StateStore(tmp_path, strict=True).restore([RebuildsBadly()], snapshot)


def test_restore_rejects_duplicate_live_keys(tmp_path: Path) -> None:
    with pytest.raises(StateKeyConflict):
        StateStore(tmp_path).restore([Counter(), Counter()], Snapshot())


def test_load_of_a_missing_snapshot_is_file_not_found(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        StateStore(tmp_path).load(str(tmp_path / "never-saved"))


def test_resume_from_a_checkpoint_without_snapshot_warns_every_callback_starts_fresh(
    tmp_path: Path,
) -> None:
    live = [Counter(3), Plain()]
    restored, report = StateStore(tmp_path).restore(live, str(tmp_path / "old-checkpoint"))
    assert restored == live
    assert report.unsaved == (key(Counter),) and report.restored == ()
    assert report.warnings[0].startswith("no callback state snapshot at")
    with pytest.raises(StateRestoreError, match="no callback state snapshot"):
        StateStore(tmp_path, strict=True).restore(live, str(tmp_path / "old-checkpoint"))


def test_load_rejects_a_newer_format_and_malformed_files_naming_the_file(tmp_path: Path) -> None:
    store = StateStore(tmp_path)
    path = store.path_of(str(tmp_path / "ckpt"))
    path.parent.mkdir()
    path.write_text('{"format": 99, "states": {}}')
    with pytest.raises(StateFormatError, match="format 99"):
        store.load(str(tmp_path / "ckpt"))
    path.write_text('{"format": 1, "states": []}')
    with pytest.raises(StateFormatError, match=r"callback_state.json.*states"):
        store.load(str(tmp_path / "ckpt"))
    path.write_text("{trunc")
    with pytest.raises(StateFormatError, match="not a callback state snapshot"):
        store.load(str(tmp_path / "ckpt"))


# --- on the bus --------------------------------------------------------------------


@pytest.mark.anyio
async def test_attached_store_snapshots_after_the_other_checkpoint_handlers(tmp_path: Path) -> None:
    early = EarlyStopping()
    store = StateStore(tmp_path)
    store.register([early])
    events: list[StateSnapshotted] = []
    async with EventBus() as bus:
        store.attach(bus)
        bus.subscribe(StateSnapshotted, events.append)

        def count_checkpoint(event: CheckpointSaved) -> None:
            early.counter = event.index  # subscribed later, yet runs before the store

        bus.subscribe(CheckpointSaved, count_checkpoint)
        for index in (1, 2):
            await bus.publish(
                CheckpointSaved(run_id="r", checkpoint=str(tmp_path / f"ckpt-{index}"), index=index)
            )
            await bus.wait_idle()
    assert [e.checkpoint for e in events] == [str(tmp_path / "ckpt-1"), str(tmp_path / "ckpt-2")]
    assert all(e.keys == (key(EarlyStopping),) and e.error == "" for e in events)
    for index in (1, 2):
        assert (
            store.load(str(tmp_path / f"ckpt-{index}")).states[key(EarlyStopping)]["attributes"][
                "counter"
            ]
            == index
        )
        assert store.load(str(tmp_path / f"ckpt-{index}")).run_id == "r"


@pytest.mark.anyio
async def test_attached_store_never_raises_into_the_bus_errors_go_in_the_event(
    tmp_path: Path,
) -> None:
    store = StateStore(tmp_path)
    store.register([Bad({1}), Counter()])
    events: list[StateSnapshotted] = []
    failures: list[HandlerFailed] = []
    async with EventBus(buffer=1) as bus:
        store.attach(bus)
        bus.subscribe(StateSnapshotted, events.append)
        bus.subscribe(HandlerFailed, failures.append)
        await bus.publish(CheckpointSaved(run_id="r", checkpoint="../outside", index=1))
        await bus.publish(CheckpointSaved(run_id="r", checkpoint=str(tmp_path / "ckpt"), index=2))
        await bus.wait_idle()
    assert failures == []
    outside, good = events
    assert outside.path == "" and "outside the state root" in outside.error
    assert good.error == "" and list(good.errors) == [key(Bad)] and good.keys == (key(Counter),)
    assert not (tmp_path.parent / "outside").exists()


@pytest.mark.anyio
async def test_snapshot_of_a_checkpoint_excludes_the_next_back_to_back_checkpoint(
    tmp_path: Path,
) -> None:
    early = EarlyStopping()
    store = StateStore(tmp_path)
    store.register([early])
    async with EventBus() as bus:
        store.attach(bus)
        bus.subscribe(CheckpointSaved, lambda event: setattr(early, "counter", event.index))
        bus.publish_nowait(
            CheckpointSaved(run_id="r", checkpoint=str(tmp_path / "ckpt-1"), index=1)
        )
        bus.publish_nowait(
            CheckpointSaved(run_id="r", checkpoint=str(tmp_path / "ckpt-2"), index=2)
        )
        await bus.wait_idle()
    assert (
        store.load(str(tmp_path / "ckpt-1")).states[key(EarlyStopping)]["attributes"]["counter"]
        == 1
    )


def test_built_in_stateful_callbacks_round_trip(tmp_path: Path) -> None:
    """Early stopping and best-checkpoint tracking (``handlers``) continue across a resume."""
    early = BuiltinEarly("val_loss", patience=4, threshold=0.01)
    early.best, early.wait, early.rounds = 0.25, 2, 7
    best_loss, best_acc = BuiltinBest("val_loss", k=2), BuiltinBest("acc", k=3, mode="max")
    best_loss.top = [[0.25, "ckpt-7"], [0.5, "ckpt-3"]]
    best_acc.top = [[0.9, "ckpt-5"]]
    store = StateStore(tmp_path)
    store.register([early, best_loss, best_acc])
    assert store.snapshot(str(tmp_path / "ckpt-7")).errors == {}

    fresh = [
        BuiltinEarly("val_loss"),
        BuiltinBest("val_loss", k=2),
        BuiltinBest("acc", k=3, mode="max"),
    ]
    restored, report = StateStore(tmp_path, strict=True).restore(fresh, str(tmp_path / "ckpt-7"))
    assert report.warnings == () and len(report.restored) == 3
    for old, new in zip([early, best_loss, best_acc], restored, strict=True):
        assert type(new) is type(old) and new is not old
        assert new.state() == old.state()  # type: ignore[attr-defined]
