"""What the trainer adapters share: one run at a time on a bus host, driven from the
trainer's thread. A callback's failure of the run is raised at the next hand-off, after
``after_run``, as ``open_run`` raises it."""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from eventbus import BusClosed, Event, EventBus, RunStatus, StateRestored, WorkerFailure
from eventbus._bus import CloseReport
from eventbus._logging import get_logger
from eventbus._subscription import Subscription
from eventbus._text import describe as describe_exception
from eventbus.state import StateError, StateStore
from eventbus.state._model import Snapshot
from handlers import Preempted
from handlers._attach import CallbackAttachment
from handlers._core import RunCore
from handlers._ending import status_of
from handlers._reporter import stopping_lanes
from handlers._resume import Resume
from handlers._signals import takes_signals

from ._bus_host import BusHost, DeferredEvent, kind_of
from ._bus_thread import BusThread
from ._options import AdapterOptions
from ._stepped_bus import SteppedBus, loop_running_here

__all__ = [
    "ThreadedAdapter",
    "ThreadedRun",
    "log_path",
]

_log = get_logger("adapters.threaded_run")


def log_path(
    setting: bool | str | os.PathLike[str], directory: str | os.PathLike[str], run_id: str
) -> Path | None:
    """Where a run's events are recorded: nowhere (``False``), the given file, or
    for ``True`` ``<directory>/eventbus-<run_id>.msgpack``."""
    if setting is False:
        return None
    if setting is True:
        return Path(directory, f"eventbus-{run_id}.msgpack")
    return Path(setting)


