"""``RayEngine``: ``open_run``'s workers as a Ray Train v2 job; the run stays in the driver.

Ray's controller forwards each gathered round and failure to a hub actor, which the driver
drains into the run (``Run.report_round``); workers read what flows back from the hub.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import signal
import threading
import time
import traceback
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio
import anyio.to_thread
import ray
import ray.cloudpickle
import ray.train
from ray.train import CheckpointConfig, FailureConfig, RunConfig, ScalingConfig
from ray.train.torch import TorchTrainer
from ray.train.v2._internal.execution.callback import ControllerCallback

from eventbus._logging import get_logger
from handlers import Reporter, ReportError, WorkerError
from handlers._metric_values import MetricsError, freeze_metrics

if TYPE_CHECKING:
    from handlers import Run, WorkerFn

__all__ = ["RayEngine", "RayReporter"]

_log = get_logger("adapters.ray")

#: How long the driver's drain of the hub waits for news at a time, seconds.
_TAKE_WAIT_S = 0.5
#: Rounds leave Ray's controller at most once per this many seconds (one Ray call for several).
_BATCH_S = 0.05
#: How long the driver waits for the controller's last words once ``fit()`` ended.
_LAST_WORDS_S = 10.0

#: ``((should_stop, should_checkpoint), for_workers, latest checkpoint)``, as the driver saw them.
_Stops = tuple[bool, bool]
_Status = tuple[_Stops, dict[str, Any], str | None]


class _Hub:
    """The meeting point of the controller, the driver and the workers (an async actor)."""

    def __init__(self, status: _Status, first_index: list[int]) -> None:
        self._news: list[tuple[str, Any]] = []
        self._batches: dict[int, list[tuple[str, Any]]] = {}  # arrived before their turn
        self._next_batch = 0
        self._closed = False
        self._received = 0  # complete rounds the controller forwarded, in this job
        self._handled = 0  # of those, the rounds the driver's callbacks handled
        self._attempt = 0  # worker-group restarts so far
        self._failing = -1  # the attempt whose group failed and awaits Ray's decision
        self._status = status
        self._first_index = first_index
        self._changed = asyncio.Condition()
        self._controller: Any = None
        #: Per rank, its latest progress told this attempt: ``(index, seconds ago, when told)``.
        self._progress: dict[int, tuple[int, float, float]] = {}

    async def _notify(self) -> None:
        async with self._changed:
            self._changed.notify_all()

    # --- the controller ----------------------------------------------------------------

    async def put(self, number: int, batch: list[tuple[str, Any]]) -> None:
        """The controller's ``number``-th batch (an async actor may start calls out of order)."""
        self._batches[number] = batch
        while self._next_batch in self._batches:
            for kind, payload in self._batches.pop(self._next_batch):
                self._take_in(kind, payload)
            self._next_batch += 1
        await self._notify()

    def _take_in(self, kind: str, payload: Any) -> None:
        if kind == "round":
            self._received += 1
            checkpoint = payload[1]
            if checkpoint is not None:
                self._status = (*self._status[:2], checkpoint)
        elif kind == "failures":
            self._failing = self._attempt
        elif kind == "decision" and payload:
            self._attempt += 1
            self._progress.clear()  # the failed attempt's: the restarted group starts anew
        if kind == "closed":
            self._closed = True
        else:
            self._news.append((kind, payload))

    def set_controller(self, controller: Any) -> None:
        self._controller = controller

    # --- the driver --------------------------------------------------------------------

    async def take(
        self, wait_s: float, handled: tuple[int, _Stops, dict[str, Any]] | None = None
    ) -> tuple[list[tuple[str, Any]], bool]:
        """Record what the driver's callbacks handled, then take the news since the last
        take, waiting up to ``wait_s`` seconds."""
        if handled is not None:
            rounds, stops, values = handled
            self._handled = rounds
            self._status = (stops, values, self._status[2])
            await self._notify()
        if not self._news and not self._progress and not self._closed:
            async with self._changed:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._changed.wait(), wait_s)
        news, self._news = self._news, []
        if self._progress:
            now = time.monotonic()
            told = {rank: (i, ago + now - at) for rank, (i, ago, at) in self._progress.items()}
            news.append(("progress", told))
            self._progress = {}
        return news, self._closed and not news

    def controller(self) -> Any:
        return self._controller

    # --- the workers -------------------------------------------------------------------

    async def progress(self, attempt: int, rank: int, index: int, ago: float) -> None:
        """Rank ``rank`` entered report ``index`` ``ago`` seconds ago (no clocks compared)."""
        if attempt == self._attempt:  # else a failed group's, late
            self._progress[rank] = (index, ago, time.monotonic())
            await self._notify()

    def worker_started(self, rank: int) -> tuple[int, int, int, _Status]:
        first = self._first_index[rank] if rank < len(self._first_index) else 0
        return self._attempt, self._received, first + self._received, self._status

    async def wait_handled(self, rounds: int, attempt: int) -> _Status:
        """Return once the driver handled ``rounds`` rounds, the attempt failed or the job ended."""
        async with self._changed:
            while not (self._handled >= rounds or self._failing >= attempt or self._closed):
                await self._changed.wait()
        return self._status

    async def status_after(self, seen: _Status) -> _Status:
        """The run's status once it differs from ``seen`` (or the job is over)."""
        async with self._changed:
            while self._status == seen and not self._closed:
                await self._changed.wait()
        return self._status


