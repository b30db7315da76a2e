"""Hugging Face interop: ``stateful_callbacks`` of ``trainer_state.json``, both directions.

The fixtures are written by hand the way HF writes the file
(``json.dumps(asdict(state), indent=2, sort_keys=True) + "\\n"``), NaN in
``log_history`` included, and must come back byte for byte.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from structlog.testing import capture_logs

from adapters._hf_state import read_hf_trainer_state, write_hf_trainer_state

# The format needs no transformers: importing it from the adapter does not import them.
from adapters.transformers import from_hf_callbacks, to_hf_callbacks
from eventbus.state import StateRestoreError, StateStore
from eventbus.state._model import CallbackState, Snapshot, StateFormatError


class EarlyStoppingCallback:
    """HF's early stopping state, as ``transformers`` writes it."""

    def __init__(
        self, early_stopping_patience: int = 1, early_stopping_threshold: float = 0.0
    ) -> None:
        self.early_stopping_patience = early_stopping_patience
        self.early_stopping_threshold = early_stopping_threshold
        self.early_stopping_patience_counter = 0

    def state(self) -> CallbackState:
        return {
            "args": {
                "early_stopping_patience": self.early_stopping_patience,
                "early_stopping_threshold": self.early_stopping_threshold,
            },
            "attributes": {"early_stopping_patience_counter": self.early_stopping_patience_counter},
        }


class TrainerControl:
    def __init__(self, **flags: bool) -> None:
        self.flags = {
            name: flags.get(name, False)
            for name in (
                "should_epoch_stop",
                "should_evaluate",
                "should_log",
                "should_save",
                "should_training_stop",
            )
        }

    def state(self) -> CallbackState:
        return {"args": dict(self.flags), "attributes": {}}


class MetricSnapshot:
    """Several per run: our key tells them apart, HF's list form keeps them by position."""

    def __init__(self, metric: str = "loss") -> None:
        self.metric = metric
        self.best: float | None = None

    @property
    def state_key(self) -> str:
        return self.metric

    def state(self) -> CallbackState:
        return {"args": {"metric": self.metric}, "attributes": {"best": self.best}}


TRAINER_STATE = """\
{
  "best_global_step": null,
  "best_metric": null,
  "best_model_checkpoint": null,
  "epoch": 1.0,
  "eval_steps": 500,
  "global_step": 10,
  "is_hyper_param_search": false,
  "is_local_process_zero": true,
  "is_world_process_zero": true,
  "log_history": [
    {
      "epoch": 0.5,
      "grad_norm": NaN,
      "learning_rate": 2.5e-05,
      "loss": 1.2345,
      "step": 5
    }
  ],
  "logging_steps": 5,
  "max_steps": 10,
  "num_input_tokens_seen": 0,
  "num_train_epochs": 1,
  "save_steps": 500,
  "stateful_callbacks": {
    "EarlyStoppingCallback": {
      "args": {
        "early_stopping_patience": 3,
        "early_stopping_threshold": 0.0
      },
      "attributes": {
        "early_stopping_patience_counter": 2
      }
    },
    "MetricSnapshot": [
      {
        "args": {
          "metric": "loss"
        },
        "attributes": {
          "best": 0.25
        }
      },
      {
        "args": {
          "metric": "accuracy"
        },
        "attributes": {
          "best": 0.875
        }
      }
    ],
    "TrainerControl": {
      "args": {
        "should_epoch_stop": false,
        "should_evaluate": false,
        "should_log": false,
        "should_save": true,
        "should_training_stop": false
      },
      "attributes": {}
    }
  },
  "total_flos": 1.2345e+16,
  "train_batch_size": 8,
  "trial_name": null,
  "trial_params": null
}
"""


def fixture(tmp_path: Path, text: str = TRAINER_STATE, name: str = "trainer_state.json") -> Path:
    path = tmp_path / "checkpoint-10" / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


def test_hf_fixture_read_and_written_back_byte_for_byte(tmp_path: Path) -> None:
    path = fixture(tmp_path)
    snapshot = read_hf_trainer_state(path)
    assert snapshot.keyed_by == "class_name"
    assert list(snapshot.states) == [
        "EarlyStoppingCallback",
        "MetricSnapshot[0]",
        "MetricSnapshot[1]",
        "TrainerControl",
    ]
    # Written into a copy whose section was emptied: the result is the original file.
    copy = fixture(tmp_path, TRAINER_STATE, "copy.json")
    document = json.loads(copy.read_text())
    document["stateful_callbacks"] = {}
    copy.write_text(json.dumps(document, indent=2, sort_keys=True) + "\n")
    write_hf_trainer_state(copy, snapshot)
    assert copy.read_text(encoding="utf-8") == TRAINER_STATE


