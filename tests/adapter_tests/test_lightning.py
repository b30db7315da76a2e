"""The Lightning adapter against a real ``lightning.pytorch.Trainer`` (a tiny model, CPU)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import anyio
import pytest
from structlog.testing import capture_logs

pytest.importorskip("torch", reason="torch is not installed (pip install '.[lightning]')")
pytest.importorskip("lightning", reason="lightning is not installed (pip install '.[lightning]')")

import torch
from _callbacks import FailsTheRun, HangsAsync, HangsInThread, Inputs, Raises, StopAfter
from _lightning_model import NthRoundCounter, Regression, make_trainer

from adapters._bus_thread import BusThread
from adapters._stepped_bus import SteppedBus
from adapters._threaded_run import ThreadedRun
from adapters.lightning import EventBusCallback
from eventbus import (
    CheckpointSaved,
    HandlerFailed,
    HandlerTimedOut,
    Report,
    RunFinished,
    RunStarted,
    TrainRunContext,
)
from eventbus.log import read_log, replay_file
from eventbus.state._files import STATE_FILENAME
from handlers import BestCheckpoints, UserCallback
from handlers._attach import attach_user_callbacks


@pytest.fixture(scope="module", autouse=True, params=["in_hooks", "in_thread"])
def bus_runs(request: pytest.FixtureRequest) -> Iterator[str]:
    """Every test through both hosts of the bus: stepped in the Trainer's hooks (the
    default) and in a thread of its own."""
    host = SteppedBus if request.param == "in_hooks" else BusThread
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(ThreadedRun, "_host_class", lambda self: host)
        yield request.param


def counter_key(every: int) -> str:
    return f"{NthRoundCounter.__module__}.{NthRoundCounter.__qualname__}[every={every}]"


@pytest.fixture(scope="module")
def first_run(tmp_path_factory: pytest.TempPathFactory, bus_runs: str) -> dict[str, Any]:
    """10 steps, a log every 2, a checkpoint every 5 (and ``last.ckpt``), the log recorded;
    two callbacks of one class, told apart by their keys."""
    root = tmp_path_factory.mktemp("lightning-run")
    inputs, every, second = Inputs(), NthRoundCounter(every=1), NthRoundCounter(every=2)
    best = BestCheckpoints(metric="loss")
    callback = EventBusCallback([inputs, every, second, best], log=True)
    trainer = make_trainer(root, [callback])
    trainer.fit(Regression())
    return {
        "root": root,
        "inputs": inputs,
        "counters": (every, second),
        "best": best,
        "callback": callback,
        "trainer": trainer,
    }


def test_one_round_per_logging_step_or_save(first_run: dict[str, Any]) -> None:
    inputs: Inputs = first_run["inputs"]
    steps = [metrics[0]["step"] for metrics in inputs.rounds]
    # A log every 2 steps; the save at step 5, which did not log, has a round of its own.
    assert steps == [2, 4, 5, 6, 8, 10]
    assert all(len(metrics) == 1 for metrics in inputs.rounds)  # one process: rank 0 only
    assert inputs.rounds[2] == [{"step": 5}]
    logged = [metrics[0] for i, metrics in enumerate(inputs.rounds) if i != 2]
    assert all(isinstance(m["loss"], float) and m["rank"] == 0.0 for m in logged)
    (result,) = inputs.results
    assert (result.status, result.rounds) == ("finished", 6)
    close = first_run["callback"].close_report
    assert close is not None and close.drained and close.abandoned == 0


def test_each_saved_file_is_the_checkpoint_of_its_steps_round(first_run: dict[str, Any]) -> None:
    inputs: Inputs = first_run["inputs"]
    directory = (first_run["root"] / "checkpoints").resolve()
    saved = {2: str(directory / "epoch=0-step=5.ckpt"), 5: str(directory / "epoch=1-step=10.ckpt")}
    # last.ckpt, a copy, is no round's checkpoint.
    assert inputs.checkpoints == [saved.get(i) for i in range(6)]
    best: BestCheckpoints = first_run["best"]
    assert {path for _, path in best.top} == {saved[5]}  # the one round with a loss and a file


def test_states_go_into_lightnings_checkpoint_and_beside_it(first_run: dict[str, Any]) -> None:
    directory: Path = first_run["root"] / "checkpoints"
    # epoch=0-step=5.ckpt came with the round of step 5, the third.
    for name, rounds, halves, step in (
        ("epoch=0-step=5.ckpt", 3, 2, 5),
        ("epoch=1-step=10.ckpt", 6, 3, 10),
        ("last.ckpt", 6, 3, 10),
    ):
        saved = torch.load(directory / name, weights_only=False)["callbacks"]["EventBusCallback"]
        states = saved["states"]
        assert states[counter_key(1)]["attributes"] == {
            "seen": rounds,
            "rounds": rounds,
            "last_step": step,
        }
        assert states[counter_key(2)]["attributes"]["rounds"] == halves
        if name != "last.ckpt":
            beside = json.loads((directory / f"{name}.{STATE_FILENAME}").read_text())
            assert beside["states"] == states
    assert not (directory / f"last.ckpt.{STATE_FILENAME}").exists()


def test_the_recorded_log_holds_the_run(first_run: dict[str, Any]) -> None:
    callback: EventBusCallback = first_run["callback"]
    assert callback.log_path is not None
    assert callback.log_path.parent == first_run["root"]
    events = read_log(callback.log_path).events
    assert isinstance(events[0], RunStarted) and events[0].world_size == 1
    assert [r.index for r in events if isinstance(r, Report)] == list(range(6))
    saved = [Path(e.checkpoint).name for e in events if isinstance(e, CheckpointSaved)]
    assert saved == ["epoch=0-step=5.ckpt", "epoch=1-step=10.ckpt"]
    assert [e.status for e in events if isinstance(e, RunFinished)] == ["finished"]


def test_a_replay_of_the_recorded_log_gives_our_callbacks_what_they_got_live(
    first_run: dict[str, Any],
) -> None:
    callback: EventBusCallback = first_run["callback"]
    assert callback.log_path is not None
    replayed = Inputs()
    anyio.run(replay_file, callback.log_path, lambda bus: attach_user_callbacks(bus, [replayed]))
    live: Inputs = first_run["inputs"]
    assert (replayed.rounds, replayed.checkpoints) == (live.rounds, live.checkpoints)
    assert [r.status for r in replayed.results] == ["finished"]


def test_resume_from_last_restores_in_place_as_if_uninterrupted(
    first_run: dict[str, Any], tmp_path: Path
) -> None:
    """A run that fails at step 8 resumes from ``last.ckpt`` (step 5): the objects passed
    end as the uninterrupted run's."""
    failing = Inputs(), NthRoundCounter(every=1), NthRoundCounter(every=2)
    trainer = make_trainer(tmp_path, [EventBusCallback(failing)])
    with pytest.raises(RuntimeError, match="failed at step 8"):
        trainer.fit(Regression(fail_at_step=8))
    inputs, every, second = Inputs(), NthRoundCounter(every=1), NthRoundCounter(every=2)
    callback = EventBusCallback([inputs, every, second])
    trainer = make_trainer(tmp_path, [callback])
    trainer.fit(Regression(), ckpt_path="last")
    assert callback.restored is not None and len(callback.restored.restored) == 2
    assert callback.callbacks[1] is every and callback.callbacks[2] is second
    expected = first_run["counters"]
    assert (vars(every), vars(second)) == (vars(expected[0]), vars(expected[1]))
    assert [m[0]["step"] for m in inputs.rounds] == [6, 8, 10]


