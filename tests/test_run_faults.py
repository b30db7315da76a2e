"""A run against callbacks, workers and metrics that misbehave: it always ends in order.

``after_run`` exactly once, ``RunFinished`` recorded, the exception that
ended the run raised as itself; reports either delivered as they were
reported or refused where they were made.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, ClassVar, Literal

import anyio
import pytest
from _builders import nested_dict
from structlog.testing import capture_logs

from eventbus import Report, ReportRejected, RunFinished, RunResult, TrainRunContext
from eventbus.log import read_log
from handlers import Reporter, ReportError, UserCallback, WorkerGroupError, open_run

pytestmark = pytest.mark.anyio

ROOT = Path(__file__).resolve().parent.parent


class Watcher(UserCallback):
    """Counts lifecycle calls and keeps what each round showed it."""

    def __init__(self) -> None:
        self.before = 0
        self.after: list[RunResult] = []
        self.rounds: list[list[dict[str, Any]]] = []

    def before_run(self, run_context: TrainRunContext) -> None:
        self.before += 1

    def after_report(
        self, run_context: TrainRunContext, metrics: list[dict[str, Any]], checkpoint: str | None
    ) -> None:
        self.rounds.append([dict(m) for m in metrics])

    def after_run(self, run_context: TrainRunContext, result: RunResult) -> None:
        self.after.append(result)


class RaisesOnRound(UserCallback):
    """Raises ``exception`` in ``after_report`` of round ``at``."""

    on_error: ClassVar[Literal["log", "raise", "disable"] | None] = None

    def __init__(self, exception: BaseException, at: int = 2) -> None:
        self.exception = exception
        self.at = at
        self.round = 0

    def after_report(
        self, run_context: TrainRunContext, metrics: list[dict[str, Any]], checkpoint: str | None
    ) -> None:
        self.round += 1
        if self.round == self.at:
            raise self.exception


class RaisesOnRoundAsync(RaisesOnRound):
    async def after_report(  # type: ignore[override]
        self, run_context: TrainRunContext, metrics: list[dict[str, Any]], checkpoint: str | None
    ) -> None:
        await anyio.lowlevel.checkpoint()
        super().after_report(run_context, metrics, checkpoint)


def raiser(exception: BaseException, *, use_async: bool) -> RaisesOnRound:
    return (RaisesOnRoundAsync if use_async else RaisesOnRound)(exception)


class RaisesAndFailsTheRun(RaisesOnRound):
    on_error = "raise"


def stray_cancellation() -> BaseException:
    """A cancellation exception no scope of the bus asked for (what a foreign scope raises)."""
    cancelled = anyio.get_cancelled_exc_class()
    create = getattr(cancelled, "_create", None)  # trio.Cancelled has no public constructor
    exc: BaseException = create() if create is not None else cancelled()
    return exc


def counting_worker(rounds: int) -> Callable[[Reporter], Awaitable[None]]:
    async def worker(reporter: Reporter) -> None:
        for step in range(rounds):
            await reporter.report({"step": step, "loss": 1.0 / (step + 1)})
            await anyio.sleep(0.001)

    return worker


async def run_until_raised(
    tmp_path: Path, callbacks: list[Any], worker: Callable[[Reporter], Awaitable[None]]
) -> tuple[BaseException | None, Any]:
    """Run two workers; return what the run raised (never letting it escape) and the run."""
    log = tmp_path / "run.evlog"
    run = open_run(world_size=2, callbacks=callbacks, period=0.05, log=log)
    try:
        async with run:
            await run.workers(worker)
    except BaseException as exc:
        return exc, run
    return None, run


def finished_in_log(tmp_path: Path) -> list[RunFinished]:
    contents = read_log(tmp_path / "run.evlog")
    assert contents.truncated is None and contents.skipped == 0
    return [e for e in contents.events if isinstance(e, RunFinished)]


# --- 1 and 2: what callbacks and workers raise ---------------------------------------------------


@pytest.mark.parametrize("use_async", [False, True])
async def test_a_stray_cancellation_in_a_callback_is_its_fault_and_the_run_finishes(
    tmp_path: Path, use_async: bool
) -> None:
    stray = raiser(stray_cancellation(), use_async=use_async)
    watcher = Watcher()
    raised, run = await run_until_raised(tmp_path, [stray, watcher], counting_worker(5))
    assert raised is None
    assert run.status == "finished"
    assert [r.status for r in watcher.after] == ["finished"]
    assert len(watcher.rounds) == 5
    assert [f.status for f in finished_in_log(tmp_path)] == ["finished"]


@pytest.mark.parametrize(
    ("exception", "status"),
    [(KeyboardInterrupt(), "cancelled"), (SystemExit(3), "failed")],
)
@pytest.mark.parametrize("use_async", [False, True])
async def test_an_interrupt_in_a_callback_ends_the_run_in_order_and_is_raised_as_itself(
    tmp_path: Path, exception: BaseException, status: str, use_async: bool
) -> None:
    watcher = Watcher()
    callback = raiser(exception, use_async=use_async)
    raised, run = await run_until_raised(tmp_path, [callback, watcher], counting_worker(10_000))
    assert raised is exception  # unwrapped, on asyncio and trio alike
    assert run.status == status
    assert [r.status for r in watcher.after] == [status]
    assert watcher.before == 1
    finished = finished_in_log(tmp_path)
    assert [f.status for f in finished] == [status]
    if isinstance(exception, SystemExit):
        assert finished[0].error == "SystemExit: 3"


@pytest.mark.parametrize("hook", ["before_run", "after_run"])
async def test_an_interrupt_in_a_lifecycle_hook_is_raised_and_after_run_runs_once(
    tmp_path: Path, hook: str
) -> None:
    class InterruptsIn(Watcher):
        def before_run(self, run_context: TrainRunContext) -> None:
            super().before_run(run_context)
            if hook == "before_run":
                raise KeyboardInterrupt

        def after_run(self, run_context: TrainRunContext, result: RunResult) -> None:
            super().after_run(run_context, result)
            if hook == "after_run":
                raise KeyboardInterrupt

    callback = InterruptsIn()
    raised, run = await run_until_raised(tmp_path, [callback], counting_worker(50))
    assert type(raised) is KeyboardInterrupt
    assert callback.before == 1 and len(callback.after) == 1
    # Interrupted at the start, the run is cancelled; at the very end, it had finished.
    assert run.status == ("cancelled" if hook == "before_run" else "finished")
    assert [f.status for f in finished_in_log(tmp_path)] == [run.status]


@pytest.mark.parametrize("exception", [KeyboardInterrupt(), SystemExit(0)])
async def test_an_interrupt_in_a_worker_ends_the_run_in_order(
    tmp_path: Path, exception: BaseException
) -> None:
    async def worker(reporter: Reporter) -> None:
        for step in range(10_000):
            if reporter.rank == 1 and step == 3:
                raise exception
            await reporter.report({"step": step})
            await anyio.sleep(0.001)

    watcher = Watcher()
    raised, run = await run_until_raised(tmp_path, [watcher], worker)
    assert raised is exception
    assert run.status == ("cancelled" if isinstance(exception, KeyboardInterrupt) else "failed")
    assert len(watcher.after) == 1
    assert len(finished_in_log(tmp_path)) == 1


async def test_on_error_raise_fails_the_run_after_delivering_after_run(tmp_path: Path) -> None:
    watcher = Watcher()
    error = ValueError("the callback wants the run to fail")
    raised, run = await run_until_raised(
        tmp_path, [RaisesAndFailsTheRun(error), watcher], counting_worker(10_000)
    )
    assert raised is error
    assert run.status == "failed"
    assert [r.status for r in watcher.after] == ["failed"]
    finished = finished_in_log(tmp_path)
    assert [(f.status, f.error) for f in finished] == [
        ("failed", "ValueError: the callback wants the run to fail")
    ]


SIGINT_SCRIPT = textwrap.dedent(
    """
    import signal, sys, time
    import anyio
    from handlers import UserCallback, open_run

    # Python's own handler, whatever this process inherited (a parent that ignores SIGINT
    # passes that on): what a script started from a terminal has.
    signal.signal(signal.SIGINT, signal.default_int_handler)

    class Busy(UserCallback):
        def after_report(self, run_context, metrics, checkpoint):
            t = time.perf_counter()
            while time.perf_counter() - t < 0.002:  # sync work: a signal may land in here
                pass

        def after_run(self, run_context, result):
            print("after_run", result.status, flush=True)

    async def worker(reporter):
        for step in range(1_000_000):
            await reporter.report({"step": step})
            if step == 5 and reporter.rank == 0:
                print("READY", flush=True)
            await anyio.sleep(0.001)

    async def main():
        async with open_run(world_size=2, callbacks=[Busy()], period=0.05, log=sys.argv[2]) as run:
            await run.workers(worker)

    anyio.run(main, backend=sys.argv[1])
    """
)


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
@pytest.mark.parametrize("delay", [0.0, 0.05, 0.2])
def test_sigint_ends_a_run_in_order_and_leaves_a_plain_keyboard_interrupt(
    tmp_path: Path, backend: str, delay: float
) -> None:
    script = tmp_path / "interrupted.py"
    script.write_text(SIGINT_SCRIPT)
    log = tmp_path / "run.evlog"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(
        [sys.executable, str(script), backend, str(log)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    assert proc.stdout is not None
    try:
        assert proc.stdout.readline().strip() == "READY"
        anyio.run(anyio.sleep, delay)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert [line for line in out.splitlines() if line.startswith("after_run")] == [
        "after_run cancelled"
    ]
    last_line = err.strip().splitlines()[-1]
    assert last_line == "KeyboardInterrupt", err[-2000:]
    assert "ExceptionGroup" not in err
    assert [f.status for f in finished_in_log(tmp_path)] == ["cancelled"]


# --- 6: metrics as they were reported, and nobody else's to change -----------------------


async def test_callbacks_see_what_was_reported_even_when_the_worker_reuses_its_dict() -> None:
    watcher = Watcher()

    async def reuses_one_dict(reporter: Reporter) -> None:
        metrics: dict[str, Any] = {}
        for step in range(5):
            metrics["step"] = step
            metrics["hist"] = [step] * 3
            await reporter.report(metrics)
            metrics.clear()

    async with open_run(world_size=1, callbacks=[watcher]) as run:
        await run.workers(reuses_one_dict)
    assert [r[0]["step"] for r in watcher.rounds] == [0, 1, 2, 3, 4]
    assert [r[0]["hist"] for r in watcher.rounds] == [[s] * 3 for s in range(5)]


async def test_no_callback_can_change_what_another_sees() -> None:
    class Mutates(UserCallback):
        def __init__(self) -> None:
            self.refused = 0

        def after_report(
            self,
            run_context: TrainRunContext,
            metrics: list[dict[str, Any]],
            checkpoint: str | None,
        ) -> None:
            for attempt in (
                lambda: metrics[0].__setitem__("step", -1),
                lambda: metrics[0].pop("step"),
                lambda: metrics[0]["hist"].append(99),
                lambda: metrics[0].update(step=-1),
            ):
                try:
                    attempt()
                except TypeError:
                    self.refused += 1
            metrics.append({"step": -2})  # its own list: fine, and nobody else's

    mutator, watcher = Mutates(), Watcher()

    async def worker(reporter: Reporter) -> None:
        for step in range(3):
            await reporter.report({"step": step, "hist": [step]})

    async with open_run(world_size=1, callbacks=[mutator, watcher]) as run:
        await run.workers(worker)
    assert mutator.refused == 3 * 4
    assert watcher.rounds == [[{"step": s, "hist": [s]}] for s in range(3)]


# --- 7, 10, 11: reports that cannot be accepted --------------------------------------------


@pytest.mark.parametrize(
    ("metrics", "field"),
    [
        ({"out": Path("/tmp/x")}, "metrics['out']"),
        ({"obj": object()}, "metrics['obj']"),
        ({"big": 2**70}, "metrics['big']"),
        ({3: 1.0}, "metrics"),
        ({"deep": [[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]}, None),
    ],
)
async def test_a_report_the_log_cannot_hold_is_refused_at_the_report_naming_the_field(
    tmp_path: Path, metrics: dict[Any, Any], field: str | None
) -> None:
    """The worker hears of it where it reported; nothing is reported, so its turn in the
    round is still its own: the next report fills it."""
    watcher = Watcher()
    refused: list[ReportError] = []

    async def worker(reporter: Reporter) -> None:
        await reporter.report({"step": 0})
        try:
            await reporter.report(metrics)
        except ReportError as exc:
            refused.append(exc)
        await reporter.report({"step": 2})

    log = tmp_path / "run.evlog"
    async with open_run(world_size=1, callbacks=[watcher], log=log) as run:
        await run.workers(worker)
    assert [r[0]["step"] for r in watcher.rounds] == [0, 2]
    assert [e.rank for e in refused] == [0] and isinstance(refused[0], ValueError)
    if field is not None:
        assert refused[0].field == field and field in str(refused[0])
    assert watcher.after[0].rounds == 2 and watcher.after[0].reports == 2
    assert [f.status for f in finished_in_log(tmp_path)] == ["finished"]


async def test_a_tensor_reported_as_a_metric_is_refused_saying_to_report_its_number() -> None:
    """The commonest slip (``loss`` rather than ``loss.item()``): the refusal says what to do."""

    class Tensor:  # what torch's and numpy's numbers have in common here
        def item(self) -> float:
            return 0.5

    async def worker(reporter: Reporter) -> None:
        with pytest.raises(ReportError) as info:
            await reporter.report({"loss": Tensor()})
        said = str(info.value)
        assert said.startswith("rank 0: report refused: metrics['loss']: "), said
        assert said.endswith(
            "Tensor is not a JSON value (str, number, bool, None, list or dict); "
            "report its number, value.item()"
        ), said
        await reporter.report({"loss": Tensor().item()})

    async with open_run(world_size=1) as run:
        await run.workers(worker)
    assert run.result.rounds == 1


async def test_a_refused_report_not_caught_fails_its_worker_loudly(tmp_path: Path) -> None:
    """Uncaught, the refusal is the worker's failure: the other ranks never wait for it."""
    watcher = Watcher()

    async def worker(reporter: Reporter) -> None:
        metrics: dict[str, Any] = {"loss": object()} if reporter.rank == 1 else {"loss": 1.0}
        for _ in range(3):
            await reporter.report(metrics, checkpoint=None)
            await reporter.sync()

    with capture_logs() as logs, anyio.fail_after(10), pytest.raises(WorkerGroupError) as info:
        async with open_run(world_size=2, callbacks=[watcher]) as run:
            await run.workers(worker)
    assert isinstance(info.value.failures[1], ReportError)
    assert watcher.after[0].status == "failed" and watcher.rounds == []
    said = logs[0]["event"]
    assert said.startswith("worker rank 1 failed: ReportError: rank 1: report refused: metrics")


