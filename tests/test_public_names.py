"""Public names and everything that reaches a file: stable across moves of private modules.

State keys and the event types a log header lists come from public names
(a class's stable ``state_name``, an event's public package), so moving a
private module changes nothing on disk; snapshots written by earlier
versions, kept in ``tests/data/snapshots``, still restore. (That each public
name has one home is ``test_layout``'s.)
"""

from __future__ import annotations

import importlib
import json
import shutil
import sys
import textwrap
import types
from pathlib import Path

import pytest

from eventbus._public import is_private_module
from eventbus.log import LogRecorder, read_log
from eventbus.state import StateStore
from eventbus.state._model import state_key_of
from handlers import BestCheckpoints, EarlyStopping

DATA = Path(__file__).parent / "data"


# --- state keys ------------------------------------------------------------------------------


def test_the_state_keys_of_our_stateful_callbacks_are_their_public_names() -> None:
    from adapters.cli._demo_trainer import FinalLoss

    assert state_key_of(EarlyStopping(metric="loss")) == (
        "handlers.EarlyStopping[EarlyStopping(metric='loss', mode='min')]"
    )
    assert state_key_of(BestCheckpoints(metric="loss", k=3)) == (
        "handlers.BestCheckpoints[BestCheckpoints(metric='loss', mode='min', k=3)]"
    )
    assert state_key_of(FinalLoss()) == "eventbus.demo.FinalLoss"


SNAPSHOTS = sorted(path.name for path in (DATA / "snapshots").iterdir())


@pytest.mark.parametrize("written_by", SNAPSHOTS)
def test_snapshots_written_by_earlier_versions_restore_into_the_builtins(
    tmp_path: Path, written_by: str
) -> None:
    """``before-0.2-builtins-moved``: keys ``handlers._early_stopping...``;
    ``0.2-private-modules``: keys ``handlers.builtins._early_stopping...``."""
    source = DATA / "snapshots" / written_by / "callback_state.json"
    saved = json.loads(source.read_text())["states"]
    checkpoint = tmp_path / "checkpoint_000060"
    checkpoint.mkdir()
    shutil.copy(source, checkpoint / "callback_state.json")
    early = EarlyStopping(metric="loss", patience=20)
    best = BestCheckpoints(metric="loss", k=3)
    _, report = StateStore(tmp_path).restore([early, best], checkpoint, in_place=True)

    [saved_early] = [v for k, v in saved.items() if "EarlyStopping" in k]
    [saved_best] = [v for k, v in saved.items() if "BestCheckpoints" in k]
    assert early.best == saved_early["attributes"]["best"]
    assert early.wait == saved_early["attributes"]["wait"]
    assert [list(entry) for entry in best.top] == saved_best["attributes"]["top"]
    assert set(report.restored) == {state_key_of(early), state_key_of(best)}
    dropped = [key for key in report.missing if "FinalLoss" not in key]
    assert not dropped and not report.unsaved


def test_a_snapshot_of_the_demos_own_callback_restores_under_its_stable_name(
    tmp_path: Path,
) -> None:
    from adapters.cli._demo_trainer import FinalLoss

    source = DATA / "snapshots" / "0.2-private-modules" / "callback_state.json"
    checkpoint = tmp_path / "checkpoint_000060"
    checkpoint.mkdir()
    shutil.copy(source, checkpoint / "callback_state.json")
    final = FinalLoss()
    _, report = StateStore(tmp_path).restore([final], checkpoint, in_place=True)
    assert report.restored == ("eventbus.demo.FinalLoss",)
    assert (
        final.loss
        == json.loads(source.read_text())["states"]["adapters.cli._demo_trainer.FinalLoss"][
            "attributes"
        ]["loss"]
    )


def _module_defining(name: str, tmp_path: Path, body: str) -> types.ModuleType:
    tmp_path.mkdir(parents=True, exist_ok=True)
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(body))
    sys.path.insert(0, str(tmp_path))
    try:
        return importlib.import_module(name)
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop(name, None)


STABLE_CLASS = """
from eventbus import StatefulCallback

class Trend(StatefulCallback, state_name="mytraining.Trend"):
    state_attributes = ("seen",)

    def __init__(self) -> None:
        self.seen = 0
"""


def test_a_class_with_a_state_name_keeps_its_states_when_it_moves(tmp_path: Path) -> None:
    before = _module_defining("old_place", tmp_path / "a", STABLE_CLASS)
    after = _module_defining("new_place", tmp_path / "b", STABLE_CLASS)
    saved = before.Trend()
    saved.seen = 7
    store = StateStore(tmp_path / "run")
    store.register([saved])
    store.snapshot(str(tmp_path / "run" / "checkpoint_1"))
    live = after.Trend()
    _, report = StateStore(tmp_path / "run").restore(
        [live], tmp_path / "run" / "checkpoint_1", in_place=True
    )
    assert state_key_of(live) == state_key_of(saved) == "mytraining.Trend"
    assert live.seen == 7 and report.restored == ("mytraining.Trend",)


def test_a_state_name_is_not_inherited(tmp_path: Path) -> None:
    module = _module_defining(
        "with_subclass",
        tmp_path,
        STABLE_CLASS + "\n\nclass FasterTrend(Trend):\n    pass\n",
    )
    assert state_key_of(module.FasterTrend()) == "with_subclass.FasterTrend"


def test_a_state_name_that_is_no_dotted_name_fails_where_the_class_is_defined() -> None:
    from eventbus import StatefulCallback

    with pytest.raises(TypeError, match="dotted name"):

        class Bad(StatefulCallback, state_name="not a name[0]"):
            pass


# --- event logs -------------------------------------------------------------------------------


def test_the_event_types_a_log_header_lists_are_public_and_as_recorded_before(
    tmp_path: Path,
) -> None:
    """The header's tag -> module map, against ``tests/data/log_event_types.json``.

    A new event type extends the file (add it there); a module of an existing type
    changing is a change of the log format and fails here."""
    path = tmp_path / "run.evlog"
    with LogRecorder(path, run_id="r"):
        pass
    recorded = read_log(path).header.event_types
    ours = {tag: module for tag, module in recorded.items() if module.split(".")[0] in OURS}
    expected = json.loads((DATA / "log_event_types.json").read_text())
    assert ours == expected
    assert not [module for module in ours.values() if is_private_module(module)]


OURS = {"eventbus", "handlers", "adapters"}