class RayReporter(Reporter):
    """A rank's ``Reporter`` on a Ray worker: the same interface, backed by Ray Train
    (``sync`` waits until the driver's callbacks handled this rank's latest round)."""

    def __init__(self, hub: Any, rank: int, world_size: int) -> None:
        # The run is in the driver: the same attributes, but not the run's reporter.
        self.rank = rank
        self.world_size = world_size
        self.ended = False
        self._hub = hub
        started = ray.get(hub.worker_started.remote(rank))
        self.attempt, self._first_round, self._index, self._status = started
        self._rounds = 0  # reports of this attempt
        self._looking: Any = None
        #: The latest report entered: ``(index, time.monotonic())``.
        self._entered: tuple[int, float] | None = None
        self._told_at, self._every = 0.0, math.inf  # never, until it is started
        self._wake = threading.Event()

    async def report(
        self, metrics: dict[str, Any], checkpoint: str | os.PathLike[str] | None = None
    ) -> None:
        try:
            frozen = freeze_metrics(metrics)
        except MetricsError as exc:
            raise ReportError(self.rank, exc.field, exc.reason) from None
        saved = None
        if checkpoint is not None:
            location = _directory(self.rank, self._checkpoint_location(checkpoint))
            saved = ray.train.Checkpoint.from_directory(location)
        index = self._index
        self._index += 1
        self._rounds += 1
        now = time.monotonic()
        self._entered = (index, now)
        if now - self._told_at >= self._every:  # after a quiet spell: told at once
            self._wake.set()
        # The folder a round's checkpoint is persisted to, as on the local engine.
        dir_name = f"checkpoint_{index:06d}"
        ray.train.report(dict(frozen), checkpoint=saved, checkpoint_dir_name=dir_name)

    def tell_progress(self, every: float) -> Callable[[], None]:
        """Tell the hub this rank's progress from a thread, at most once per ``every``
        seconds; returns the function that tells the last and stops it. A thread,
        because ``ray.train.report`` blocks the rank at Ray's barrier."""
        stop = threading.Event()

        def tell() -> None:
            told = -1
            while True:
                self._wake.wait(every)
                self._wake.clear()  # before reading: a report stores, then wakes
                entered = self._entered
                if entered is not None and entered[0] != told:
                    told, self._told_at = entered[0], time.monotonic()
                    ago = self._told_at - entered[1]
                    self._hub.progress.remote(self.attempt, self.rank, told, ago)
                if stop.is_set():
                    return

        self._every, self._told_at = every, -math.inf
        thread = threading.Thread(target=tell, name=f"progress-rank-{self.rank}", daemon=True)
        thread.start()

        def stop_telling() -> None:
            stop.set()
            self._wake.set()
            thread.join(_LAST_WORDS_S)

        return stop_telling

    async def sync(self) -> None:
        waited = self._hub.wait_handled.remote(self._first_round + self._rounds, self.attempt)
        status = await anyio.to_thread.run_sync(ray.get, waited)
        if status != self._status:  # a pending look waits for a change from the old one:
            self._status, self._looking = status, None  # it returns at once, unread

    def _look(self) -> None:
        """Take the hub's new status if it came, without waiting."""
        if self._looking is not None:
            if not self._looking.done():
                return
            self._status = self._looking.result()
        self._looking = self._hub.status_after.remote(self._status).future()

    @property
    def reports(self) -> int:
        return self._index

    @property
    def should_stop(self) -> bool:
        self._look()
        return bool(self._status[0][0])

    @property
    def should_checkpoint(self) -> bool:
        self._look()
        return bool(self._status[0][1])

    @property
    def from_callbacks(self) -> dict[str, Any]:
        return dict(self._status[1])

    @property
    def latest_checkpoint(self) -> str | None:
        checkpoint = self._status[2]
        return None if checkpoint is None else str(checkpoint)


