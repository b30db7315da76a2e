"""Resuming callbacks: restoring onto the user's own objects, requiring a snapshot, and
keys that survive a class moving between a script (``__main__``) and a module.

Each test is named after what a resumed run would get wrong without it.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from _builders import Custom
from structlog.testing import capture_logs

from eventbus import StatefulCallback
from eventbus.state import StateRestoreError, StateStore
from eventbus.state._model import CallbackState


class EarlyStopping(StatefulCallback):
    """``__init__`` derives ``limit`` from its args: a restore must run it."""

    state_args = ("patience",)
    state_attributes = ("counter", "best")

    def __init__(self, patience: int = 3) -> None:
        self.patience = patience
        self.limit = patience * 2
        self.counter = 0
        self.best: float | None = None


class Slotted:
    """Keeps its state in ``__slots__``: there is no ``__dict__`` to update."""

    __slots__ = ("count", "start")

    def __init__(self, start: int = 0) -> None:
        self.start = start
        self.count = start

    def state(self) -> CallbackState:
        return {"args": {"start": self.start}, "attributes": {"count": self.count}}


class Parent(Custom):
    """A ``from_state`` that returns a subclass: its class cannot be moved onto the live one."""

    @classmethod
    def from_state(cls, state: CallbackState) -> Custom:
        instance = Special()
        instance.value = state["attributes"]["value"]
        return instance


class Special(Parent):
    """What ``Parent.from_state`` returns instead of a plain ``Parent``."""


class Validated(StatefulCallback):
    """``__init__`` refuses some values: a saved state can make the rebuild fail."""

    state_args = ("k",)

    def __init__(self, k: int = 1) -> None:
        if k < 1:
            raise ValueError(f"k must be at least 1, got {k}")
        self.k = k


class TrendBase(StatefulCallback):
    """Base of the ``LossTrend`` classes built per module by ``trend``."""

    state_args = ("metric",)
    state_attributes = ("values",)

    def __init__(self, metric: str = "loss") -> None:
        self.metric = metric
        self.values: list[float] = []


class KeyedTrendBase(TrendBase):
    """Several instances per run, told apart by ``state_key``."""

    @property
    def state_key(self) -> str:
        return self.metric


def trend(module: str, *, keyed: bool = False, qualname: str = "LossTrend") -> type[TrendBase]:
    """A ``LossTrend`` class as defined in ``module`` (``"__main__"`` for a script)."""
    base = KeyedTrendBase if keyed else TrendBase
    name = qualname.rsplit(".", 1)[-1]
    return type(name, (base,), {"__module__": module, "__qualname__": qualname})


def key(cls: type, suffix: str | None = None) -> str:
    name = f"{cls.__module__}.{cls.__qualname__}"
    return name if suffix is None else f"{name}[{suffix}]"


def values(callbacks: Sequence[object]) -> list[list[float]]:
    assert all(isinstance(cb, TrendBase) for cb in callbacks)
    return [cb.values for cb in callbacks if isinstance(cb, TrendBase)]


def save(tmp_path: Path, callbacks: list[Any], name: str = "ckpt") -> str:
    checkpoint = tmp_path / name
    checkpoint.mkdir(exist_ok=True)
    store = StateStore(tmp_path)
    store.register(callbacks)
    store.snapshot(str(checkpoint))
    return str(checkpoint)


# --- restore in place ----------------------------------------------------------------


def test_in_place_restore_keeps_identity_so_the_users_reference_is_restored(
    tmp_path: Path,
) -> None:
    old = EarlyStopping(patience=5)
    old.counter, old.best = 2, 0.25
    checkpoint = save(tmp_path, [old, Custom()])

    early = EarlyStopping()
    callbacks: list[Any] = [early, Custom(), object()]
    store = StateStore(tmp_path)
    restored, report = store.restore(callbacks, checkpoint, in_place=True)
    assert all(restored[i] is callbacks[i] for i in range(3))
    assert (early.patience, early.counter, early.best) == (5, 2, 0.25)
    assert report.restored == (key(EarlyStopping), key(Custom)) and report.warnings == ()
    # What is registered is what was returned: later snapshots read the user's objects.
    early.counter = 4
    store.snapshot(checkpoint)
    assert store.load(checkpoint).states[key(EarlyStopping)]["attributes"]["counter"] == 4


def test_default_restore_still_returns_new_instances_leaving_the_given_ones_stale(
    tmp_path: Path,
) -> None:
    old = EarlyStopping(patience=5)
    old.counter = 2
    checkpoint = save(tmp_path, [old])
    early = EarlyStopping()
    restored, _ = StateStore(tmp_path).restore([early], checkpoint)
    assert restored[0] is not early and early.counter == 0


def test_in_place_applies_init_side_effects_of_args_and_keeps_extra_live_attributes(
    tmp_path: Path,
) -> None:
    old = EarlyStopping(patience=5)
    old.counter = 1
    checkpoint = save(tmp_path, [old])

    early = EarlyStopping(patience=1)
    early.limit = 99  # __init__(patience=5) sets it again: the rebuilt value wins
    vars(early)["seen_by_user"] = "kept"  # only the live object has it
    StateStore(tmp_path).restore([early], checkpoint, in_place=True)
    assert (early.patience, early.limit, early.counter) == (5, 10, 1)
    assert vars(early)["seen_by_user"] == "kept"


def test_in_place_with_the_class_own_from_state(tmp_path: Path) -> None:
    old = Custom()
    old.value = 4
    checkpoint = save(tmp_path, [old])
    custom = Custom()
    restored, report = StateStore(tmp_path).restore([custom], checkpoint, in_place=True)
    assert restored[0] is custom and (custom.value, custom.via) == (40, "from_state")
    assert report.warnings == ()


def test_in_place_slots_callback_is_replaced_and_the_warning_says_where_it_is(
    tmp_path: Path,
) -> None:
    old = Slotted(3)
    old.count = 7
    checkpoint = save(tmp_path, [old, EarlyStopping(patience=4)])

    slotted, early = Slotted(), EarlyStopping()
    with capture_logs() as logs:
        restored, report = StateStore(tmp_path).restore([slotted, early], checkpoint, in_place=True)
    assert restored[1] is early and early.patience == 4
    replaced = restored[0]
    assert isinstance(replaced, Slotted) and replaced is not slotted
    assert (replaced.start, replaced.count) == (3, 7) and slotted.count == 0
    assert report.restored == (key(Slotted), key(EarlyStopping))
    (warning,) = report.warnings
    assert warning.startswith(f"{key(Slotted)} could not be restored in place")
    assert "__slots__" in warning and "the run's `callbacks` list" in warning
    assert logs[-1]["log_level"] == "warning" and logs[-1]["problems"] == report.warnings


def test_in_place_from_state_returning_a_subclass_is_replaced_with_a_warning(
    tmp_path: Path,
) -> None:
    old = Parent()
    old.value = 2
    checkpoint = save(tmp_path, [old])
    parent = Parent()
    restored, report = StateStore(tmp_path).restore([parent], checkpoint, in_place=True)
    assert type(restored[0]) is Special and parent.value == 0
    (warning,) = report.warnings
    assert key(Parent) in warning and "returned a Special" in warning


def test_in_place_failed_rebuild_keeps_the_live_object_untouched(tmp_path: Path) -> None:
    checkpoint = tmp_path / "ckpt"
    checkpoint.mkdir()
    store = StateStore(tmp_path)
    bad = Validated()
    bad.k = 0  # saved as is; rebuilding with k=0 raises
    store.register([bad])
    store.snapshot(str(checkpoint))
    live = Validated(2)
    restored, report = StateStore(tmp_path).restore([live], str(checkpoint), in_place=True)
    assert restored[0] is live and live.k == 2
    assert report.restored == () and "could not rebuild" in report.warnings[0]


def test_in_place_strict_mismatch_raises_before_touching_any_object(tmp_path: Path) -> None:
    old = EarlyStopping(patience=5)
    old.counter = 3
    checkpoint = save(tmp_path, [old])
    early, extra = EarlyStopping(), Custom()
    with pytest.raises(StateRestoreError, match="has no saved state"):
        StateStore(tmp_path, strict=True).restore([early, extra], checkpoint, in_place=True)
    assert (early.patience, early.counter) == (3, 0)
    restored, report = StateStore(tmp_path, strict=True).restore([early], checkpoint, in_place=True)
    assert restored[0] is early and early.counter == 3 and report.warnings == ()


# --- a missing snapshot --------------------------------------------------------------


def test_require_snapshot_makes_a_missing_snapshot_an_error_naming_the_path(
    tmp_path: Path,
) -> None:
    old = tmp_path / "old-checkpoint"
    old.mkdir()
    with pytest.raises(StateRestoreError) as info:
        StateStore(tmp_path).restore([EarlyStopping()], str(old), require_snapshot=True)
    message = str(info.value)
    assert str(old / "callback_state.json") in message
    assert "resume from a checkpoint that has callback states" in message
    assert "allow starting them fresh" in message


def test_missing_snapshot_by_default_still_warns_and_every_callback_starts_fresh(
    tmp_path: Path,
) -> None:
    early = EarlyStopping()
    with capture_logs() as logs:
        restored, report = StateStore(tmp_path).restore(
            [early], str(tmp_path / "old"), in_place=True
        )
    assert restored == [early] and report.restored == ()
    assert report.warnings[0].startswith("no callback state snapshot at")
    assert logs[0]["log_level"] == "warning"


# --- a class moving between a script and a module ------------------------------------


@pytest.mark.parametrize(
    ("saved_in", "live_in"), [("__main__", "pkg.mod"), ("pkg.mod", "__main__")]
)
def test_state_survives_a_class_moving_between_main_and_its_module(
    tmp_path: Path, saved_in: str, live_in: str
) -> None:
    before, after = trend(saved_in), trend(live_in)
    old = before("acc")
    old.values = [0.5, 0.25]
    checkpoint = save(tmp_path, [old])

    live = after()
    with capture_logs() as logs:
        restored, report = StateStore(tmp_path, strict=True).restore([live], checkpoint)
    new = restored[0]
    assert type(new) is after and (new.metric, new.values) == ("acc", [0.5, 0.25])
    assert report.restored == (key(after),)  # listed under the live key
    assert report.missing == () and report.unsaved == () and report.mismatched == ()
    assert report.warnings == ()
    (line,) = logs
    assert line["log_level"] == "info"
    assert line["moved"] == [f"{key(before)} -> {key(after)}"]


def test_moved_class_with_state_keys_matches_each_instance_by_its_suffix(
    tmp_path: Path,
) -> None:
    before, after = trend("__main__", keyed=True), trend("pkg.mod", keyed=True)
    loss, acc = before("loss"), before("acc")
    loss.values, acc.values = [1.0], [2.0]
    checkpoint = save(tmp_path, [loss, acc])

    restored, report = StateStore(tmp_path).restore(
        [after("acc"), after("loss"), after("f1")], checkpoint, in_place=True
    )
    assert values(restored) == [[2.0], [1.0], []]
    assert report.restored == (key(after, "acc"), key(after, "loss"))
    assert report.unsaved == (key(after, "f1"),)
    # The pair counts as one class: 2 saved, 3 live of it, not two unrelated classes.
    assert report.mismatched == (f"{key(after)}: 2 saved, 3 live",)


def test_moved_class_counts_unmatched_saved_instances_under_the_live_class(
    tmp_path: Path,
) -> None:
    before, after = trend("__main__", keyed=True), trend("pkg.mod", keyed=True)
    checkpoint = save(tmp_path, [before("loss"), before("acc")])
    _, report = StateStore(tmp_path).restore([after("loss")], checkpoint)
    assert report.restored == (key(after, "loss"),)
    assert report.missing == (key(before, "acc"),)
    assert report.mismatched == (f"{key(after)}: 2 saved, 1 live",)


def test_a_different_state_key_or_qualname_is_not_a_move(tmp_path: Path) -> None:
    checkpoint = save(tmp_path, [trend("__main__", keyed=True)("loss")])
    _, report = StateStore(tmp_path).restore(
        [trend("pkg.mod", keyed=True)("acc"), trend("pkg.mod", qualname="Other")()],
        checkpoint,
    )
    assert report.restored == ()
    assert report.missing == ("__main__.LossTrend[loss]",)


def test_exact_key_wins_over_a_move(tmp_path: Path) -> None:
    in_main, in_module = trend("__main__"), trend("pkg.mod")
    a, b = in_main(), in_module()
    a.values, b.values = [1.0], [2.0]
    checkpoint = save(tmp_path, [a, b])
    restored, report = StateStore(tmp_path).restore([in_module()], checkpoint)
    assert values(restored) == [[2.0]]
    assert report.missing == (key(in_main),)


def test_ambiguous_move_from_main_is_warned_and_not_matched(tmp_path: Path) -> None:
    before = trend("__main__")
    old = before()
    old.values = [1.0]
    checkpoint = save(tmp_path, [old])
    a, b = trend("a"), trend("b")

    with pytest.raises(StateRestoreError, match="several match"):
        StateStore(tmp_path, strict=True).restore([a(), b()], checkpoint)
    restored, report = StateStore(tmp_path).restore([a(), b()], checkpoint)
    assert values(restored) == [[], []]
    assert report.restored == () and report.missing == (key(before),)
    assert report.unsaved == (key(a), key(b))
    (note,) = [w for w in report.warnings if "several match" in w]
    assert note.startswith(f"saved state {key(before)} could belong to any of")
    assert key(a) in note and key(b) in note and note.endswith("not matched")


def test_ambiguous_move_into_main_is_warned_and_not_matched(tmp_path: Path) -> None:
    a, b = trend("a"), trend("b")
    checkpoint = save(tmp_path, [a(), b()])
    after = trend("__main__")
    _, report = StateStore(tmp_path).restore([after()], checkpoint)
    assert report.restored == () and report.missing == (key(a), key(b))
    (note,) = [w for w in report.warnings if "several match" in w]
    assert note.startswith(f"live callback {key(after)} could take any of")
    assert key(a) in note and key(b) in note


def test_nested_class_moving_into_main_keeps_its_qualname(tmp_path: Path) -> None:
    before = trend("pkg.mod", qualname="Outer.LossTrend")
    old = before()
    old.values = [3.0]
    checkpoint = save(tmp_path, [old])
    after, flat = trend("__main__", qualname="Outer.LossTrend"), trend("__main__")
    restored, report = StateStore(tmp_path).restore([flat(), after()], checkpoint)
    # "pkg.mod.Outer.LossTrend" could also be module "pkg.mod.Outer": ambiguous, not guessed.
    assert report.restored == ()
    assert any("several match" in w for w in report.warnings)
    restored, report = StateStore(tmp_path).restore([after()], checkpoint)
    assert values(restored) == [[3.0]]
    assert report.restored == (key(after),)
