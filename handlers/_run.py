"""The run composition API for async trainers: ``async with open_run(...) as run``, the one
call that composes a run, checking every argument at the call.

``before_run`` and ``after_run`` happen exactly once on every way out, so the bus runs in
its own task under a shielded scope: a cancelled body still gets its ``after_run``.
"""

from __future__ import annotations

import math
import os
import signal
import time
from collections.abc import (
    AsyncIterator,
    Awaitable,
    Callable,
    Iterable,
    Iterator,
    Mapping,
    Sequence,
)
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any, Protocol, Self, Unpack

import anyio
import anyio.abc
import anyio.lowlevel

from eventbus import (
    BusClosed,
    CheckpointSaved,
    EventBus,
    RankStalled,
    RoundGathered,
    RunFinished,
    RunResult,
    RunStatus,
    StateRestored,
    TrainRunContext,
    WorkerFailure,
    WorkerGroupRestarted,
)
from eventbus._clock import Clock, MonotonicClock
from eventbus._holds import holding
from eventbus._logging import get_logger
from eventbus._options import OptionTypeError
from eventbus._stages import Stage
from eventbus._subscription import Subscription
from eventbus._text import describe as describe_exception
from eventbus.log import LogRecorder
from eventbus.options import OptionError, checked
from eventbus.state import StateStore

from ._attach import CallbackAttachment
from ._callback import UserCallback
from ._core import RunCore
from ._ending import interrupt_in, only_cancellations, status_of
from ._errors import RankStalledError, WorkerError, WorkerGroupError
from ._options import Restarts, RunKeywords, RunOptions
from ._reporter import Reporter, checkpoint_location, stopping_lanes, values_for_workers
from ._resume import Resume, resume_point
from ._signals import Preempted, takes_signals, watch_signals

__all__ = ["Run", "TrainingCallback", "WorkerEngine", "WorkerFn", "open_run"]

_log = get_logger("handlers.run")

#: How long a hurried end waits for what was published (the log's last records), seconds.
_HURRIED_DRAIN = 1.0

WorkerFn = Callable[[Reporter], Awaitable[Any]]