def test_a_failure_reaches_after_exception_and_after_run_once(tmp_path: Path) -> None:
    inputs = Inputs()
    trainer = make_trainer(tmp_path, [EventBusCallback([inputs])])
    with pytest.raises(RuntimeError, match="failed at step 3"):
        trainer.fit(Regression(fail_at_step=3))
    ((rank, exception),) = (item for failure in inputs.exceptions for item in failure.items())
    assert rank == 0 and "failed at step 3" in str(exception)
    (result,) = inputs.results
    assert result.status == "failed" and "failed at step 3" in (result.error or "")
    assert [m[0]["step"] for m in inputs.rounds] == [2]


def test_should_stop_ends_fit_and_the_result_names_it(tmp_path: Path) -> None:
    stopper, inputs = StopAfter(rounds=3), Inputs()
    trainer = make_trainer(
        tmp_path, [EventBusCallback([stopper, inputs])], max_steps=200, log_every_n_steps=1
    )
    trainer.fit(Regression())
    # The round of step 3 decides; the bus takes it within poll_interval of step 4's start.
    assert 4 <= trainer.global_step < 200
    (result,) = inputs.results
    assert (result.status, result.stopped_by) == ("finished", "StopAfter")


def test_a_stop_ends_fit_at_the_next_step(tmp_path: Path, bus_runs: str) -> None:
    stopper = StopAfter(rounds=3)
    callback = EventBusCallback([stopper], poll_interval=1e-4)
    trainer = make_trainer(tmp_path, [callback], max_steps=200, log_every_n_steps=1)
    trainer.fit(Regression())
    # Step 3's round goes when step 4 starts (a save in step 3 could still name it);
    # handled there, it stops fit after step 4.
    assert trainer.global_step == 4


def test_a_stop_decided_by_a_saving_steps_round_ends_fit_there(tmp_path: Path) -> None:
    stopper = StopAfter(rounds=5)
    trainer = make_trainer(
        tmp_path, [EventBusCallback([stopper])], max_steps=200, log_every_n_steps=1
    )
    trainer.fit(Regression())
    # The 5th round is step 5's, which saved: its save hands the round over, and the
    # Trainer stops after that very step.
    assert trainer.global_step == 5