async def test_a_path_is_a_checkpoint_location_and_other_objects_are_refused(
    tmp_path: Path,
) -> None:
    watcher = Watcher()
    seen: list[str | None] = []

    class Checkpoints(UserCallback):
        def after_report(
            self,
            run_context: TrainRunContext,
            metrics: list[dict[str, Any]],
            checkpoint: str | None,
        ) -> None:
            seen.append(checkpoint)

    async def worker(reporter: Reporter) -> None:
        (tmp_path / "ck").mkdir()
        await reporter.report({"step": 0}, checkpoint=tmp_path / "ck")
        with pytest.raises(ReportError, match=r"checkpoint: 7 is not a checkpoint location"):
            await reporter.report({"step": 1}, checkpoint=7)  # type: ignore[arg-type]
        with pytest.raises(ReportError, match=r"checkpoint: '' is not"):
            await reporter.report({"step": 1}, checkpoint="")

    async with open_run(world_size=1, callbacks=[watcher, Checkpoints()]) as run:
        await run.workers(worker)
    assert seen == [str(tmp_path / "ck")] and watcher.after[0].rejected == 0


async def test_a_dict_nested_far_too_deep_is_refused_not_a_crash(tmp_path: Path) -> None:
    deep = nested_dict(100_000)
    watcher = Watcher()
    refused: list[ReportError] = []

    async def worker(reporter: Reporter) -> None:
        try:
            await reporter.report(deep)
        except ReportError as exc:
            refused.append(exc)
        await reporter.report({"step": 1})

    async with open_run(world_size=1, callbacks=[watcher], log=tmp_path / "run.evlog") as run:
        await run.workers(worker)
    assert len(refused) == 1 and watcher.after[0].rounds == 1
    assert [f.status for f in finished_in_log(tmp_path)] == ["finished"]