def test_hf_states_restored_into_live_callbacks_and_written_back_identically(
    tmp_path: Path,
) -> None:
    """The whole trip: HF file -> live callbacks (in our order) -> their states -> HF file."""
    path = fixture(tmp_path)
    live: list[object] = [
        TrainerControl(),
        MetricSnapshot("loss"),
        EarlyStoppingCallback(),
        MetricSnapshot("accuracy"),
    ]
    store = StateStore(tmp_path)
    restored, report = store.restore(live, read_hf_trainer_state(path))
    assert report.warnings == ()
    assert [type(cb).__name__ for cb in restored] == [
        "TrainerControl",
        "MetricSnapshot",
        "EarlyStoppingCallback",
        "MetricSnapshot",
    ]
    early = restored[2]
    assert isinstance(early, EarlyStoppingCallback)
    assert (early.early_stopping_patience, early.early_stopping_patience_counter) == (3, 2)
    # Our snapshot of them, turned back into HF's section, gives the same file. The
    # list form follows callback order, which here matches the saved one.
    store.snapshot(str(path.parent))
    path.write_text(TRAINER_STATE.replace('"should_save": true', '"should_save": false'))
    write_hf_trainer_state(path, store.load(path.parent))
    assert path.read_text(encoding="utf-8") == TRAINER_STATE


def test_our_keys_map_to_hf_class_names_with_the_list_form_for_several(tmp_path: Path) -> None:
    early = EarlyStoppingCallback(early_stopping_patience=4)
    loss, accuracy = MetricSnapshot("loss"), MetricSnapshot("accuracy")
    loss.best, accuracy.best = 0.5, 0.75
    store = StateStore(tmp_path)
    store.register([loss, early, accuracy])
    store.snapshot(str(tmp_path / "ckpt"))
    section = to_hf_callbacks(store.load(tmp_path / "ckpt"))
    assert list(section) == ["MetricSnapshot", "EarlyStoppingCallback"]
    assert section["MetricSnapshot"] == [
        {"args": {"metric": "loss"}, "attributes": {"best": 0.5}},
        {"args": {"metric": "accuracy"}, "attributes": {"best": 0.75}},
    ]
    assert section["EarlyStoppingCallback"] == early.state()


def test_hf_list_matched_by_position_count_mismatch_flagged_hf_zip_truncated(
    tmp_path: Path,
) -> None:
    section: dict[str, Any] = {
        "MetricSnapshot": [
            {"args": {"metric": m}, "attributes": {"best": b}}
            for m, b in (("loss", 0.1), ("accuracy", 0.9), ("f1", 0.5))
        ]
    }
    # More saved than live: the last ones are the latest (HF appends), the first is stale.
    restored, report = StateStore(tmp_path).restore(
        [MetricSnapshot("x"), MetricSnapshot("y")], from_hf_callbacks(section)
    )
    assert [cb.metric for cb in restored] == ["accuracy", "f1"]
    assert report.missing == ()
    assert report.mismatched == ("MetricSnapshot: 3 saved, 2 live",)
    assert any("ignored 1 earlier stale" in w for w in report.warnings)

    # Fewer saved than live: by position from the first, the rest flagged, never dropped.
    restored, report = StateStore(tmp_path).restore(
        [MetricSnapshot("a"), MetricSnapshot("b")],
        from_hf_callbacks({"MetricSnapshot": section["MetricSnapshot"][0]}),
    )
    assert [cb.metric for cb in restored] == ["loss", "b"]
    assert report.unsaved == (f"{__name__}.MetricSnapshot[b]",)
    assert report.mismatched == ("MetricSnapshot: 1 saved, 2 live",)


def grown_section(saves: int) -> dict[str, Any]:
    """``stateful_callbacks`` as HF leaves it after ``saves`` saves of two same-class
    callbacks: its list starts with their initial states and gets both appended on
    every save (``Trainer._save_checkpoint``), so it never shrinks."""
    entries = [
        {"args": {"metric": metric}, "attributes": {"best": None}} for metric in ("loss", "acc")
    ]
    for save in range(1, saves + 1):
        entries += [
            {"args": {"metric": "loss"}, "attributes": {"best": 1.0 / save}},
            {"args": {"metric": "acc"}, "attributes": {"best": save / 10}},
        ]
    return {
        "EarlyStoppingCallback": EarlyStoppingCallback(early_stopping_patience=3).state(),
        "MetricSnapshot": entries,
    }


def test_hf_list_that_grew_on_every_save_restores_the_latest_states_hf_took_the_first(
    tmp_path: Path,
) -> None:
    """Issue 22: 18 entries for 2 callbacks after 8 saves; HF (and we, by position from
    the start) restored the stale initial states. The last two are the latest save's."""
    section = grown_section(8)
    assert len(section["MetricSnapshot"]) == 18
    path = fixture(tmp_path, json.dumps({"stateful_callbacks": section}, indent=2))
    snapshot = read_hf_trainer_state(path)
    live: list[object] = [MetricSnapshot("loss"), EarlyStoppingCallback(), MetricSnapshot("acc")]
    with capture_logs() as logs:
        restored, report = StateStore(tmp_path).restore(live, snapshot)
    loss, early, acc = restored
    assert isinstance(loss, MetricSnapshot) and (loss.metric, loss.best) == ("loss", 1.0 / 8)
    assert isinstance(acc, MetricSnapshot) and (acc.metric, acc.best) == ("acc", 0.8)
    assert isinstance(early, EarlyStoppingCallback) and early.early_stopping_patience == 3
    assert len(report.restored) == 3 and report.missing == () and report.unsaved == ()
    (stale,) = [w for w in report.warnings if "stale" in w]
    assert stale.startswith("MetricSnapshot: 18 saved states for 2 live callback(s)")
    assert "took the last 2, ignored 16 earlier stale" in stale
    assert logs[0]["problems"] == report.warnings
    # Strict mode treats the stale entries as any other mismatch: it raises, naming them.
    with pytest.raises(StateRestoreError, match="ignored 16 earlier stale"):
        StateStore(tmp_path, strict=True).restore(live, snapshot)
    # One live instance takes the very last entry.
    restored, _ = StateStore(tmp_path).restore([MetricSnapshot("acc")], snapshot)
    assert restored[0].best == 0.8  # type: ignore[attr-defined]


