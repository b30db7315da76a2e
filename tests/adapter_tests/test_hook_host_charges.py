"""A callback run from a trainer's hooks is charged the time it ran, and its deadline holds.

Issue 39, item 3: stepped in the trainer's hooks, a call that began in one hook's
step and ended in a later one was charged the whole training step between them
(an async callback awaiting 1 ms, about 165 ms a call): ``over_budget="disable"``
disabled it, and a call past its deadline could end unflagged. Through a real
Hugging Face ``Trainer`` (a tiny model whose step waits ``STEP`` seconds, the
trainer's compute, standing in for a real model's) on both hosts of the bus:
stepped in the hooks (the default) and in a thread of its own; and, for the
figures to agree with it, through ``open_run`` (a worker whose step waits as long,
in a thread). Each assertion is against the same run's own training-step time,
never a fixed duration.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any, ClassVar

import pytest

for _name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_HUB_DISABLE_TELEMETRY"):
    os.environ.setdefault(_name, "1")

pytest.importorskip("torch", reason="torch is not installed (pip install '.[transformers]')")
pytest.importorskip(
    "transformers", reason="transformers is not installed (pip install '.[transformers]')"
)

import anyio  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402
from torch import nn  # noqa: E402
from torch.utils.data import Dataset  # noqa: E402

from adapters._bus_host import BusHost  # noqa: E402
from adapters._bus_thread import BusThread  # noqa: E402
from adapters._options import BusRuns  # noqa: E402
from adapters._stepped_bus import SteppedBus  # noqa: E402
from adapters.transformers import EventBusCallback  # noqa: E402
from eventbus import HandlerStateChanged, HandlerTimedOut, RunResult, TrainRunContext  # noqa: E402
from eventbus._events import CallbackCost  # noqa: E402
from eventbus._subscription import OverBudgetPolicy  # noqa: E402
from eventbus.log import read_log  # noqa: E402
from handlers import Reporter, UserCallback, open_run  # noqa: E402

#: The trainer's compute per step, seconds: long beside a 1 ms await, and beside the
#: deadline of ``PastItsDeadline``, so a step charged to a callback shows.
STEP = 0.05
#: The health-check period: several per run, so a callback charged the trainer's
#: steps goes over its budget (and is disabled) while the run goes on.
PERIOD = 0.5

HOSTS: dict[BusRuns, type[BusHost]] = {"in_hooks": SteppedBus, "in_thread": BusThread}
#: Each way in: the HF adapter's two hosts, and ``open_run`` to agree with: its worker's
#: step in a thread (the loop free meanwhile) or computing in the loop (holding it).
WAYS = [*HOSTS, "open_run", "open_run_in_loop"]


class Computes(nn.Module):  # type: ignore[misc]  # torch is untyped to mypy
    """A linear regression whose every forward takes ``STEP`` seconds more."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.lin = nn.Linear(4, 1)

    def forward(self, x: Any, y: Any) -> dict[str, Any]:
        time.sleep(STEP)
        return {"loss": nn.functional.mse_loss(self.lin(x).squeeze(-1), y)}


class Regression(Dataset):  # type: ignore[misc]
    def __init__(self, n: int = 64) -> None:
        generator = torch.Generator().manual_seed(0)
        self.x = torch.randn(n, 4, generator=generator)
        self.y = self.x.sum(-1)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> dict[str, Any]:
        return {"x": self.x[i], "y": self.y[i]}


class AwaitsAMillisecond(UserCallback):
    """Awaits 1 ms a round; disabled if over a budget that a training step a call
    would break many times over (about 10 rounds of a period's 100 ms)."""

    budget: ClassVar[float | None] = 0.2
    over_budget: ClassVar[OverBudgetPolicy | None] = "disable"

    def __init__(self) -> None:
        self.rounds = 0

    async def after_report(
        self, run_context: TrainRunContext, metrics: list[dict[str, Any]], ckpt: str | None
    ) -> None:
        await anyio.sleep(0.001)
        self.rounds += 1


class PastItsDeadline(UserCallback):
    """Awaits 8 times its deadline, which is shorter than a training step: past the
    watchdog's tolerance too (it may see a call up to 50 ms late, ``eventbus._watchdog``)."""

    timeout: ClassVar[float | None] = STEP / 2

    def __init__(self) -> None:
        self.began = self.ended = 0

    async def after_report(
        self, run_context: TrainRunContext, metrics: list[dict[str, Any]], ckpt: str | None
    ) -> None:
        self.began += 1
        await anyio.sleep(8 * STEP / 2)
        self.ended += 1


class Result(UserCallback):
    def __init__(self) -> None:
        self.results: list[RunResult] = []

    def after_run(self, run_context: TrainRunContext, result: RunResult) -> None:
        self.results.append(result)