def test_failing_and_hanging_callbacks_do_not_stop_training(tmp_path: Path) -> None:
    inputs, in_thread = Inputs(), HangsInThread()
    callback = EventBusCallback([Raises(), HangsAsync(), in_thread, inputs], log=True)
    trainer = make_trainer(tmp_path, [callback])
    try:
        trainer.fit(Regression())
    finally:
        in_thread.release.set()
    assert trainer.global_step == 10
    assert len(inputs.rounds) == 6  # every round still reached the healthy callback
    assert callback.log_path is not None
    events = read_log(callback.log_path).events
    assert [e.handler for e in events if isinstance(e, HandlerFailed)] == (
        ["Raises.after_report"] * 6
    )
    timed_out = {(e.handler, e.outcome) for e in events if isinstance(e, HandlerTimedOut)}
    assert timed_out == {
        ("HangsAsync.after_report", "cancelled"),
        ("HangsInThread.after_report", "abandoned"),
    }


@pytest.mark.parametrize(
    ("exc", "raised", "status"),
    [
        (RuntimeError("this callback fails the run"), RuntimeError, "failed"),
        # Lightning turns an interrupt into its graceful shutdown: SystemExit(1).
        (KeyboardInterrupt(), SystemExit, "cancelled"),
    ],
    ids=["raise", "interrupt"],
)
def test_a_callback_failing_the_run_stops_training_with_its_exception(
    tmp_path: Path, exc: BaseException, raised: type[BaseException], status: str
) -> None:
    inputs = Inputs()
    callback = EventBusCallback([FailsTheRun(exc), inputs], log=True)
    trainer = make_trainer(tmp_path, [callback], max_steps=200, log_every_n_steps=1)
    with pytest.raises(raised) as caught:
        trainer.fit(Regression())
    if raised is RuntimeError:
        assert caught.value is exc  # as itself, out of fit()
    assert trainer.global_step < 200  # at a hook soon after the first round
    (result,) = inputs.results  # after_run once, with the run's real end
    assert result.status == status
    assert inputs.exceptions == []  # a callback's failure, not a worker's
    assert callback.log_path is not None
    finished = [e for e in read_log(callback.log_path).events if isinstance(e, RunFinished)]
    assert [e.status for e in finished] == [status]


def test_a_checkpoint_saved_after_fit_holds_the_final_states(first_run: dict[str, Any]) -> None:
    path = first_run["root"] / "after-fit.ckpt"
    first_run["trainer"].save_checkpoint(path)
    saved = torch.load(path, weights_only=False)["callbacks"]["EventBusCallback"]["states"]
    assert saved[counter_key(1)]["attributes"]["rounds"] == 6


def test_malformed_states_in_a_checkpoint_are_named_and_nothing_is_restored(
    first_run: dict[str, Any], tmp_path: Path
) -> None:
    checkpoint = torch.load(first_run["root"] / "checkpoints" / "last.ckpt", weights_only=False)
    checkpoint["callbacks"]["EventBusCallback"] = {"states": "not a mapping"}
    tampered = tmp_path / "tampered.ckpt"
    torch.save(checkpoint, tampered)
    counter = NthRoundCounter(every=1)
    callback = EventBusCallback([counter])
    trainer = make_trainer(tmp_path, [callback], max_steps=12)
    with capture_logs() as logs:
        trainer.fit(Regression(), ckpt_path=str(tampered))
    (malformed,) = (e for e in logs if "states in the checkpoint are malformed" in e["event"])
    assert "states" in malformed["error"]  # names what is wrong, and where
    # Its own snapshot beside it is not there either: the counter starts fresh.
    assert callback.restored is None and (counter.rounds, counter.last_step) == (1, 12)


def test_without_logging_a_user_hears_that_rounds_come_only_at_saves(tmp_path: Path) -> None:
    inputs = Inputs()
    trainer = make_trainer(tmp_path, [EventBusCallback([inputs])], log_every_n_steps=0)
    with capture_logs() as logs:
        trainer.fit(Regression())
    assert [e for e in logs if "log_every_n_steps=0" in e["event"]]
    assert inputs.rounds == [[{"step": 5}], [{"step": 10}]]  # the saves' rounds


class HangsBriefly(UserCallback):
    """Longer than ``drain_timeout`` (0.1 s below), then cancelled at its deadline."""

    timeout: ClassVar[float | None] = 1.0

    async def after_report(
        self, run_context: TrainRunContext, metrics: list[dict[str, Any]], checkpoint: str | None
    ) -> None:
        await anyio.sleep(3600)


def test_a_save_that_cannot_wait_for_its_round_says_so(tmp_path: Path) -> None:
    callback = EventBusCallback([HangsBriefly()], drain_timeout=0.1)
    trainer = make_trainer(tmp_path, [callback], max_steps=5)
    with capture_logs() as logs:
        trainer.fit(Regression())
    busy = {Path(e["checkpoint"]).name for e in logs if "still busy after 0.1 s" in e["event"]}
    assert "epoch=0-step=5.ckpt" in busy  # (and last.ckpt, saved right after it)