async def test_a_report_of_another_run_is_rejected() -> None:
    watcher = Watcher()
    rejected: list[ReportRejected] = []
    async with open_run(world_size=1, callbacks=[watcher], run_id="mine") as run:
        run.bus.subscribe(ReportRejected, rejected.append)
        await run.bus.publish(
            Report(run_id="theirs", rank=0, world_size=1, index=0, metrics={"step": 0})
        )
        await run.reporter(0).report({"step": 1})
    assert [r.field for r in rejected] == ["run_id"]
    assert [r[0]["step"] for r in watcher.rounds] == [1]


# --- 18: the log file of a run cancelled while it is entered ---------------------------------


def open_files(path: Path) -> int:
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{fd}") == str(path):
                count += 1
        except OSError:
            continue
    return count


async def test_cancelling_open_run_while_it_is_entered_leaves_no_file_open(
    tmp_path: Path,
) -> None:
    log = tmp_path / "run.evlog"
    with anyio.CancelScope() as scope:
        scope.cancel()
        async with open_run(world_size=1, log=log):
            pytest.fail("the body must not run")
    assert open_files(log) == 0


async def test_a_run_never_entered_opens_no_file(tmp_path: Path) -> None:
    log = tmp_path / "run.evlog"
    run = open_run(world_size=1, log=log)
    assert not log.exists() and open_files(log) == 0
    del run