def test_hf_list_positions_are_read_from_the_keys_not_from_their_order(tmp_path: Path) -> None:
    """A snapshot keyed by class name may list ``Name[i]`` keys in any order (a hand-edited
    file): the highest positions are the latest."""
    states = {
        f"MetricSnapshot[{i}]": {"args": {"metric": f"m{i}"}, "attributes": {}}
        for i in (10, 2, 11, 0)
    }
    snapshot = Snapshot(keyed_by="class_name", states=states)  # type: ignore[arg-type]
    restored, report = StateStore(tmp_path).restore(
        [MetricSnapshot("a"), MetricSnapshot("b")], snapshot
    )
    assert [cb.metric for cb in restored] == ["m10", "m11"]
    assert any("ignored 2 earlier stale" in w for w in report.warnings)


def test_writing_hf_section_replaces_it_never_appends_hf_list_grew(tmp_path: Path) -> None:
    path = fixture(tmp_path)
    store = StateStore(tmp_path)
    store.register([MetricSnapshot("loss"), MetricSnapshot("accuracy")])
    store.snapshot(str(tmp_path / "ckpt"))
    for _ in range(3):
        write_hf_trainer_state(path, store.load(tmp_path / "ckpt"))
    document = json.loads(path.read_text())
    assert list(document["stateful_callbacks"]) == ["MetricSnapshot"]
    assert len(document["stateful_callbacks"]["MetricSnapshot"]) == 2
    assert document["global_step"] == 10 and len(document["log_history"]) == 1


def test_two_classes_with_one_name_cannot_be_written_to_hf(tmp_path: Path) -> None:
    def make() -> type:
        class MetricSnapshot:
            def state(self) -> CallbackState:
                return {"args": {}, "attributes": {}}

        return MetricSnapshot

    store = StateStore(tmp_path)
    store.register([MetricSnapshot(), make()()])
    store.snapshot(str(tmp_path / "ckpt"))
    with pytest.raises(StateFormatError, match=r"MetricSnapshot and .*<locals>\.MetricSnapshot"):
        to_hf_callbacks(store.load(tmp_path / "ckpt"))


@pytest.mark.parametrize(
    ("section", "key", "where"),
    [
        (
            {
                "EarlyStoppingCallback": {"args": {}, "attributes": {"best": float("nan")}},
                "TrainerControl": TrainerControl().state(),
            },
            "EarlyStoppingCallback",
            "stateful_callbacks.EarlyStoppingCallback.attributes.best: nan",
        ),
        (
            {
                "MetricSnapshot": [{"args": {}, "attributes": {}}, {"args": {}}],
                "TrainerControl": TrainerControl().state(),
            },
            "MetricSnapshot[1]",
            "stateful_callbacks.MetricSnapshot[1].attributes: must be a dict",
        ),
    ],
)
def test_bad_hf_entry_names_the_offending_path_and_costs_only_itself(
    tmp_path: Path, section: Any, key: str, where: str
) -> None:
    snapshot = from_hf_callbacks(section)
    assert snapshot.errors[key].startswith(f"malformed in {where}")
    assert key not in snapshot.states and "TrainerControl" in snapshot.states
    live: list[object] = [TrainerControl(), EarlyStoppingCallback(), MetricSnapshot()]
    _, report = StateStore(tmp_path).restore(live, snapshot)
    assert f"{__name__}.TrainerControl" in report.restored
    assert any(where in w and "starts fresh" in w for w in report.warnings)


def test_hf_section_that_is_not_a_mapping_is_a_format_error() -> None:
    with pytest.raises(StateFormatError, match="stateful_callbacks: expected a mapping"):
        from_hf_callbacks([1, 2])


def test_trainer_state_without_section_or_file(tmp_path: Path) -> None:
    path = fixture(tmp_path, '{"global_step": 3}')
    assert read_hf_trainer_state(path).states == {}
    new = tmp_path / "new" / "trainer_state.json"
    write_hf_trainer_state(new, from_hf_callbacks({"TrainerControl": TrainerControl().state()}))
    assert json.loads(new.read_text()) == {
        "stateful_callbacks": {"TrainerControl": TrainerControl().state()}
    }
    broken = fixture(tmp_path, "{", "broken.json")
    with pytest.raises(StateFormatError, match=r"broken\.json: not JSON"):
        read_hf_trainer_state(broken)