class ThreadedRun:
    """One run at a time on a bus host, driven from the trainer's thread.

    ``steps_in_hooks``: whether ``bus_runs="auto"`` steps the bus in the trainer's hooks.
    Pickles as its options only (Ray ships adapters to another process).
    """

    def __init__(self, name: str, options: AdapterOptions, *, steps_in_hooks: bool = True) -> None:
        self.name = name
        self.options = options
        self.steps_in_hooks = steps_in_hooks
        if options.bus_runs == "in_hooks" and not steps_in_hooks:
            raise ValueError(
                f"{name}: bus_runs='in_hooks' is not possible here (the trainer's hooks run "
                "in an event loop of their own); use 'in_thread' or 'auto'"
            )
        self._reset()

    def _reset(self) -> None:
        self.thread: BusHost | None = None
        self.core: RunCore | None = None
        self.close_report: CloseReport | None = None
        #: The bus's failure once it was raised in the trainer's thread.
        self.raised: BaseException | None = None
        self._dropped_before = 0
        self._stopping: tuple[Subscription, ...] | None = None
        self._said_late_stop = False

    def __getstate__(self) -> dict[str, Any]:
        return {"name": self.name, "options": self.options, "steps_in_hooks": self.steps_in_hooks}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._reset()

    # --- what adapters read ------------------------------------------------------------

    @property
    def running(self) -> bool:
        return self.thread is not None and self.thread.running

    @property
    def run_id(self) -> str:
        return self.core.run_id if self.core is not None else ""

    @property
    def attachment(self) -> CallbackAttachment | None:
        """The handlers wired on the current (or last) run's bus."""
        return self.core.attachment if self.core is not None else None

    @property
    def dropped(self) -> int:
        """Events dropped at the hand-off, over every run."""
        return self._dropped_before + (self.thread.dropped if self.thread is not None else 0)

    @property
    def drain_timeout(self) -> float:
        return self.options.drain_timeout

    # --- the run (the trainer's thread) -------------------------------------------------

    def start(
        self,
        core: RunCore,
        setup: Callable[[EventBus, CallbackAttachment], Any] | None = None,
        *,
        log: Path | None,
        name: str | None = None,
        before_run_first: bool = True,
    ) -> None:
        """Start a bus for the run ``core`` describes, and hand it the run's first events.

        The log is opened here, so one that cannot be refuses the run before its bus
        starts. ``before_run_first=False``: the caller must not wait (Ray's controller).
        """
        if self.running:
            raise RuntimeError(f"{self.name}: run {self.run_id} has not ended")
        if self.thread is not None:
            self._dropped_before += self.thread.dropped
        if name is not None:
            self.name = name
        core.open_log(log)

        def hosted(bus: EventBus) -> Any:
            attachment = core.open(bus)
            if setup is not None:
                setup(bus, attachment)
            return attachment

        host = self._host_class()
        thread = host(hosted, options=self.options, log=None, run_id=core.run_id, name=self.name)
        try:
            thread.start()
        except BaseException:
            core.close_log()
            raise
        self.thread = thread
        self.core = core
        self.close_report = None
        self.raised = None
        self._stopping = None
        self._said_late_stop = False
        self.handoff(core.started())
        if before_run_first:
            thread.wait_idle(self.drain_timeout)
        for event in core.after_start():
            self.handoff(event)

    def _host_class(self) -> type[BusHost]:
        """Where this run's bus runs (see ``AdapterOptions.bus_runs``)."""
        where = self.options.bus_runs
        if where == "auto":
            steppable = self.options.backend == "asyncio" and not loop_running_here()
            where = "in_hooks" if self.steps_in_hooks and steppable else "in_thread"
        return SteppedBus if where == "in_hooks" else BusThread

    def handoff(self, event: Event | DeferredEvent, *, after_idle: bool = False) -> None:
        """Give ``event`` (or a ``DeferredEvent``) to the bus; ``after_idle``: only once
        everything handed off before it was handled. Raises the bus's failure, once;
        after the run ended an event is logged, not delivered."""
        thread = self.thread
        if thread is None or (not after_idle and thread.offer(event)):
            return
        # What ``offer`` leaves: a failure, a full deque, a closed bus.
        if thread.failure is not None:
            self._end_by_failure(thread)
            return
        try:
            if after_idle:
                assert isinstance(event, Event), "after_idle needs an Event"
                thread.handoff_after_idle(event)
            else:
                thread.handoff(event)
        except BusClosed:
            if thread.failure is not None:  # the thread broke meanwhile
                self._end_by_failure(thread)
            else:
                _log.warning(
                    "event after the run ended: not delivered",
                    run_id=self.run_id,
                    event_type=kind_of(event),
                )

    def wait_for_stoppers(self) -> None:
        """Block (at most ``handoff_timeout``) until the callbacks that can stop the run
        handled everything so far, as ``Reporter.sync`` does; a wait cut short is said
        once a run (a stop they decide then lands at a later step)."""
        thread, attachment = self.thread, self.attachment
        if thread is None or attachment is None:
            return
        if self._stopping is None:
            self._stopping = stopping_lanes(attachment)
        limit = self.options.handoff_timeout
        started = time.monotonic()
        if thread.wait_idle(limit, lanes=self._stopping) or self._said_late_stop:
            return
        if time.monotonic() - started >= limit:
            self._said_late_stop = True
            _log.warning(
                f"the callbacks that can stop run {self.run_id} had not handled the latest "
                f"report after {limit:g} s (handoff_timeout): training went on, so a stop "
                "they decide from it ends training at a later step"
            )

    def check(self) -> None:
        """Raise the bus's failure now, if there is one (the run is ended first)."""
        thread = self.thread
        if thread is not None and thread.failure is not None:
            self._end_by_failure(thread)

    def finish(
        self,
        status: RunStatus,
        error: str | None = None,
        *,
        before: Iterable[Event] = (),
        reraise: bool = True,
        summary: dict[str, Any] | None = None,
    ) -> CloseReport | None:
        """End the run: ``before``, then ``RunFinished``, drain, close. A failure of the
        bus decides the status and is raised here if not yet seen (unless ``reraise=False``:
        the trainer has its own exception, or nobody would catch it)."""
        thread = self.thread
        if thread is None:
            return None
        self._end(thread, status, error, before, summary)
        failure = thread.failure
        if failure is not None and failure is not self.raised:
            self.raised = failure
            if reraise:
                raise failure
        return self.close_report

    def _end_by_failure(self, thread: BusHost) -> None:
        failure = thread.failure
        if failure is None or failure is self.raised:
            return
        self.raised = failure
        status, error = status_of(failure)
        self._end(thread, status, error)
        raise failure

    def _end(
        self,
        thread: BusHost,
        status: RunStatus,
        error: str | None,
        before: Iterable[Event] = (),
        summary: dict[str, Any] | None = None,
    ) -> None:
        core = self.core
        if core is None:
            return
        if not thread.running:
            core.close_log()
            return
        deadline = time.monotonic() + self.drain_timeout + 5.0
        for event in before:
            with contextlib.suppress(BusClosed):
                thread.handoff(event)
        # Everything before the end handled first: a failure there decides the status.
        thread.wait_idle(self.drain_timeout)
        if thread.failure is not None:
            status, error = status_of(thread.failure)
        final = core.finished(status, error, summary=summary)
        self.close_report = thread.close([final], timeout=max(0.0, deadline - time.monotonic()))
        core.close_log()  # after the bus's last event (an abandoned bus records no more)
        core.say_end()


