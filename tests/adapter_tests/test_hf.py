"""The Hugging Face adapter against a real ``Trainer`` (a tiny local model, CPU, a few steps)."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

for _name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_HUB_DISABLE_TELEMETRY"):
    os.environ.setdefault(_name, "1")

pytest.importorskip("torch", reason="torch is not installed (pip install '.[transformers]')")
pytest.importorskip(
    "transformers", reason="transformers is not installed (pip install '.[transformers]')"
)

import torch  # noqa: E402
import transformers  # noqa: E402
from _callbacks import (  # noqa: E402
    FailsTheRun,
    HangsAsync,
    HangsInThread,
    Inputs,
    Raises,
    RoundCounter,
    StopAfter,
)
from torch import nn  # noqa: E402
from torch.utils.data import Dataset  # noqa: E402

from adapters._bus_thread import BusThread  # noqa: E402
from adapters._stepped_bus import SteppedBus  # noqa: E402
from adapters._threaded_run import ThreadedRun  # noqa: E402
from adapters.transformers import EventBusCallback, run_with_failures  # noqa: E402
from eventbus import (  # noqa: E402  #noqa: E402
    CheckpointSaved,
    HandlerFailed,
    HandlerTimedOut,
    Report,
    RunFinished,
    RunStarted,
)
from eventbus.log import read_log  # noqa: E402
from eventbus.state._files import STATE_FILENAME  # noqa: E402

MAX_STEPS = 10


@pytest.fixture(scope="module", autouse=True, params=["in_hooks", "in_thread"])
def bus_runs(request: pytest.FixtureRequest) -> Iterator[str]:
    """Every test here through both hosts of the bus: stepped in the Trainer's hooks (the
    default) and in a thread of its own (``bus_runs="in_thread"``, as in a notebook)."""
    host = SteppedBus if request.param == "in_hooks" else BusThread
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(ThreadedRun, "_host_class", lambda self: host)
        yield request.param


class TinyModel(nn.Module):  # type: ignore[misc]  # torch is untyped to mypy
    """A linear regression: ``forward(**batch)`` returns the loss, as the Trainer expects."""

    def __init__(self, fail_at_call: int | None = None) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.lin = nn.Linear(4, 1)
        self.fail_at_call = fail_at_call
        self.calls = 0

    def forward(self, x: Any, y: Any) -> dict[str, Any]:
        self.calls += 1
        if self.calls == self.fail_at_call:
            raise RuntimeError(f"forward failed at call {self.calls}")
        prediction = self.lin(x).squeeze(-1)
        return {"loss": nn.functional.mse_loss(prediction, y)}


class Regression(Dataset):  # type: ignore[misc]
    def __init__(self, n: int = 64) -> None:
        generator = torch.Generator().manual_seed(0)
        self.x = torch.randn(n, 4, generator=generator)
        self.y = self.x.sum(-1)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> dict[str, Any]:
        return {"x": self.x[i], "y": self.y[i]}


def make_trainer(
    output_dir: Path,
    callback: EventBusCallback,
    *,
    max_steps: int = MAX_STEPS,
    model: TinyModel | None = None,
    eval_dataset: Any = None,
    **overrides: Any,
) -> Any:
    options: dict[str, Any] = {
        "output_dir": str(output_dir),
        "max_steps": max_steps,
        "per_device_train_batch_size": 4,
        "logging_steps": 2,
        "save_steps": 5,
        "save_strategy": "steps",
        "report_to": "none",
        "use_cpu": True,
        "disable_tqdm": True,
        "dataloader_num_workers": 0,
        **overrides,
    }
    return transformers.Trainer(
        model=model or TinyModel(),
        args=transformers.TrainingArguments(**options),
        train_dataset=Regression(),
        eval_dataset=eval_dataset,
        callbacks=[callback],
    )


@pytest.fixture(scope="module")
def first_run(tmp_path_factory: pytest.TempPathFactory, bus_runs: str) -> dict[str, Any]:
    """10 steps, a report every 2 steps, checkpoints at steps 5 and 10, the log recorded."""
    output = tmp_path_factory.mktemp("hf-run")
    inputs, counter = Inputs(), RoundCounter()
    callback = EventBusCallback([inputs, counter], log=True)
    trainer = make_trainer(output, callback)
    trainer.train()
    return {"output": output, "inputs": inputs, "counter": counter, "callback": callback}


def test_reports_arrive_in_order_one_round_per_log_or_save(first_run: dict[str, Any]) -> None:
    inputs: Inputs = first_run["inputs"]
    steps = [metrics[0]["step"] for metrics in inputs.rounds]
    # A log every 2 steps; the save at step 5, which did not log, has a round of its own.
    assert steps == [2, 4, 5, 6, 8, 10]
    assert all(len(metrics) == 1 for metrics in inputs.rounds)  # one process: rank 0 only
    assert inputs.rounds[2] == [{"step": 5}]
    assert all("loss" in metrics[0] for i, metrics in enumerate(inputs.rounds) if i != 2)
    (result,) = inputs.results
    assert (result.status, result.rounds) == ("finished", 6)
    # HF's end-of-training log is the run's summary, not a round.
    assert "train_runtime" in result.summary and "train_loss" in result.summary
    close = first_run["callback"].close_report
    assert close is not None and close.drained and close.abandoned == 0
    assert first_run["callback"].dropped == 0


def test_each_save_is_the_checkpoint_of_its_steps_round(first_run: dict[str, Any]) -> None:
    inputs: Inputs = first_run["inputs"]
    output: Path = first_run["output"]
    saved = {
        2: str((output / "checkpoint-5").resolve()),
        5: str((output / "checkpoint-10").resolve()),
    }
    assert inputs.checkpoints == [saved.get(i) for i in range(6)]


def test_checkpoints_snapshot_the_states_as_of_the_checkpoint(first_run: dict[str, Any]) -> None:
    output: Path = first_run["output"]
    key = f"{RoundCounter.__module__}.{RoundCounter.__qualname__}"
    # checkpoint-5 came with the round of step 5, after those of steps 2 and 4;
    # checkpoint-10 with the round of step 10, the sixth.
    for step, rounds in ((5, 3), (10, 6)):
        snapshot = json.loads((output / f"checkpoint-{step}" / STATE_FILENAME).read_text())
        assert snapshot["states"][key]["attributes"] == {"rounds": rounds, "last_step": step}
        trainer_state = json.loads(
            (output / f"checkpoint-{step}" / "trainer_state.json").read_text()
        )
        section = trainer_state["stateful_callbacks"]
        assert section["RoundCounter"]["attributes"]["rounds"] == rounds
        assert "TrainerControl" in section  # HF's own entries are kept
        assert trainer_state["global_step"] == step  # and the rest of HF's file


def test_the_recorded_log_holds_the_run(first_run: dict[str, Any]) -> None:
    callback: EventBusCallback = first_run["callback"]
    assert callback.log_path is not None
    events = read_log(callback.log_path).events
    assert isinstance(events[0], RunStarted) and events[0].world_size == 1
    reports = [e for e in events if isinstance(e, Report)]
    assert [r.index for r in reports] == list(range(6))
    saved = [e for e in events if isinstance(e, CheckpointSaved)]
    assert [Path(e.checkpoint).name for e in saved] == ["checkpoint-5", "checkpoint-10"]
    assert [e.status for e in events if isinstance(e, RunFinished)] == ["finished"]


def copy_checkpoint(first_run: dict[str, Any], to: Path) -> Path:
    shutil.copytree(first_run["output"] / "checkpoint-5", to / "checkpoint-5")
    return to / "checkpoint-5"


def test_resume_restores_our_stateful_callbacks(first_run: dict[str, Any], tmp_path: Path) -> None:
    checkpoint = copy_checkpoint(first_run, tmp_path)
    counter = RoundCounter()
    callback = EventBusCallback([Inputs(), counter])
    trainer = make_trainer(tmp_path, callback)
    trainer.train(resume_from_checkpoint=str(checkpoint))  # found from the resumed step
    assert callback.restored is not None and callback.restored.restored
    # Restored in place, as open_run does: the object passed holds the saved state.
    assert callback.callbacks[1] is counter
    # 3 rounds up to checkpoint-5, then those of steps 6, 8 and 10: as the first run's.
    assert (counter.rounds, counter.last_step) == (6, 10)
    assert vars(counter) == vars(first_run["counter"])


def test_resume_falls_back_to_trainer_state_json(first_run: dict[str, Any], tmp_path: Path) -> None:
    """Without our snapshot file, the states merged into ``stateful_callbacks`` are used."""
    (copy_checkpoint(first_run, tmp_path) / STATE_FILENAME).unlink()
    counter = RoundCounter()
    callback = EventBusCallback([counter])
    trainer = make_trainer(tmp_path, callback, max_steps=6)
    run_with_failures(trainer, resume_from_checkpoint=True)  # the latest: checkpoint-5
    assert callback.restored is not None and len(callback.restored.restored) == 1
    assert callback.callbacks[0] is counter
    assert (counter.rounds, counter.last_step) == (3 + 1, 6)  # and the log at step 6


def test_a_callback_asking_to_stop_stops_training(tmp_path: Path) -> None:
    stopper, inputs = StopAfter(rounds=2), Inputs()
    callback = EventBusCallback([stopper, inputs])
    trainer = make_trainer(tmp_path, callback, max_steps=200, logging_steps=1, save_steps=1000)
    trainer.train()
    assert stopper.should_stop
    # The bus decides after the 2nd report (step 2); the next hooks see it.
    assert 2 <= trainer.state.global_step < 200
    # The run's result names what stopped it, as open_run's does.
    (result,) = inputs.results
    assert (result.status, result.stopped_by) == ("finished", "StopAfter")


def test_a_stop_is_seen_in_the_deciding_reports_own_hook(tmp_path: Path, bus_runs: str) -> None:
    """Each report is handled in its ``on_log`` (in the hooks), or ``on_log`` waits for
    the callbacks that can stop the run (a bus thread), so the step after the deciding
    report never runs."""
    stopper = StopAfter(rounds=2)
    callback = EventBusCallback([stopper], poll_interval=1e-4)
    trainer = make_trainer(tmp_path, callback, max_steps=200, logging_steps=1, save_steps=1000)
    trainer.train()
    # Step 2 exactly, whatever ran before: a step another hook took just before (the
    # step's end taking what came before it) does not hold the report back a step.
    assert trainer.state.global_step == 2


def test_failing_and_hanging_callbacks_do_not_stop_training(tmp_path: Path) -> None:
    inputs, in_thread = Inputs(), HangsInThread()
    callback = EventBusCallback([Raises(), HangsAsync(), in_thread, inputs], log=True)
    trainer = make_trainer(tmp_path, callback)
    try:
        trainer.train()
    finally:
        in_thread.release.set()
    assert trainer.state.global_step == MAX_STEPS
    assert len(inputs.rounds) == 6  # every round still reached the healthy callback
    assert callback.log_path is not None
    events = read_log(callback.log_path).events
    failed = [e.handler for e in events if isinstance(e, HandlerFailed)]
    assert failed == ["Raises.after_report"] * 6
    timed_out = {(e.handler, e.outcome) for e in events if isinstance(e, HandlerTimedOut)}
    assert timed_out == {
        ("HangsAsync.after_report", "cancelled"),
        ("HangsInThread.after_report", "abandoned"),
    }


def test_an_exception_in_training_becomes_a_worker_failure(tmp_path: Path) -> None:
    inputs = Inputs()
    callback = EventBusCallback([inputs])
    trainer = make_trainer(tmp_path, callback, model=TinyModel(fail_at_call=3))
    with pytest.raises(RuntimeError, match="forward failed at call 3"):
        run_with_failures(trainer)
    (failures,) = inputs.exceptions
    assert list(failures) == [0]
    assert "forward failed at call 3" in str(failures[0])
    (result,) = inputs.results
    assert result.status == "failed" and "RuntimeError" in (result.error or "")
    assert len(inputs.rounds) == 1  # the log at step 2 came before the failure


@pytest.mark.parametrize(
    ("exc", "status"),
    [(RuntimeError("this callback fails the run"), "failed"), (KeyboardInterrupt(), "cancelled")],
    ids=["raise", "interrupt"],
)
def test_a_callback_failing_the_run_stops_training_with_its_exception(
    tmp_path: Path, exc: BaseException, status: str
) -> None:
    inputs = Inputs()
    callback = EventBusCallback([FailsTheRun(exc), inputs], log=True)
    trainer = make_trainer(tmp_path, callback, max_steps=200, logging_steps=1, save_steps=1000)
    with pytest.raises(type(exc)) as raised:
        run_with_failures(trainer)
    assert raised.value is exc  # as itself, out of train()
    assert trainer.state.global_step < 200  # at a hook soon after the first round
    (result,) = inputs.results  # after_run once, with the run's real end
    assert result.status == status
    assert inputs.exceptions == []  # a callback's failure, not a worker's
    assert callback.log_path is not None
    finished = [e for e in read_log(callback.log_path).events if isinstance(e, RunFinished)]
    assert [e.status for e in finished] == [status]


def test_builtins_see_every_save_and_skip_rounds_without_their_metric(tmp_path: Path) -> None:
    """``BestCheckpoints`` ranks HF's saves (each is its step's round's checkpoint), and
    rounds without a built-in's metric are counted, not failures."""
    from handlers import BestCheckpoints, EarlyStopping

    best = BestCheckpoints(metric="loss", k=2)
    stopping = EarlyStopping(metric="eval_loss", patience=100)
    inputs = Inputs()
    callback = EventBusCallback([best, stopping, inputs], log=True)
    trainer = make_trainer(tmp_path, callback, logging_steps=5)
    trainer.train()
    saved = [str((tmp_path / f"checkpoint-{step}").resolve()) for step in (5, 10)]
    assert set(best.checkpoints) == set(saved) and best.latest == saved[1]
    assert best.rounds_without_metric == 0  # every save came with its step's training log
    assert len(inputs.rounds) == 2
    assert (stopping.rounds, stopping.rounds_without_metric) == (0, 2)
    assert callback.log_path is not None
    events = read_log(callback.log_path).events
    assert not [e for e in events if isinstance(e, HandlerFailed)]