def train(
    output: Path, callbacks: list[UserCallback], way: str, steps: int
) -> tuple[float, list[Any]]:
    """Train ``steps`` steps, a report each, the way ``way``: the training step's mean
    time (seconds, hooks included), and the events of the run's log."""
    if way.startswith("open_run"):
        return anyio.run(train_in_open_run, output, callbacks, steps, way == "open_run_in_loop")
    bus_runs: BusRuns = "in_hooks" if way == "in_hooks" else "in_thread"
    callback = EventBusCallback(callbacks, log=True, bus_runs=bus_runs, period=PERIOD)
    args = transformers.TrainingArguments(
        output_dir=str(output),
        max_steps=steps,
        per_device_train_batch_size=4,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        use_cpu=True,
        disable_tqdm=True,
        dataloader_num_workers=0,
    )
    trainer = transformers.Trainer(
        model=Computes(), args=args, train_dataset=Regression(), callbacks=[callback]
    )
    metrics = trainer.train().metrics
    assert isinstance(callback.bus_thread, HOSTS[bus_runs])
    runtime = metrics["train_runtime"]
    assert isinstance(runtime, float) and callback.log_path is not None
    return runtime / steps, list(read_log(callback.log_path).events)


async def train_in_open_run(
    output: Path, callbacks: list[UserCallback], steps: int, in_loop: bool
) -> tuple[float, list[Any]]:
    """``train`` through ``open_run``: one worker, its step ``STEP`` seconds in a thread
    (its compute, which leaves the loop free, as the trainer's leaves the hooks), or
    ``in_loop``, computing in the worker itself (a torch step awaits nothing)."""
    log = output / "run.evlog"
    took: list[float] = []

    async def worker(reporter: Reporter) -> None:
        began = time.monotonic()
        for step in range(steps):
            if in_loop:
                computing_until = time.perf_counter() + STEP
                while time.perf_counter() < computing_until:
                    pass
            else:
                await anyio.to_thread.run_sync(time.sleep, STEP)
            await reporter.report({"loss": 1.0 / (step + 1), "step": step})
        took.append(time.monotonic() - began)

    async with open_run(world_size=1, callbacks=callbacks, period=PERIOD, log=log) as run:
        await run.workers(worker)
    return took[0] / steps, list(read_log(log).events)


def cost_of(result: Result, handler: str) -> CallbackCost:
    (run,) = result.results
    (cost,) = (cost for cost in run.callbacks if cost.handler == handler)
    return cost


@pytest.mark.parametrize("way", WAYS)
def test_an_async_callback_is_charged_its_await_not_the_training_step(
    tmp_path: Path, way: str
) -> None:
    awaits, result = AwaitsAMillisecond(), Result()
    steps = 24
    step, events = train(tmp_path, [awaits, result], way, steps)
    cost = cost_of(result, "AwaitsAMillisecond.after_report")
    # Every round reached it: within its budget, never disabled, nothing skipped.
    assert awaits.rounds == cost.calls == steps
    assert cost.skipped == 0 and cost.periods_over_budget == 0 and cost.timeouts == 0
    # Charged its 1 ms await (and the loop's turn), not the step it began in: the
    # step is 50 times that. (Charged the steps, its mean was a step or more.)
    assert cost.mean < step / 5, (cost, step)
    assert not [e for e in events if isinstance(e, HandlerStateChanged)]


@pytest.mark.parametrize("way", WAYS)
def test_a_call_past_its_deadline_is_cancelled_and_flagged_timed_out(
    tmp_path: Path, way: str
) -> None:
    late, awaits, result = PastItsDeadline(), AwaitsAMillisecond(), Result()
    steps = 6
    step, events = train(tmp_path, [late, awaits, result], way, steps)
    cost = cost_of(result, "PastItsDeadline.after_report")
    # Each call was cancelled at its deadline (none finished its await), and said so.
    assert late.began == cost.calls == cost.timeouts == steps
    assert late.ended == 0
    timed_out = [
        e
        for e in events
        if isinstance(e, HandlerTimedOut) and e.handler == "PastItsDeadline.after_report"
    ]
    assert len(timed_out) == steps
    assert {e.outcome for e in timed_out} == {"cancelled"}
    # Where a worker's step held the loop during a call, the timeout says so.
    held = [e for e in timed_out if "workers' steps held the event loop" in e.advice]
    assert bool(held) == (way == "open_run_in_loop"), [e.advice for e in timed_out]
    # The callback beside it was charged its own await, not the other one's wait.
    other = cost_of(result, "AwaitsAMillisecond.after_report")
    assert other.calls == steps and other.timeouts == 0 and other.skipped == 0
    assert other.mean < step / 5, (other, step)