class Run(anyio.AsyncContextManagerMixin):
    """A training run: its bus, its callbacks, its workers. Made by ``open_run``.

    Making a run checks its arguments; entering it (``async with``) reads the snapshot it
    resumes from, restores the callbacks, attaches the state store, opens the log, starts
    the bus and attaches the callbacks, failing before anything started if it cannot.
    Leaving it ends the run in order, whatever ended it. A run is entered once. Its
    arguments are ``open_run``'s, its keywords made into ``options`` (``RunOptions``).
    """

    def __init__(
        self,
        *,
        options: RunOptions,
        callbacks: Iterable[UserCallback | Any],
        name: str,
        run_id: str | None,
        storage: str | os.PathLike[str] | None,
        config: dict[str, Any] | None,
        clock: Clock | None,
        log: str | os.PathLike[str] | None = None,
        state_dir: str | os.PathLike[str] | None = None,
        resume_from: str | os.PathLike[str] | None = None,
        strict_state: bool = False,
        allow_fresh_state: bool = False,
        engine: WorkerEngine | None = None,
    ) -> None:
        if resume_from is not None and state_dir is None:
            raise ValueError("resume_from= needs state_dir=, where the callback states were saved")
        self.options = options
        self.world_size = options.world_size
        self.required_ranks = options.required_ranks
        self.name = name
        if storage is None and state_dir is not None:
            storage = Path(state_dir).resolve()  # the run's storage root, for its callbacks
        self.storage = os.fspath(storage) if storage is not None else None
        #: Where checkpoints and callback states are kept (resolved), if anywhere.
        self.state_dir = Path(state_dir).resolve() if state_dir is not None else None
        self.config = dict(config or {})
        self.bus = EventBus(options, clock=clock, on_failure=self._end_from_inside)
        self.state_store = StateStore(state_dir, strict=strict_state) if state_dir else None
        self.core = RunCore(
            callbacks,
            name=name,
            world_size=options.world_size,
            required_ranks=options.required_ranks,
            run_id=run_id,
            config=self.config,
            storage=self.storage,
            store=self.state_store,
        )
        self._resume_from = resume_from
        self._allow_fresh_state = allow_fresh_state
        self._log_path = log
        self.status: RunStatus | None = None
        self._stop_requested = False
        self._stop_reason: str | None = None
        self._reporters: dict[int, Reporter] = {}
        self._tg: anyio.abc.TaskGroup | None = None
        self._bus_ready = anyio.Event()
        self._bus_stop = anyio.Event()
        self._bus_error: BaseException | None = None
        #: What ended the run from inside (a callback's on_error="raise", an interrupt).
        self._ended_by: BaseException | None = None
        self._workers = WorkerTasks()
        #: The preemption signal the run got, and the rounds gathered by then.
        self._preempted_by: int | None = None
        self._preempted_at = 0
        #: A second preemption signal came: what is left of the callbacks' work is skipped.
        self._hurried = False
        self._watchers: anyio.abc.TaskGroup | None = None
        self._draining: anyio.CancelScope | None = None
        self._entered: float | None = None
        #: What ``wait_gathered`` waits on, set whenever the rounds may have moved; made
        #: (and subscribed) at the first wait, so runs that never sync pay nothing.
        self._moved: anyio.Event | None = None
        #: When a report next gives the loop a turn: one time for all the run's workers.
        self.turn_due = 0.0
        #: The lanes ``wait_gathered`` waits for: those of callbacks with a ``should_stop``.
        self._stopping_lanes: tuple[Subscription, ...] = ()
        self.engine = engine
        #: The callbacks whose ``for_workers`` was not JSON (said once each).
        self._unsendable: set[str] = set()
        #: The worker group running now (its scope and failures): a stall may end it.
        self._group: tuple[anyio.CancelScope, dict[int, BaseException]] | None = None
        if engine is not None and options.on_stall == "restart":
            raise OptionError(
                "on_stall",
                f"on_stall='restart' restarts this process's worker tasks; "
                f"{type(engine).__name__} cannot restart a stalled rank: use on_stall='warn'",
            )
        if engine is not None:
            engine.check(self)
        #: Whether this process hosts the run (not so on torchrun's ranks but 0).
        self.hosted: bool = getattr(engine, "hosts_run", True)

    # --- what trainers use ---------------------------------------------------------

    @property
    def run_id(self) -> str:
        """The run's id; a resumed run takes the saved run's on entering, unless given one."""
        return self.core.run_id

    @property
    def callbacks(self) -> list[Any]:
        """The training callbacks (the restored ones, once a resumed run was entered)."""
        return self.core.callbacks

    @property
    def attachment(self) -> CallbackAttachment | None:
        """The callbacks and their gatherers on the run's bus, once entered."""
        return self.core.attachment

    @property
    def resume(self) -> Resume | None:
        return self.core.resume

    @property
    def restored(self) -> StateRestored | None:
        return self.core.restored

    @property
    def recorder(self) -> LogRecorder | None:
        return self.core.recorder

    @property
    def context(self) -> TrainRunContext | None:
        return self.attachment.run_context if self.attachment else None

    @property
    def result(self) -> RunResult:
        """``after_run``'s result once the run is over (after ``async with``), its callbacks'
        costs brought up to the bus's close; ``RuntimeError`` (saying why) before, or if the
        bus failed before delivering ``RunFinished``."""
        result = self.core.result
        if result is not None:
            return result
        if self._entered is None:
            why = "the run has not started (enter it: `async with open_run(...) as run:`)"
        elif not self.hosted:
            why = "another process hosts it (torchrun's rank 0): read it there"
        elif self.status is None:
            why = "the run is still running (read run.result after its `async with` block)"
        else:
            why = f"the run ended ({self.status}) but its bus failed before delivering it"
        raise RuntimeError(f"run {self.run_id} has no result: {why}")

    @property
    def restarts(self) -> int:
        """How many times the worker group restarted (the gathering counts them)."""
        return self.attachment.reports.restarts if self.attachment else 0

    @property
    def latest_checkpoint(self) -> str | None:
        """The checkpoint of the latest complete round that had one (where a restart
        resumes); in a resumed run, until its first, the one it resumed from."""
        return self.attachment.reports.last_checkpoint if self.attachment else None

    def first_index(self, rank: int) -> int:
        """The index of ``rank``'s first report (a resumed run continues them)."""
        return self.core.first_index(rank)

    @property
    def should_stop(self) -> bool:
        """Whether the run was asked to stop, was preempted a round ago, or a callback's
        ``should_stop`` is true, read every time: a callback may set it at any time."""
        if self._stop_requested or (
            self._preempted_by is not None and self._rounds_since_preempted() > 1
        ):
            return True
        for callback in self.core.callbacks:  # a loop: faster than any() (read every step)
            if getattr(callback, "should_stop", False) is True:
                return True
        return False

    @property
    def should_checkpoint(self) -> bool:
        """Whether the workers should checkpoint at their next step: the run was told
        to stop by SIGTERM (``Reporter.should_checkpoint``)."""
        return self._rounds_since_preempted() > 0

    def _rounds_since_preempted(self) -> int:
        """Rounds gathered since a preemption signal (0 without one): counted in rounds,
        so that every rank sees the checkpoint and the stop as of the same round."""
        if self._preempted_by is None or self.attachment is None:
            return 0
        return self.attachment.reports.rounds - self._preempted_at

    @property
    def for_workers(self) -> dict[str, Any]:
        """What the callbacks hand the workers now: each callback's ``for_workers``
        (a small JSON value, say ``{"lr": 0.01}``) under its class name, as a copy
        (``reporter.from_callbacks``). A value that is not JSON is left out, said once."""
        return values_for_workers(self.callbacks, self._unsendable)

    def request_stop(self, reason: str | None = None) -> None:
        """Ask the workers to stop (they read ``should_stop``); the run's result says why."""
        self._stop_requested = True
        self._stop_reason = reason

    def has_ended(self, rank: int) -> bool:
        """Whether ``rank``'s worker ran and ended (returned or failed): no report of
        it comes until the group restarts."""
        reporter = self._reporters.get(rank)
        return reporter is not None and reporter.ended

    async def wait_gathered(self, rank: int) -> None:
        """Return once every report ``rank`` made was gathered into a round (or discarded
        by a restart) and the callbacks that can stop the run (inline ones, and lanes with a
        ``should_stop``) handled it, or once that round cannot complete (``Reporter.sync``).
        """
        while True:
            await self.bus.wait_idle(lanes=self._stopping_lanes)
            gathering = self.attachment.reports if self.attachment else None
            if (  # no report of rank waits for a round that can still complete
                gathering is None
                or not gathering.waiting_from(rank)
                or any(self.has_ended(lacking) for lacking in gathering.lacking())
            ):
                return
            if self._moved is None:
                self._moved = anyio.Event()
                moved = (RoundGathered, WorkerGroupRestarted, RunFinished)
                self.bus.subscribe(moved, self._wake, name="Reporter.sync", order=Stage.OBSERVE)
            await self._moved.wait()

    def _wake(self, event: object = None) -> None:
        """The rounds may have moved: wake a ``wait_gathered`` (a round, a restart, an end)."""
        if self._moved is not None:
            self._moved.set()
            self._moved = anyio.Event()

    def reporter(self, rank: int) -> Reporter:
        """The reporter of ``rank`` (one per rank, kept across restarts), inside the run:
        where its reports start is known once the run has been entered."""
        if self._entered is None:
            raise RuntimeError("take reporters inside `async with open_run(...) as run`")
        if not 0 <= rank < self.world_size:
            raise ValueError(f"rank {rank} is outside world size {self.world_size}")
        reporter = self._reporters.get(rank)
        if reporter is None:
            reporter = self._reporters[rank] = Reporter(self, rank)
        return reporter

    async def report_round(
        self,
        metrics: Sequence[Mapping[str, Any]],
        checkpoint: str | os.PathLike[str] | None = None,
    ) -> None:
        """Report a whole round a framework gathered already (Ray's controller, Lightning's
        all-gather): ``metrics[i]`` of the i-th required rank, and the round's ``checkpoint``.

        Checked as each rank's report is (``ReportError``, nothing taken); refused
        (``RuntimeError``) while a rank's reports wait for their round: it would overtake them.
        """
        attachment = self.attachment
        if self._entered is None or attachment is None:
            raise RuntimeError("report rounds inside `async with open_run(...) as run`")
        gathering = attachment.reports
        location = None
        if checkpoint is not None:
            location = checkpoint_location((gathering.required_ranks or (0,))[0], checkpoint)
        await self.bus.publish_many(gathering.take_round(self.run_id, metrics, location))

    def heard(self, rank: int, index: int, ago: float = 0.0) -> None:
        """Say that ``rank`` made its report ``index`` (or waits in it) ``ago`` seconds ago:
        where rounds come whole, only progress shows which rank stalled."""
        attachment = self.attachment
        if self._entered is None or attachment is None:
            raise RuntimeError("tell progress inside `async with open_run(...) as run`")
        if type(ago) not in (int, float) or not 0 <= ago < math.inf:
            raise ValueError(f"progress of rank {rank}: ago must be seconds >= 0, got {ago!r}")
        at = self.bus.clock.now() - ago
        attachment.reports.heard(self.run_id, rank, index, at)

    async def checkpoint_saved(
        self,
        location: str,
        index: int,
        ranks: Iterable[int] = (),
        metrics: dict[str, Any] | None = None,
    ) -> None:
        """Announce a checkpoint saved outside of reports (reported ones are announced for you)."""
        await self.bus.publish(
            CheckpointSaved(
                run_id=self.run_id,
                checkpoint=location,
                index=index,
                ranks=tuple(ranks),
                metrics=dict(metrics or {}),
            )
        )

    def start_worker(self, rank: int, fn: WorkerFn) -> None:
        """Run ``fn(reporter)`` as a task the run waits for before it finishes; an exception
        escaping it becomes a ``WorkerFailure``."""
        if self._tg is None:
            raise RuntimeError("start workers inside `async with open_run(...) as run`")
        reporter = self.reporter(rank)
        self._workers.scheduled()
        self._tg.start_soon(self._guarded_worker, reporter, fn, None, name=f"worker-{rank}")

    async def workers(
        self, fn: WorkerFn, *, ranks: Iterable[int] | None = None, max_restarts: int = 0
    ) -> None:
        """Run ``fn(reporter)`` for each rank and wait for all of them.

        When a worker fails, the whole group is stopped and, while ``max_restarts``
        allows, restarted after a ``WorkerGroupRestarted`` (workers resume from
        ``reporter.latest_checkpoint``); otherwise ``WorkerGroupError``. An ``engine``
        runs them with the same events and errors.
        """
        max_restarts = checked("max_restarts", max_restarts, Restarts)
        if self.engine is not None:
            if ranks is not None and sorted(set(ranks)) != list(range(self.world_size)):
                raise ValueError(f"{type(self.engine).__name__} runs every rank: leave out ranks=")
            await self.engine.run_workers(self, fn, max_restarts=max_restarts)
            return
        group = sorted(range(self.world_size) if ranks is None else set(ranks))
        outside = [rank for rank in group if not 0 <= rank < self.world_size]
        if outside:
            raise ValueError(f"ranks {outside} are outside world size {self.world_size}")
        attempt = 0
        while True:
            failures = await self._run_group(fn, group, attempt)
            if not failures:
                return
            if attempt >= max_restarts:
                raise self.group_failed(failures, attempt, max_restarts)
            attempt += 1
            required = tuple(group) if ranks is not None else ()
            await self.group_restarting(failures, attempt, max_restarts, required)

    def group_failed(
        self, failures: dict[int, BaseException], attempt: int, max_restarts: int
    ) -> WorkerGroupError:
        """Say that the group failed for good, and return the error to raise."""
        _log.error(
            f"worker group failed: rank(s) {_ranks(failures)}; no restart left "
            f"({attempt} of max_restarts={max_restarts} used)",
            run_id=self.run_id,
        )
        return WorkerGroupError(failures)

    async def group_restarting(
        self,
        failures: dict[int, BaseException],
        attempt: int,
        max_restarts: int,
        required_ranks: tuple[int, ...] = (),
    ) -> None:
        """Say that the group restarts, publish ``WorkerGroupRestarted`` and return once the
        callbacks handled it, so ``after_exception`` hears of the failures before the
        restarted group's first round."""
        await self.bus.wait_idle()  # so latest_checkpoint has every gathered round
        _log.warning(
            f"restarting the worker group after rank(s) {_ranks(failures)} failed: "
            f"restart {attempt} of {max_restarts}",
            run_id=self.run_id,
            resume_from=self.latest_checkpoint,
        )
        await self.bus.publish(
            WorkerGroupRestarted(
                run_id=self.run_id, world_size=self.world_size, required_ranks=required_ranks
            )
        )
        await self.bus.wait_idle()

    async def worker_failed(self, rank: int, exc: Exception, attempt: int) -> None:
        """Say that ``rank``'s worker failed with ``exc`` and publish its
        ``WorkerFailure`` (callbacks' ``after_exception`` get ``exc`` itself)."""
        said = describe_exception(exc)
        _log.warning(
            f"worker rank {rank} failed: {said[:1000]}", run_id=self.run_id, attempt=attempt
        )
        if isinstance(exc, WorkerError):  # already text (made sendable where it was raised)
            failure = exc.to_failure(self.run_id)
        else:
            failure = WorkerFailure.from_exception(self.run_id, rank, exc)
        if self.attachment is not None:
            self.attachment.keep_original(failure, exc)
        await self.bus.publish(failure)

    async def _run_group(
        self, fn: WorkerFn, ranks: list[int], attempt: int
    ) -> dict[int, BaseException]:
        failures: dict[int, BaseException] = {}
        try:
            async with anyio.create_task_group() as tg:
                self._group = (tg.cancel_scope, failures)
                for rank in ranks:
                    reporter = self.reporter(rank)
                    reporter.attempt = attempt
                    self._workers.scheduled()
                    tg.start_soon(self._guarded_worker, reporter, fn, self._group)
        finally:
            self._group = None
        return failures

    def _stalled(self, stall: RankStalled) -> None:
        """``on_stall="restart"``: a stalled rank is a failure of that rank, so the
        group ends and ``workers`` restarts it (callbacks heard of the stall already)."""
        if self._group is not None:
            scope, failures = self._group
            failures.setdefault(stall.rank, RankStalledError(stall))
            scope.cancel()

    def counting_holds(self, work: Awaitable[Any]) -> Awaitable[Any]:
        """``work``, a worker in this loop, whose steps' time holding the loop the bus
        charges no async callback (on a real clock: a virtual one has no such time)."""
        if isinstance(self.bus.clock, MonotonicClock):
            return holding(work, self.bus.loop_holds)
        return work

    async def _guarded_worker(
        self,
        reporter: Reporter,
        fn: WorkerFn,
        group: tuple[anyio.CancelScope, dict[int, BaseException]] | None,
    ) -> None:
        with self._workers.running():
            reporter.ended = False
            try:
                await self.counting_holds(fn(reporter))
            except Exception as exc:
                await self.worker_failed(reporter.rank, exc, reporter.attempt)
                if group is not None:
                    group_scope, failures = group
                    failures[reporter.rank] = exc
                    group_scope.cancel()
            except (KeyboardInterrupt, SystemExit) as exc:
                self._end_from_inside(exc)  # not a worker failure: the run ends
            finally:
                reporter.ended = True
                self._wake()  # a sync waiting for this rank's report stops

    # --- lifecycle ------------------------------------------------------------------

    def _end_from_inside(self, exc: BaseException) -> None:
        """The bus's ``on_failure``, and workers' interrupts: stop the body and the
        workers; leaving the run then finishes it in order and raises ``exc``."""
        if self._ended_by is None:
            self._ended_by = exc
        self._workers.cancel_all()
        if self._tg is not None:
            self._tg.cancel_scope.cancel()

    @asynccontextmanager
    async def __asynccontextmanager__(self) -> AsyncIterator[Self]:
        """Prepare the run (what can refuse it does so before anything starts), start it,
        run the body, end the run in order; raise what ended it, never the cancellations
        that ending caused."""
        if self._entered is not None:
            raise RuntimeError("a run can be entered only once: open another with open_run(...)")
        self._entered = time.monotonic()
        if not self.hosted:
            yield self
            return
        self._prepare()
        cancelled_class = anyio.get_cancelled_exc_class()
        started = False
        start_error: BaseException | None = None
        exc: BaseException | None = None
        try:
            # The log is created here, in one step: of two runs given one path only the
            # first records, and a run never entered leaves no file.
            self.core.open_log(self._log_path)
            self._stopping_lanes = stopping_lanes(self.core.open(self.bus))
            if self.options.on_stall == "restart":
                self.bus.subscribe(RankStalled, self._stalled, name="handlers.Run.on_stall")
            try:
                async with anyio.create_task_group() as tg:
                    self._tg = tg
                    try:
                        tg.start_soon(self._host_bus, name="eventbus")
                        await self._bus_ready.wait()
                        if self._bus_error is not None:
                            raise self._bus_error
                        await self.bus.publish(self.core.started())
                    except BaseException as error:
                        self._bus_stop.set()
                        start_error = error
                        raise
                    started = True
                    try:
                        try:  # before_run returns before any worker, then the resume is said
                            await self.bus.wait_idle()
                            for event in self.core.after_start():
                                await self.bus.publish(event)
                        except BaseException as before_run:
                            exc = before_run
                        else:
                            try:
                                yield self
                            except BaseException as body:
                                exc = body
                        exc, cancelled = await self._end(exc)
                    finally:
                        # The bus is shielded and stops only when told: an interrupt
                        # inside the end (a second Ctrl-C) must not leave it waiting.
                        self._bus_stop.set()
                    if cancelled and exc is not None:
                        raise exc  # the task group takes a cancellation of its own scope
            except BaseException as group:
                # Once the run has ended from inside, the cancellations it caused are
                # its fallout: the exception that ended it replaces them, below.
                if started and self._ended_by is None:  # an interrupt inside the end
                    interrupt = interrupt_in(group)
                    if interrupt is not None and interrupt is not group:
                        raise interrupt.with_traceback(interrupt.__traceback__) from None
                if not started or self._ended_by is None:
                    raise
                if not only_cancellations(group, cancelled_class):
                    raise
        finally:
            self.core.close_log()  # also when cancelled while entering: the file stays closed
        if not started:  # the task group took the start's cancellation as its own
            raise RuntimeError("the run was stopped while it started") from start_error
        ended_by = self._ended_by  # after_run itself may have raised an interrupt
        if ended_by is not None:
            raise ended_by.with_traceback(ended_by.__traceback__) from None
        if self._bus_error is not None and exc is None:
            raise self._bus_error
        if exc is not None:
            raise exc
        if self._preempted_by is not None:
            raise Preempted(self._preempted_by)

    def _prepare(self) -> None:
        """Read what the run resumes from (the position first, so that a bad one refuses
        the resume before any callback changed) and restore the callbacks, or register them."""
        store = self.state_store
        if store is not None:
            resume_from = self._resume_from
            if resume_from is not None:
                resume_from = resume_point(resume_from, run_dir=store.root, log=self._log_path)
            if resume_from is not None:
                resume = Resume.load(store, resume_from)
                callbacks, restored = store.restore(
                    self.callbacks,
                    resume_from,
                    in_place=True,
                    require_snapshot=not self._allow_fresh_state,
                )
                self.core.resumed(resume, callbacks, restored)
            else:
                store.register(self.callbacks)

    async def _host_bus(self) -> None:
        """The bus, and the preemption signals' watcher, until the run's end is delivered."""
        with anyio.CancelScope(shield=True):
            try:
                async with self.bus:
                    async with anyio.create_task_group() as watchers:
                        self._watchers = watchers
                        if takes_signals():
                            watchers.start_soon(watch_signals, self._preempted, self._hurry)
                        self._bus_ready.set()
                        await self._bus_stop.wait()
                        watchers.cancel_scope.cancel()
                    if self._hurried:
                        await self.bus.aclose(drain=False)
            except Exception as exc:  # a handler with on_error="raise" failed the bus
                self._bus_error = exc
                self._bus_ready.set()

    def _preempted(self, signum: int) -> None:
        """The first preemption signal: the workers checkpoint and stop, the run ends
        ``preempted``; what has not ended within ``preempt_grace`` is abandoned."""
        name, grace = signal.Signals(signum).name, self.options.preempt_grace
        _log.warning(
            f"{name}: preempting run {self.run_id}: workers checkpoint at their next step "
            f"and stop; it ends in order within preempt_grace={grace:g} s ({name} again "
            "skips what is left of the callbacks' work)"
        )
        self._preempted_by = signum
        self._preempted_at = self.attachment.reports.rounds if self.attachment else 0
        self._wake()
        if self._watchers is not None:
            self._watchers.start_soon(self._grace_period, signum)

    async def _grace_period(self, signum: int) -> None:
        await anyio.sleep(self.options.preempt_grace)
        self._hurry(
            signum,
            f"run {self.run_id} did not end within preempt_grace="
            f"{self.options.preempt_grace:g} s of {signal.Signals(signum).name}: "
            "what is left is abandoned; the log is closed whole",
        )

    def _hurry(self, signum: int, why: str | None = None) -> None:
        """A second signal, or the grace period over (``why``): skip what is left of the
        callbacks' work, keeping only a moment for the log's last records."""
        _log.warning(
            why
            or f"{signal.Signals(signum).name} again: skipping what is left of the callbacks' "
            "work; the log is closed whole"
        )
        self._end_from_inside(Preempted(signum))
        self._hurried = True
        if self._draining is not None:
            self._draining.cancel()

    async def _end(self, exc: BaseException | None) -> tuple[BaseException | None, bool]:
        """End the run the body left with ``exc`` (``None``: it returned): wait for or stop
        the workers, handle what was reported, publish ``RunFinished``, stop the bus.
        Returns the exception that stands for the body and whether the run was cancelled."""
        cancelled_class = anyio.get_cancelled_exc_class()
        # An interrupt that reached the body (trio raises KeyboardInterrupt where the
        # main task is, possibly inside a task group) ends the run like one from inside.
        interrupt = interrupt_in(exc)
        if interrupt is not None and self._ended_by is None:
            self._ended_by = interrupt
        cancelled = isinstance(exc, cancelled_class) or (
            self._ended_by is not None and only_cancellations(exc, cancelled_class)
        )
        if exc is None:
            try:
                await self._workers.wait_all()
                await anyio.lowlevel.checkpoint()  # a cancellation pending since the body ended
            except cancelled_class as inner:
                cancelled, exc = True, inner
        self._workers.cancel_all()
        with anyio.CancelScope(shield=True):
            await self._workers.wait_all()
            # What was reported is handled before the run's status is decided: a callback
            # may still end the run (an interrupt) while it handles the last rounds.
            await self._drain()
            ended_by = self._ended_by
            if ended_by is not None:
                self.status, error = status_of(ended_by)
            elif exc is None and self._preempted_by is not None:  # the workers stopped
                self.status, error = status_of(Preempted(self._preempted_by))
            elif exc is None:
                self.status, error = "finished", None
            elif cancelled:
                self.status, error = "cancelled", None
            else:
                self.status, error = "failed", describe_exception(exc)
            await self._finish(self.status, error)
            self._bus_stop.set()
        return exc, cancelled

    async def _drain(self) -> None:
        """Wait (at most ``drain_timeout``) until everything published was handled."""
        if self._bus_error is None:
            # Hurried (a second signal, the grace period over): a moment for the log's
            # records, not for the callbacks' work.
            timeout = _HURRIED_DRAIN if self._hurried else self.bus.drain_timeout
            with anyio.move_on_after(timeout) as self._draining:
                await self.bus.wait_idle()
            self._draining = None

    async def _finish(self, status: RunStatus, error: str | None) -> None:
        if self._bus_error is not None:
            return
        try:
            stopped = ("Run.request_stop", self._stop_reason) if self._stop_requested else None
            await self.bus.publish(self.core.finished(status, error, stopped=stopped))
            await self._drain()
            if self._entered is not None:
                self.core.say_end(time.monotonic() - self._entered)
        except (BusClosed, RuntimeError) as exc:  # the bus failed: nothing more can be delivered
            _log.warning("run finished without delivering RunFinished", error=repr(exc))