def _directory(rank: int, location: str) -> str:
    """``location``, refused unless a directory (a helper: the check blocks, briefly)."""
    if not os.path.isdir(location):
        raise ReportError(
            rank,
            "checkpoint",
            f"{location!r} is not a directory: on Ray a checkpoint is a local directory "
            "the worker wrote, which Ray persists into the run's storage",
        )
    return location


def _worker_main(config: dict[str, Any]) -> None:
    """A Ray Train worker: the user's ``train(reporter)`` on its own loop; its exception
    is made sendable here (one Ray cannot pickle would be lost in transit)."""
    context = ray.train.get_context()
    reporter = RayReporter(config["hub"], context.get_world_rank(), context.get_world_size())
    fn: WorkerFn = config["fn"]
    every: float | None = config["progress_every"]
    stop_telling = reporter.tell_progress(every) if every is not None else None
    try:
        anyio.run(fn, reporter)
    except Exception as exc:
        try:  # does it survive being pickled and rebuilt?
            ray.cloudpickle.loads(ray.cloudpickle.dumps(exc))
        except Exception:
            text = "".join(traceback.format_exception(exc))
            raise WorkerError(reporter.rank, type(exc).__qualname__, str(exc), text) from exc
        raise
    finally:
        if stop_telling is not None:
            stop_telling()