class ThreadedAdapter:
    """What users read of an adapter's run (a mixin), and how an adapter starts, ends
    and asks to stop it."""

    _run: ThreadedRun
    _callbacks: list[Any]
    strict_state = False
    _stop = False
    #: The callbacks that can ask to stop (a ``should_stop`` attribute).
    _stoppers: tuple[Any, ...] = ()
    #: The metrics they decide on (each declares ``stops_on``), or None: a round without
    #: any of them changes no ``should_stop``, so a hook need not wait for it.
    _stop_metrics: frozenset[str] | None = None
    #: The preemption signal the run received (``None``: none).
    _signalled: int | None = None
    _handler_before: Any = None

    def request_stop(self) -> None:
        """Ask the trainer to stop at its next hook."""
        self._stop = True

    @property
    def stop_requested(self) -> bool:
        """Whether ``request_stop``, a preemption signal or a callback asked to stop."""
        if self._stop or self._signalled is not None:
            return True
        for callback in self._stoppers:  # noqa: SIM110  # a loop: any() costs 3x, every hook asks
            if callback.should_stop is True:
                return True
        return False

    def _watch_stops(self, callbacks: Iterable[Any]) -> None:
        self._stop = False
        self._stoppers = tuple(cb for cb in callbacks if hasattr(cb, "should_stop"))
        names: set[str] = set()
        for callback in self._stoppers:
            declared = getattr(callback, "stops_on", None)
            if declared is None:
                self._stop_metrics = None
                return
            declared = (declared,) if isinstance(declared, str) else declared
            # A collection, not any iterable (an endless one would hang here), of names: a
            # name that is not a string matches no metric, and its stops would go unwaited.
            if not isinstance(declared, tuple | list | set | frozenset) or not all(
                isinstance(name, str) for name in declared
            ):
                raise TypeError(
                    f"{callback!r}.stops_on is {declared!r:.100}: give the names of the "
                    "metrics it decides to stop on (a tuple of strings), or leave it out"
                )
            names.update(declared)
        self._stop_metrics = frozenset(names)

    def _may_stop_on(self, metrics: dict[str, Any]) -> bool:
        """Whether a callback may decide to stop on a round of ``metrics``."""
        names = self._stop_metrics
        return bool(self._stoppers) and (names is None or not names.isdisjoint(metrics))

    def _on_signal(self, signum: int, frame: object) -> None:
        if self._signalled is None:
            self._signalled = signum
            _log.warning(
                f"{signal.Signals(signum).name}: stopping training at the next step and "
                f"ending run {self.run_id} in order (status preempted)"
            )

    def _end_training(self, summary: dict[str, Any] | None = None) -> None:
        """Finish the run; after a signal, end it ``preempted`` and raise ``Preempted``
        (uncaught, the process exits 143 as schedulers expect)."""
        self._release(None)
        signalled = self._signalled
        if signalled is None:
            self._close("finished", None, reraise=True, summary=summary)
            if self._signalled is None:
                return
            signalled = self._signalled  # it came while the run ended: it ended first
        else:
            self._close("preempted", str(Preempted(signalled)), reraise=True, summary=summary)
        raise Preempted(signalled)

    def _take_round(self, metrics: list[dict[str, Any]], checkpoint: str | None) -> list[Event]:
        """In the bus's loop: a round the framework gathered already (Ray, Lightning under
        DDP), whole: its ranks' reports (for the log) first, then what the round makes."""
        attachment = self._run.attachment
        assert attachment is not None  # a hand-off is taken only while the run runs
        return attachment.reports.take_round(self.run_id, metrics, checkpoint)

    def _release(self, checkpoint: str | None) -> None:  # a no-op by default
        """Hand off the reports the adapter holds back for a save, naming ``checkpoint``."""

    def _looked(self, handed_off: bool = False) -> bool:
        """Step a bus stepped in the hooks, raise a callback's failure of the run now,
        and say whether our callbacks ask to stop."""
        run = self._run
        thread = run.thread
        if thread is not None:
            if handed_off and self._stoppers:
                run.wait_for_stoppers()
            else:
                thread.poll(handed_off)
        run.check()
        return self.stop_requested

    def _fail(self, exc: BaseException, rank: int) -> None:
        """The trainer failed with ``exc``: a ``WorkerFailure`` of ``rank`` and a failed
        run (an interrupt: cancelled)."""
        if exc is self._run.raised:
            return
        if not self._run.running:
            _log.warning(
                "training failed outside a run (before the trainer's start hook?)",
                error=describe_exception(exc),
            )
            return
        self._release(None)
        before = (
            [WorkerFailure.from_exception(self._run.run_id, rank, exc)]
            if isinstance(exc, Exception)
            else []
        )
        self._close(*status_of(exc), before=before)

    def _restore_from(
        self,
        store: StateStore | None,
        checkpoint: str,
        saved: Callable[[StateStore, str], Snapshot | None],
    ) -> StateRestored | None:
        """Restore our callbacks in place, as ``open_run`` does; a state that cannot be
        restored is a warning (with ``strict_state``, the error)."""
        if store is None:
            return None
        try:
            snapshot = saved(store, checkpoint)
            if snapshot is None:
                _log.warning("no callback states in the resumed checkpoint", checkpoint=checkpoint)
                return None
            self._callbacks, restored = store.restore(self._callbacks, snapshot, in_place=True)
        except (StateError, OSError, ValueError) as exc:
            if self.strict_state:
                raise
            _log.warning("callback states not restored", checkpoint=checkpoint, error=f"{exc}")
            return None
        return restored

    def _resume_of(self, store: StateStore | None, checkpoint: str | None) -> Resume | None:
        """What the fit resumes from ``checkpoint`` (``Resume.load``); ``None`` for a new
        run. An unreadable position is a warning (with ``strict_state``, the error)."""
        if store is None or checkpoint is None:
            return None
        try:
            return Resume.load(store, checkpoint)
        except (StateError, OSError) as exc:
            if self.strict_state:
                raise
            _log.warning(
                "where the resumed run stood is unreadable: this fit is a new run",
                checkpoint=checkpoint,
                error=f"{exc}",
            )
            return None

    def _start_run(
        self,
        core: RunCore,
        setup: Callable[[EventBus, CallbackAttachment], Any] | None = None,
        *,
        log: Path | None,
        name: str,
    ) -> None:
        """Start the run (``ThreadedRun.start``): its first events, ``before_run`` first."""
        # A process that exits without the trainer's end hook still ends the run.
        atexit.register(self._close_at_exit)
        # SIGTERM, where nobody else took it, ends the run ``preempted`` at the next step
        # instead of killing the process with the run's end unsaid.
        self._signalled = None
        if self._handler_before is None and takes_signals():
            self._handler_before = signal.signal(signal.SIGTERM, self._on_signal)
        self._run.start(core, setup, log=log, name=name)

    def _close_at_exit(self) -> None:
        if self._run.running:
            self._close("failed", "the process exited during training")

    def _close(
        self,
        status: RunStatus,
        error: str | None,
        *,
        before: Iterable[Event] = (),
        reraise: bool = False,
        summary: dict[str, Any] | None = None,
    ) -> None:
        """End the run; ``reraise`` a callback's failure only at the end of training."""
        atexit.unregister(self._close_at_exit)
        try:
            self._run.finish(status, error, before=before, reraise=reraise, summary=summary)
        finally:  # a signal while the run ends is still ours: the end completes first
            handler, self._handler_before = self._handler_before, None
            if handler is not None:
                signal.signal(signal.SIGTERM, handler)

    @property
    def run_id(self) -> str:
        return self._run.run_id

    @property
    def attachment(self) -> CallbackAttachment | None:
        """The handlers wired on the current (or last) run's bus."""
        return self._run.attachment

    @property
    def bus_thread(self) -> BusHost | None:
        """The current (or last) run's bus host (a thread's, or stepped in the hooks)."""
        return self._run.thread

    @property
    def close_report(self) -> CloseReport | None:
        """The last run's close report (None while running, or if the bus was abandoned)."""
        return self._run.close_report

    @property
    def dropped(self) -> int:
        """Events dropped at the hand-off, over every run of this callback."""
        return self._run.dropped

    def wait_idle(self, timeout: float = 30.0) -> bool:
        """Block until every event handed off so far was handled (for tests, mostly)."""
        thread = self._run.thread
        return thread.wait_idle(timeout) if thread is not None else True
