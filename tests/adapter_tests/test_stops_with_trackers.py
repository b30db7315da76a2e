"""Trackers never change training: a stop decided at a step ends training at the same
step with no tracker, with ``TensorBoardLogger`` and with ``MLflowLogger``, through the
Hugging Face Trainer, Lightning and ``open_run`` (issue 41, item 3).

The trainers' steps here are far shorter than ``poll_interval`` and MLflow's writes
far longer than a step: before the hooks waited for the callbacks that can stop the run
(``ThreadedRun.wait_for_stoppers``), where training stopped depended on both (HF with
``EarlyStopping`` deciding at step 70 of 80 ran to 71 to 80, MLflow a step or two later
than no tracker). Ray's engine syncs as ``open_run`` does (``Reporter.sync``); its
test is in test_ray_engine.py, beside the Ray files' one shared cluster.
"""

from __future__ import annotations

import itertools
import os
from pathlib import Path
from typing import Any, ClassVar

import anyio
import pytest
from structlog.testing import capture_logs

for _name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_HUB_DISABLE_TELEMETRY"):
    os.environ.setdefault(_name, "1")

pytest.importorskip("torch", reason="torch is not installed (pip install '.[transformers]')")
pytest.importorskip("tensorboard", reason="tensorboard is not installed (pip install tensorboard)")
pytest.importorskip("mlflow", reason="MLflow is not installed (pip install '.[mlflow]')")

from _callbacks import StopAfter  # noqa: E402

from adapters._options import BusRuns  # noqa: E402
from adapters.mlflow import MLflowLogger  # noqa: E402
from adapters.tensorboard import TensorBoardLogger  # noqa: E402
from eventbus import TrainRunContext  # noqa: E402
from handlers import EarlyStopping, Reporter, UserCallback, open_run  # noqa: E402

TRACKERS = ["none", "tensorboard", "mlflow"]
BUS_RUNS: list[BusRuns] = ["in_hooks", "in_thread"]


def trackers(kind: str, root: Path) -> list[Any]:
    if kind == "tensorboard":
        return [TensorBoardLogger(root / "tensorboard")]
    if kind == "mlflow":
        return [MLflowLogger(f"sqlite:///{root}/mlflow.db", "stops")]
    return []


# --- Hugging Face --------------------------------------------------------------------


def hf_trainer(output_dir: Path, callback: Any) -> Any:
    """A tiny regression that does not learn (``learning_rate=0``: every evaluation's loss
    is the first's), evaluated every 5 steps and saved every 10, up to 80 steps."""
    from _hf_model import tiny_trainer

    return tiny_trainer(
        output_dir,
        callback,
        size=32,
        evaluate=True,
        max_steps=80,
        learning_rate=0.0,
        logging_steps=5,
        eval_strategy="steps",
        eval_steps=5,
        save_strategy="steps",
        save_steps=10,
    )


#: Evaluations at 5, 10, ...: the first is the best, so ``patience`` evaluations later
#: ``EarlyStopping`` decides: at 20 (a step that saves) or at 25 (one that does not).
@pytest.mark.parametrize(("patience", "step"), [(3, 20), (4, 25)], ids=["saving", "not-saving"])
@pytest.mark.parametrize("bus_runs", BUS_RUNS)
@pytest.mark.parametrize("tracker", TRACKERS)
def test_hugging_face_stops_at_the_deciding_step_whatever_the_trackers(
    tmp_path: Path, tracker: str, bus_runs: BusRuns, patience: int, step: int
) -> None:
    pytest.importorskip("transformers", reason="pip install '.[transformers]'")
    from adapters.transformers import EventBusCallback

    stopping = EarlyStopping("eval_loss", patience=patience)
    callback = EventBusCallback([stopping, *trackers(tracker, tmp_path)], bus_runs=bus_runs)
    trainer = hf_trainer(tmp_path / "out", callback)
    trainer.train()
    assert trainer.state.global_step == step
    assert stopping.should_stop and stopping.rounds == step // 5
    saved = sorted(int(p.name.split("-")[1]) for p in (tmp_path / "out").glob("checkpoint-*"))
    assert saved == list(range(10, step + 1, 10))  # no save after the decision


class SlowStopper(UserCallback):
    """Decides at its second round, each round taking 0.2 s: longer than the hooks wait."""

    timeout: ClassVar[float | None] = 10.0

    def __init__(self) -> None:
        self.rounds = 0
        self.should_stop = False

    async def after_report(
        self, run_context: TrainRunContext, metrics: list[dict[str, Any]], checkpoint: str | None
    ) -> None:
        await anyio.sleep(0.2)
        self.rounds += 1
        self.should_stop = self.rounds >= 2