class WorkerEngine(Protocol):
    """Where a run's workers run (``open_run(engine=...)``): the run keeps all callbacks
    see, the engine only feeds back what the workers reported, so moving a job to a
    cluster changes this argument alone. ``check`` refuses a run at ``open_run``;
    ``run_workers`` is ``Run.workers`` there. With ``hosts_run = False`` (torchrun's ranks
    but 0) the run here is hollow: entering starts nothing, ``workers`` runs this
    process's worker."""

    def check(self, run: Run) -> None: ...

    async def run_workers(self, run: Run, fn: WorkerFn, *, max_restarts: int) -> None: ...


class WorkerTasks:
    """Counts a run's workers from when they are scheduled (the run must not finish before
    one runs) and cancels them all at once, also one that starts after that."""

    def __init__(self) -> None:
        self._scopes: set[anyio.CancelScope] = set()
        self._cancelled = False
        self._active = 0
        self._done: anyio.Event | None = None

    def scheduled(self) -> None:
        self._active += 1
        if self._done is None or self._done.is_set():
            self._done = anyio.Event()

    @contextmanager
    def running(self) -> Iterator[None]:
        """Run one scheduled worker under a scope ``cancel_all`` reaches; it ends on exit."""
        try:
            with anyio.CancelScope() as scope:
                self._scopes.add(scope)
                if self._cancelled:
                    scope.cancel()
                try:
                    yield
                finally:
                    self._scopes.discard(scope)
        finally:
            self._active -= 1
            if self._active == 0 and self._done is not None:
                self._done.set()

    def cancel_all(self) -> None:
        self._cancelled = True
        for scope in list(self._scopes):
            scope.cancel()

    async def wait_all(self) -> None:
        """Return once every scheduled worker has ended."""
        if self._done is not None:
            await self._done.wait()