class _Forwarder(ray.train.UserCallback):  # type: ignore[misc]  # ray is untyped to mypy
    """In Ray's controller: rounds, failures and decisions to the hub, in numbered batches
    (a Ray call costs CPU taken from the workers: docs/trainers/ray.md)."""

    def __init__(self, hub: Any) -> None:
        self.hub = hub
        self._waiting: list[tuple[str, Any]] = []
        self._batches = 0
        self._sent_at = -_BATCH_S
        self._timer: asyncio.TimerHandle | None = None

    def after_report(
        self, run_context: Any, metrics: list[dict[str, Any]], checkpoint: Any | None
    ) -> None:
        path = None if checkpoint is None else str(checkpoint.path)
        self._waiting.append(("round", ([dict(m) for m in metrics], path)))
        wait = self._sent_at + _BATCH_S - time.monotonic()
        if wait <= 0:
            self.send()
        elif self._timer is None:
            try:
                self._timer = asyncio.get_running_loop().call_later(wait, self.send)
            except RuntimeError:  # not on Ray's loop (an older Ray): no batching
                self.send()

    def after_exception(self, run_context: Any, worker_exceptions: dict[int, Exception]) -> None:
        failures = {int(rank): exc for rank, exc in worker_exceptions.items()}
        self.send(("failures", failures))

    def send(self, *news: tuple[str, Any]) -> Any:
        """Send what waits, then ``news``, as the next batch; its Ray call's reference."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        batch, self._waiting = [*self._waiting, *news], []
        if not batch:
            return None
        self._batches += 1
        self._sent_at = time.monotonic()
        return self.hub.put.remote(self._batches - 1, batch)


class _ControllerHooks(ControllerCallback):  # type: ignore[misc]  # ray is untyped to mypy
    """In Ray's controller: Ray's restart decisions and the job's end, to the hub, after
    the rounds the forwarder holds."""

    def __init__(self, forwarder: _Forwarder) -> None:
        self.forwarder = forwarder  # the same object in the controller: Ray pickles both
        self.hub = forwarder.hub

    def after_controller_start(self, train_run_context: Any) -> None:
        ray.get(self.hub.set_controller.remote(ray.get_runtime_context().current_actor))

    def before_controller_execute_failure_decision(self, failure_decision: Any) -> None:
        name = getattr(failure_decision, "name", str(failure_decision))
        if name in ("RETRY", "RAISE"):
            ray.get(self.forwarder.send(("decision", name == "RETRY")))

    def after_controller_finish(self, result: Any) -> None:
        ray.get(self.forwarder.send(("closed", None)))

    def before_controller_abort(self) -> None:
        ray.get(self.forwarder.send(("closed", None)))


#: ``ray.init`` keywords that only shape a cluster it starts: joining one, Ray refuses them.
_NEW_CLUSTER_ONLY = (
    "num_cpus",
    "num_gpus",
    "resources",
    "labels",
    "object_store_memory",
    "_system_config",
)


def _init_keywords(init: Mapping[str, Any]) -> dict[str, Any]:
    """``init`` as ``ray.init`` takes it: joining a cluster, without what shapes a new one."""
    address = init.get("address") or os.environ.get("RAY_ADDRESS")
    if not address or address == "local":
        return dict(init)
    left_out = [name for name in _NEW_CLUSTER_ONLY if name in init]
    if left_out:
        _log.info(
            "joining a Ray cluster: the init keywords that shape a new one are left out",
            address=address,
            left_out=left_out,
        )
    return {name: value for name, value in init.items() if name not in left_out}


class RayEngine:
    """Runs ``open_run``'s workers as a Ray Train v2 job (``open_run(engine=RayEngine())``).

    ``world_size`` is the number of Ray workers, ``max_restarts=N`` is Ray's
    ``FailureConfig(max_failures=N)``, and ``state_dir`` (required) is the run's storage.
    The job is a ``TorchTrainer``, so ``torch.distributed`` is set up on the workers.

    Args:
        use_gpu: give each worker a GPU (``ScalingConfig(use_gpu=...)``).
        resources_per_worker: Ray resources per worker (``ScalingConfig``).
        init: ``ray.init`` keywords, used only when Ray is not initialised yet. Joining
            a cluster (``address=``, or ``RAY_ADDRESS``, which ``ray job submit`` sets),
            those that only shape a cluster Ray starts (``num_cpus``, ``num_gpus``,
            ``resources``, ...) are left out, which Ray would refuse: one script runs on
            a laptop and on a cluster.
    """

    def __init__(
        self,
        *,
        use_gpu: bool = False,
        resources_per_worker: Mapping[str, float] | None = None,
        init: Mapping[str, Any] | None = None,
    ) -> None:
        if not isinstance(use_gpu, bool):
            raise TypeError(f"use_gpu must be True or False, got {use_gpu!r}")
        self.use_gpu = use_gpu
        self.resources_per_worker = dict(resources_per_worker or {}) or None
        self.init = dict(init or {})

    def check(self, run: Run) -> None:
        """Refuse at ``open_run`` what a Ray job cannot run."""
        if run.state_dir is None:
            raise ValueError(
                "engine=RayEngine(...) needs state_dir=, the run's storage: Ray persists "
                "checkpoints there and the callback states are kept beside them"
            )
        if run.required_ranks is not None:
            raise ValueError("engine=RayEngine(...) gathers every rank: leave out required_ranks=")

    async def run_workers(self, run: Run, fn: WorkerFn, *, max_restarts: int) -> None:
        """Run ``fn(reporter)`` on ``run.world_size`` Ray workers until they all return."""
        assert run.state_dir is not None  # check() refused the run otherwise
        _check_sendable(fn)
        state_dir, latest = _absolute(run.state_dir), run.latest_checkpoint
        if latest is not None:
            latest = str(_absolute(latest))
        if not ray.is_initialized():
            taken = signal.getsignal(signal.SIGTERM)
            ray.init(**_init_keywords(self.init))
            if taken is not signal.SIG_DFL:  # the run's (or the user's): not Ray's exit
                signal.signal(signal.SIGTERM, taken)
        first_index = [run.first_index(rank) for rank in range(run.world_size)]
        status = ((run.should_stop, run.should_checkpoint), run.for_workers, latest)
        hub = ray.remote(num_cpus=0)(_Hub).remote(status, first_index)
        forwarder = _Forwarder(hub)
        # Progress is told only where stalls are watched: at most twice a period.
        watched = run.bus.options.stall_periods is not None
        every = run.bus.period / 2 if watched else None
        trainer = TorchTrainer(
            _worker_main,
            train_loop_config={"fn": fn, "hub": hub, "progress_every": every},
            scaling_config=ScalingConfig(
                num_workers=run.world_size,
                use_gpu=self.use_gpu,
                resources_per_worker=self.resources_per_worker,
            ),
            run_config=RunConfig(
                name=state_dir.name,
                storage_path=str(state_dir.parent),
                callbacks=[forwarder, _ControllerHooks(forwarder)],
                failure_config=FailureConfig(max_failures=max_restarts),
                checkpoint_config=CheckpointConfig(num_to_keep=None),
            ),
        )
        outcome: list[BaseException | None] = []
        pump = _Pump(run, hub, max_restarts)
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(pump.drain, lambda: bool(outcome))
                outcome.append(await _fit(trainer))
        except BaseException:
            # Abort the Ray job of a run that ends early (as Ray does on Ctrl-C).
            with anyio.CancelScope(shield=True), anyio.move_on_after(_LAST_WORDS_S):
                controller = await _get(hub.controller.remote())
                if controller is not None:
                    with contextlib.suppress(Exception):
                        await _get(controller.abort.remote())
            raise
        finally:
            with contextlib.suppress(Exception):
                ray.kill(hub)
        error = outcome[0]
        if pump.failures and not pump.retried:
            raise run.group_failed(pump.failures, pump.attempt, max_restarts)
        if error is not None:
            raise error


def _absolute(path: str | os.PathLike[str]) -> Path:
    """``path`` resolved in the driver's folder: Ray's workers run in folders of their own."""
    return Path(os.path.realpath(path))


def _check_sendable(fn: WorkerFn) -> None:
    """Refuse, before the job starts, a worker function Ray cannot send."""
    try:
        ray.cloudpickle.dumps(fn)
    except Exception as exc:
        name = getattr(fn, "__qualname__", repr(fn))
        raise TypeError(
            f"engine=RayEngine(): the worker function {name} cannot be sent to Ray's "
            f"workers ({type(exc).__name__}: {exc}): what it refers to must pickle; "
            "make locks, open files and clients inside it"
        ) from None


async def _fit(trainer: TorchTrainer) -> BaseException | None:
    """Ray's ``fit()`` in a thread (it blocks): the exception it raised, if any."""

    def fit() -> BaseException | None:
        try:
            trainer.fit()
        except Exception as exc:
            return exc
        return None

    return await anyio.to_thread.run_sync(fit, abandon_on_cancel=True)