@pytest.mark.parametrize("bus_runs", BUS_RUNS)
def test_hugging_face_says_once_when_a_stopper_outlasts_the_hooks_wait(
    tmp_path: Path, bus_runs: BusRuns
) -> None:
    """The hook waits ``handoff_timeout`` for the callbacks that can stop the run; one
    slower than that lets training go on, so its stop lands later: said once, in words."""
    pytest.importorskip("transformers", reason="pip install '.[transformers]'")
    from _hf_model import tiny_trainer

    from adapters.transformers import EventBusCallback

    callback = EventBusCallback([SlowStopper()], bus_runs=bus_runs, handoff_timeout=0.05)
    trainer = tiny_trainer(
        tmp_path / "out", callback, max_steps=12, logging_steps=1, save_strategy="no"
    )
    with capture_logs() as logs:
        trainer.train()
    late = [e["event"] for e in logs if "had not handled the latest report" in e["event"]]
    assert len(late) == 1, late
    assert "after 0.05 s (handoff_timeout): training went on" in late[0]
    assert trainer.state.global_step > 2  # decided at step 2, heard later


@pytest.mark.parametrize(
    ("stopper", "waits"),
    [(EarlyStopping("eval_loss", patience=100), 4), (StopAfter(100), 24)],
    ids=["declares-its-metric", "declares-nothing"],
)
def test_hugging_face_waits_only_at_logs_a_stopper_decides_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, stopper: UserCallback, waits: int
) -> None:
    """``EarlyStopping("eval_loss")`` names its metric (``stops_on``): the 20 training
    logs between the 4 evaluations are not waited for, the evaluations are; a stopper
    that names nothing is waited for at all 24 logs."""
    pytest.importorskip("transformers", reason="pip install '.[transformers]'")
    from _hf_model import tiny_trainer

    from adapters._threaded_run import ThreadedRun
    from adapters.transformers import EventBusCallback

    waited: list[int] = []
    wait = ThreadedRun.wait_for_stoppers

    def counting(run: ThreadedRun) -> None:
        waited.append(1)
        wait(run)

    monkeypatch.setattr(ThreadedRun, "wait_for_stoppers", counting)
    callback = EventBusCallback([stopper])
    trainer = tiny_trainer(
        tmp_path / "out",
        callback,
        size=32,
        evaluate=True,
        max_steps=20,
        logging_steps=1,
        eval_strategy="steps",
        eval_steps=5,
        save_strategy="no",
    )
    trainer.train()
    assert trainer.state.global_step == 20
    assert len(waited) == waits


# --- Lightning -----------------------------------------------------------------------


#: A round every step, a save every 5: a round decides at the end of its step, which
#: Lightning's next step's start hands over (a save in the step could still name it), so
#: ``fit`` ends after the step after the deciding one, or at the deciding one if it saved.
@pytest.mark.parametrize(("rounds", "step"), [(3, 4), (5, 5)], ids=["not-saving", "saving"])
@pytest.mark.parametrize("bus_runs", BUS_RUNS)
@pytest.mark.parametrize("tracker", TRACKERS)
def test_lightning_stops_at_the_same_step_whatever_the_trackers(
    tmp_path: Path, tracker: str, bus_runs: BusRuns, rounds: int, step: int
) -> None:
    pytest.importorskip("lightning", reason="pip install '.[lightning]'")
    from _lightning_model import Regression, make_trainer

    from adapters.lightning import EventBusCallback

    stopper = StopAfter(rounds)
    callback = EventBusCallback([stopper, *trackers(tracker, tmp_path)], bus_runs=bus_runs)
    trainer = make_trainer(tmp_path, [callback], max_steps=200, log_every_n_steps=1)
    trainer.fit(Regression())
    assert trainer.global_step == step
    assert stopper.rounds == step  # every step's round, the last one's at the run's end


# --- open_run --------------------------------------------------------------------------


@pytest.mark.parametrize("tracker", TRACKERS)
def test_open_run_with_synced_workers_stops_at_the_deciding_round_whatever_the_trackers(
    tmp_path: Path, tracker: str
) -> None:
    """Two ranks that ``sync`` after each report stop at the round ``EarlyStopping``
    decided (its loss never improves after round 0: patience 5, round 5), both."""
    last_steps: dict[int, int] = {}

    async def train(reporter: Reporter) -> None:
        for step in range(100):
            await reporter.report({"step": step, "loss": 1.0})
            await reporter.sync()
            if reporter.should_stop:
                last_steps[reporter.rank] = step
                return

    async def main() -> None:
        callbacks = [EarlyStopping("loss", patience=5), *trackers(tracker, tmp_path)]
        async with open_run(world_size=2, callbacks=callbacks) as run:
            await run.workers(train)
        assert (run.result.stopped_by or "").startswith("EarlyStopping")

    anyio.run(main)
    assert last_steps == {0: 5, 1: 5}


def test_a_stops_on_that_names_no_metrics_is_refused_in_words() -> None:
    pytest.importorskip("transformers", reason="pip install '.[transformers]'")
    from adapters.transformers import EventBusCallback

    for hostile in (5, [1], itertools.count(), ("loss", None)):
        stopper = StopAfter(3)
        stopper.stops_on = hostile  # type: ignore[attr-defined]
        with pytest.raises(TypeError, match=r"stops_on is .*: give the names of the metrics"):
            EventBusCallback([stopper])