class _HasState(Protocol):
    """A callback with state only (``state()``), no hooks: the state store keeps it."""

    def state(self) -> Mapping[str, Any]: ...


#: What a run takes as a callback: a ``UserCallback`` (or its hooks), or state only.
TrainingCallback = UserCallback | _HasState


def open_run(
    *,
    callbacks: Iterable[TrainingCallback] = (),
    name: str = "run",
    run_id: str | None = None,
    storage: str | os.PathLike[str] | None = None,
    config: dict[str, Any] | None = None,
    clock: Clock | None = None,
    log: str | os.PathLike[str] | None = None,
    state_dir: str | os.PathLike[str] | None = None,
    resume_from: str | os.PathLike[str] | None = None,
    strict_state: bool = False,
    allow_fresh_state: bool = False,
    options: RunOptions | None = None,
    engine: WorkerEngine | None = None,
    **keywords: Unpack[RunKeywords],
) -> Run:
    """Open a run: ``async with open_run(world_size=4, callbacks=[...]) as run:``.

    ``RunStarted``/``RunFinished`` and ``before_run``/``after_run`` happen exactly once,
    also when the body fails or is cancelled. Bad arguments raise here (``OptionError``,
    ``ValueError``, ``TypeError``, naming them); entering the run fails before anything
    starts if its files cannot be read or written. ``options``: a ``RunOptions``, the
    keywords changing it. Relative paths are taken from the current directory.

    Args:
        world_size: how many ranks report (1 to 131,072).
        required_ranks: the ranks a round waits for (default: all).
        period: the health-check period, seconds (default 2, as Ray Train's).
        timeout: the default deadline of one callback call, seconds (default 30).
        budget: the callbacks' share of a period (default 0.05).
        buffer: events the bus holds before reporters wait (default 1024).
        drain_timeout: how long the run's end waits for callbacks, seconds (at least
            0.1, default 10); what is left is counted and said.
        stall_periods: periods of silence after which a rank the others wait for has
            stalled: a ``RankStalled`` and ``after_exception`` with
            ``{rank: RankStalledError}`` (default ``None``: not watched).
        on_stall: ``"warn"`` (default), or ``"restart"`` the group (local tasks only).
        callbacks: training callbacks (``UserCallback``s, objects with its hooks, or
            with state only).
        log: record every event of the run to this file (msgpack, or JSON Lines for
            ``.jsonl``); never overwritten: only a resumed run appends to it.
        state_dir: snapshot every stateful callback at every checkpoint, into it; the
            run's storage root. A reported checkpoint outside it is copied in, to
            ``checkpoint_<index>``, and callbacks get the copy's path.
        resume_from: continue the run from this checkpoint, or the latest complete
            one in this run directory: callbacks get their saved states in place
            (mismatches are warnings; ``strict_state=True`` raises), and the run
            keeps its id, rounds and report indices. A checkpoint without saved
            states is an error unless ``allow_fresh_state``.
        preempt_grace: how long a run told to stop by SIGTERM takes to end in order,
            seconds (default 25; keep it under what the scheduler gives); then it raises
            ``handlers.Preempted`` (exit 143).
        engine: where ``run.workers(train)`` runs the workers: this process's tasks by
            default, or ``adapters.ray.RayEngine()`` (needs ``state_dir``).
    """
    ranks = keywords.get("required_ranks")
    if ranks is not None and not isinstance(ranks, list | tuple):
        try:
            keywords["required_ranks"] = tuple(ranks)
        except TypeError:
            raise OptionTypeError(
                "required_ranks", f"required_ranks must be ranks (ints), got {ranks!r}"
            ) from None
    return Run(
        options=RunOptions.build(options, **keywords),
        callbacks=callbacks,
        name=name,
        run_id=run_id,
        storage=storage,
        config=config,
        clock=clock,
        log=log,
        state_dir=state_dir,
        resume_from=resume_from,
        strict_state=strict_state,
        allow_fresh_state=allow_fresh_state,
        engine=engine,
    )


def _ranks(failures: dict[int, BaseException]) -> str:
    return ", ".join(str(rank) for rank in sorted(failures))