async def _get(ref: Any) -> Any:
    return await anyio.to_thread.run_sync(ray.get, ref, abandon_on_cancel=True)


class _Pump:
    """The driver's side: the hub's news into the run, as its own tasks would report."""

    def __init__(self, run: Run, hub: Any, max_restarts: int) -> None:
        self.run = run
        self.hub = hub
        self.max_restarts = max_restarts
        self.attempt = 0
        self.rounds = 0
        #: The failures of the latest failed attempt, and whether Ray restarts after them.
        self.failures: dict[int, BaseException] = {}
        self.retried = False

    async def drain(self, fit_ended: Callable[[], bool]) -> None:
        ended_at: float | None = None
        handled = None
        while True:
            news, closed = await _get(self.hub.take.remote(_TAKE_WAIT_S, handled))
            handled = await self._handle(news)
            if closed:
                return
            if fit_ended():  # the controller may have died without its last words
                now = anyio.current_time()
                ended_at = ended_at if ended_at is not None else now
                if not news and now - ended_at > _LAST_WORDS_S:
                    return

    async def _handle(
        self, news: list[tuple[str, Any]]
    ) -> tuple[int, _Stops, dict[str, Any]] | None:
        """Feed ``news`` into the run; returns what its callbacks handled, if rounds came."""
        run = self.run
        rounds = 0
        for kind, payload in news:
            if kind == "round":  # gathered by Ray: the run takes it whole
                metrics, checkpoint = payload
                await run.report_round(metrics, checkpoint=checkpoint)
                rounds += 1
            elif kind == "failures":
                self.failures, self.retried = payload, False
                for rank, exc in sorted(payload.items()):
                    await run.worker_failed(rank, exc, self.attempt)
            elif kind == "decision" and payload:
                self.attempt += 1
                self.retried = True
                await run.group_restarting(self.failures, self.attempt, self.max_restarts)
            elif kind == "progress":  # each rank's latest report entered, and how long ago
                for rank, (index, ago) in payload.items():
                    run.heard(rank, index, ago)
        if rounds:
            self.rounds += rounds
            await run.wait_gathered(0)  # whole rounds: no rank's report waits for another
            return self.rounds, (run.should_stop, run.should_checkpoint), run.for_workers
        return None
