"""Event types: one tagged union of frozen msgspec structs, every event of the project.

Every message on the bus, in a log or on the wire is an ``Event`` subclass, so
it decodes to exactly one class by its ``type`` tag, and anything unknown or
malformed is a validation error instead of a crash or code execution.
Exceptions travel as type name, message and traceback text: never pickled.
"""

from __future__ import annotations

import traceback as _traceback
from typing import Annotated, Any, ClassVar, Literal

import msgspec

#: Bumped whenever an event changes shape incompatibly; logs carry it.
SCHEMA_VERSION = 2

Metrics = dict[str, Any]

#: The largest bus time an event may carry, either sign: thousands of years in seconds.
MAX_TIME = 1e12
#: A time on the bus's clock. Finite: a recorded NaN or infinity would stall periods and
#: comparisons, so a log record holding one is damaged (read as a placeholder).
BusTime = Annotated[float, msgspec.Meta(ge=-MAX_TIME, le=MAX_TIME)]
RunStatus = Literal["finished", "failed", "cancelled", "preempted"]


class Event(msgspec.Struct, frozen=True, kw_only=True, tag_field="type", tag=True, gc=False):
    """Base of every event.

    ``seq`` and ``time`` come from the bus: handlers and the log get a copy of each
    published event stamped with its sequence number and dispatch time; the object
    published keeps ``-1`` and ``0.0``. A publisher may set ``time`` itself (a replay
    keeps recorded times); ``seq`` always comes from the bus.

    Events are not tracked by the garbage collector (``gc=False``: a run keeps many
    alive); so an event inside a reference cycle would never be freed, and a subclass
    that needs one declares ``gc=True``.

    ``derived``: ``True`` on a class whose events a handler makes from other events (the
    gathering's rounds); a replay into a bus that makes them again leaves the recorded
    ones out.
    """

    derived: ClassVar[bool] = False

    seq: int = -1
    time: BusTime = 0.0

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        registry.add(cls)


class EventRegistry:
    """Every event class, keyed by module-qualified name; each ``type`` tag names one.

    A second class with the tag of another (say a user's own ``Report``) would make every
    recorded event of that tag decode as the wrong class, so it is refused (``TypeError``
    naming both); defining the same class again (a module reloaded) replaces it. A tag is
    known only once msgspec has made the class, so new classes wait in ``pending`` until
    the union is next needed (a metaclass could check at once, but would put every
    instance on msgspec's slow path). ``generation`` counts changes, for caches.
    """

    def __init__(self) -> None:
        self._classes: dict[str, type[Event]] = {}
        self._owners: dict[str, str] = {}
        self._pending: list[type[Event]] = []
        self.generation = 0

    def add(self, cls: type[Event]) -> None:
        self._pending.append(cls)
        self.generation += 1

    def classes(self) -> tuple[type[Event], ...]:
        """Every event class, the pending ones checked and added first."""
        while self._pending:
            cls = self._pending.pop(0)
            key = f"{cls.__module__}.{cls.__qualname__}"
            tag = tag_of(cls)
            owner = self._owners.get(tag)
            if owner is not None and owner != key:
                raise TypeError(
                    f"event type tag {tag!r} of {key} is already taken by {owner}: a log "
                    f"could not tell them apart; rename the class or give it its own tag: "
                    f'class {cls.__name__}(Event, tag="yourpackage.{cls.__name__}")'
                )
            self._owners[tag] = key
            self._classes[key] = cls
        return tuple(self._classes.values())


registry = EventRegistry()


def tag_of(cls: type) -> str:
    """The ``type`` tag an event class is written with (its name, unless given one)."""
    config = getattr(cls, "__struct_config__", None)
    tag = getattr(config, "tag", None)
    return str(tag) if tag is not None else cls.__name__


def is_derived(cls: type) -> bool:
    """Whether events of ``cls`` are made by a handler from other events (``Event.derived``)."""
    return isinstance(cls, type) and issubclass(cls, Event) and cls.derived is True


def event_types() -> tuple[type[Event], ...]:
    """All event classes defined so far (the tagged union that logs decode)."""
    return registry.classes()


# --- training events ---------------------------------------------------------


class Report(Event, frozen=True, kw_only=True):
    """What one rank reported: its ``index``-th report of the run."""

    run_id: str
    rank: int
    world_size: int
    index: int
    metrics: Metrics
    checkpoint: str | None = None


class WorkerFailure(Event, frozen=True, kw_only=True):
    """An exception that escaped a worker, carried as text (never pickled)."""

    run_id: str
    rank: int
    error_type: str
    message: str
    traceback: str = ""
    retryable: bool = False

    @classmethod
    def from_exception(
        cls, run_id: str, rank: int, exc: BaseException, *, retryable: bool = False
    ) -> WorkerFailure:
        return cls(
            run_id=run_id,
            rank=rank,
            error_type=type(exc).__qualname__,
            message=str(exc),
            traceback="".join(_traceback.format_exception(exc)),
            retryable=retryable,
        )


class RankStalled(Event, frozen=True, kw_only=True):
    """Rank ``rank`` made no report for ``periods`` health-check periods of ``period``
    seconds (``silent_s`` seconds on the bus's clock) while other ranks reported: a
    worker hung without dying. A verdict on the live run's time, recorded as a fact
    (not derived): a replay delivers the recorded one and judges nothing again.

    ``last_index``: its latest report (-1: none yet); ``others_at``: the latest of
    the other ranks'."""

    run_id: str
    rank: int
    silent_s: float
    last_index: int
    others_at: int
    periods: int
    period: float


class RankRecovered(Event, frozen=True, kw_only=True):
    """Rank ``rank``, stalled (``RankStalled``), reported again (report ``index``)
    after ``silent_s`` seconds of silence."""

    run_id: str
    rank: int
    silent_s: float
    index: int


class CheckpointSaved(Event, frozen=True, kw_only=True):
    """A checkpoint was written for report round ``index`` by ``ranks``."""

    run_id: str
    checkpoint: str
    index: int
    ranks: tuple[int, ...] = ()
    metrics: Metrics = msgspec.field(default_factory=dict)


class WorkerGroupRestarted(Event, frozen=True, kw_only=True):
    """Workers restarted: partial report rounds are discarded.

    ``required_ranks`` is the set of ranks a round needs from now on (it may
    shrink or grow in elastic runs); empty means every rank of ``world_size``.
    """

    run_id: str
    world_size: int
    required_ranks: tuple[int, ...] = ()


class ReportRejected(Event, frozen=True, kw_only=True):
    """A report that could not be accepted, and why (the run goes on)."""

    derived: ClassVar[bool] = True

    run_id: str
    rank: int
    field: str
    reason: str


class CheckpointMismatch(Event, frozen=True, kw_only=True):
    """Ranks named different checkpoints for one round; the round has none."""

    derived: ClassVar[bool] = True

    run_id: str
    round: int
    checkpoints: dict[int, str | None]


# --- lifecycle -----------------------------------------------------------------


class RunStarted(Event, frozen=True, kw_only=True):
    """The run started: who it is, its world size and configuration."""

    run_id: str
    name: str
    world_size: int
    config: dict[str, Any] = msgspec.field(default_factory=dict)
    storage: str | None = None
    wall_time: float = 0.0


class RunPosition(msgspec.Struct, frozen=True, kw_only=True):
    """Where a run stood when a checkpoint's round was gathered: what a resume continues.

    Saved with the checkpoint's callback states and carried by ``RunResumed``. ``rounds``
    counts the rounds gathered, the checkpoint's included; ``next_index[r]`` is rank
    ``r``'s next report index (later ones are redone after a resume, ``-1`` for a rank not
    required); ``checkpoint_seq`` the ``seq`` of the checkpoint's ``CheckpointSaved``
    (later events are rolled back); ``pending_failures`` where ``after_exception`` stood.
    """

    checkpoint: str
    rounds: int
    next_index: tuple[int, ...]
    world_size: int
    required_ranks: tuple[int, ...] = ()
    checkpoint_seq: int = -1
    start_time: float = 0.0
    reports: int = 0
    rejected: int = 0
    failures: int = 0
    restarts: int = 0
    mismatches: int = 0
    #: Worker failures recorded before the checkpoint whose health-check period had
    #: not ended: a resumed run delivers them to ``after_exception``, once.
    pending_failures: tuple[WorkerFailure, ...] = ()


class RunResumed(Event, frozen=True, kw_only=True):
    """The run resumed from ``checkpoint`` (the operator's location) at ``position``.

    It follows the resumed run's ``RunStarted``. Events recorded before it that the crash
    rolled back (reports at or past ``position.next_index``, every other event after
    ``position.checkpoint_seq``) stay in the log for diagnosis; a replay leaves them out.
    """

    run_id: str
    checkpoint: str
    position: RunPosition


class RunFinished(Event, frozen=True, kw_only=True):
    """The run ended. ``stopped_by``/``stop_reason``: what asked it to stop early
    (a callback's ``should_stop``, or ``Run.request_stop``), if anything did.
    ``summary``: the trainer's own figures of the whole run, where it gives some
    (Hugging Face's ``train_runtime``, ``train_loss``, ...): they describe the run,
    not a round, so they come with its end."""

    run_id: str
    status: RunStatus
    error: str | None = None
    stopped_by: str | None = None
    stop_reason: str | None = None
    summary: Metrics = msgspec.field(default_factory=dict)


class HealthCheckTick(Event, frozen=True, kw_only=True):
    """End of health-check period ``period`` (clock times ``start``..``end``)."""

    period: int
    start: BusTime
    end: BusTime


# --- diagnostics ---------------------------------------------------------------


class HandlerFailed(Event, frozen=True, kw_only=True):
    """A handler raised while handling event ``event_seq``; the bus went on."""

    handler: str
    event_seq: int
    event_type: str
    error_type: str
    message: str
    traceback: str = ""


class HandlerTimedOut(Event, frozen=True, kw_only=True):
    """A handler call ran past its deadline.

    ``outcome`` says what happened to it: ``cancelled`` (async, interrupted),
    ``abandoned`` (blocking, left running in its worker thread) or ``overrun``
    (plain sync, which cannot be interrupted: it ran to the end, late).
    """

    handler: str
    event_seq: int
    event_type: str
    timeout: float
    elapsed: float
    outcome: Literal["cancelled", "abandoned", "overrun"]
    calls: int = 1
    advice: str = ""


class HandlerStateChanged(Event, frozen=True, kw_only=True):
    """A handler was disabled, re-enabled, or started/stopped coalescing."""

    handler: str
    state: Literal["normal", "coalescing", "disabled"]
    reason: str


class HandlerUsage(msgspec.Struct, frozen=True, kw_only=True):
    """One handler's cost in one health-check period."""

    handler: str
    calls: int
    total: float
    max: float
    timeouts: int = 0
    faults: int = 0
    skipped: int = 0
    budget: float = 0.0
    over_budget: bool = False


class BudgetReport(Event, frozen=True, kw_only=True):
    """Callback overhead of one health-check period against its budget.

    ``partial``: the last, unfinished period of a bus that closed (so a run
    shorter than a period still reports what its callbacks cost).
    """

    period: int
    start: BusTime
    end: BusTime
    budget: float
    total: float
    fraction: float
    handlers: tuple[HandlerUsage, ...] = ()
    over_budget: tuple[str, ...] = ()
    partial: bool = False


class StateSnapshotted(Event, frozen=True, kw_only=True):
    """Callback states were written for a checkpoint (``errors``: key -> why not).

    ``error`` says why nothing was written (a location outside the state
    root, an I/O error); ``path`` is then empty.
    """

    run_id: str
    checkpoint: str
    path: str
    keys: tuple[str, ...] = ()
    errors: dict[str, str] = msgspec.field(default_factory=dict)
    error: str = ""


class EventPlaceholder(Event, frozen=True, kw_only=True):
    """Stands in, in a log, for an event that could not be kept as itself.

    The recorder writes one for an event it cannot encode, so one bad value never costs
    the rest of the log; the reader yields one for an intact record that does not decode
    (an unknown type, a mistyped field). ``reason`` says why, ``text`` is a bounded
    rendering of what was there. Replays skip placeholders.
    """

    event_type: str
    reason: str
    text: str = ""


class StateRestored(Event, frozen=True, kw_only=True):
    """Callback states were restored.

    ``missing``: saved but no longer live; ``unsaved``: live but never saved.
    """

    run_id: str
    checkpoint: str
    restored: tuple[str, ...] = ()
    missing: tuple[str, ...] = ()
    unsaved: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()
    #: Classes whose saved and live instance counts differ: ``"Class: N saved, M live"``.
    mismatched: tuple[str, ...] = ()


# --- what training callbacks are told ----------------------------------------------
# The gathering (``handlers``) derives these from the events above, each with the run's context.


class TrainRunContext(msgspec.Struct, frozen=True, kw_only=True):
    """Immutable facts about one run, given to every callback call.

    ``start_time`` is wall-clock seconds since the epoch when known (from
    ``RunStarted``), else the bus time of the first event of the run.
    """

    run_id: str
    name: str
    world_size: int
    config: dict[str, Any] = msgspec.field(default_factory=dict)
    storage: str | None = None
    start_time: float = 0.0

    @classmethod
    def from_started(cls, event: RunStarted) -> TrainRunContext:
        return cls(
            run_id=event.run_id,
            name=event.name,
            world_size=event.world_size,
            config=dict(event.config),
            storage=event.storage,
            start_time=event.wall_time or event.time,
        )

    @classmethod
    def from_event(cls, event: Event) -> TrainRunContext:
        """A context for a run whose ``RunStarted`` was never seen (a partial log)."""
        run_id = str(getattr(event, "run_id", "") or "run")
        return cls(
            run_id=run_id,
            name=run_id,
            world_size=int(getattr(event, "world_size", 0) or 0),
            start_time=float(event.time),
        )


class CallbackCost(msgspec.Struct, frozen=True, kw_only=True):
    """What one hook of a training callback cost over a run (``RunResult.callbacks``).

    The bus's accounting of the hook's subscription over the run, in seconds on the bus's
    clock, so it agrees with the run's ``BudgetReport``s.

    Attributes:
        handler: The hook's name in diagnostics and budget reports
            (``EarlyStopping.after_report``; ``...#2`` for a second instance).
        calls: Calls made, failed and timed-out ones included.
        total: Seconds spent in it.
        mean: Seconds per call (``total / calls``; 0 without calls).
        max: Its longest call, in seconds.
        periods_over_budget: Health-check periods whose budget report named it
            over its budget.
        faults: Calls that raised.
        timeouts: Calls past their deadline.
        skipped: Deliveries not made (disabled, coalescing, or cut short).
    """

    handler: str
    calls: int = 0
    total: float = 0.0
    mean: float = 0.0
    max: float = 0.0
    periods_over_budget: int = 0
    faults: int = 0
    timeouts: int = 0
    skipped: int = 0


class RunResult(msgspec.Struct, frozen=True, kw_only=True):
    """How a run ended, given to ``after_run``."""

    run_id: str
    status: RunStatus
    error: str | None = None
    rounds: int = 0
    reports: int = 0
    rejected: int = 0
    failures: int = 0
    restarts: int = 0
    last_checkpoint: str | None = None
    #: What asked the run to stop early (``EarlyStopping(metric='loss', mode='min')``,
    #: ``Run.request_stop``) and why; ``None`` if nothing did.
    stopped_by: str | None = None
    stop_reason: str | None = None
    #: Rounds whose ranks named different checkpoints (each such round has none).
    checkpoint_mismatches: int = 0
    #: What each hook of the run's training callbacks cost, in the order they were
    #: subscribed (the library's own handlers are in ``EventBus.stats()``). As given to
    #: ``after_run``: up to the run's end; ``Run.result`` brings them up to the bus's
    #: close (``after_run`` itself, the last period's budget verdict). Empty in logs
    #: recorded before it.
    callbacks: tuple[CallbackCost, ...] = ()
    #: The trainer's own figures of the whole run (``RunFinished.summary``), if any.
    summary: Metrics = msgspec.field(default_factory=dict)


class BeforeRun(Event, frozen=True, kw_only=True, tag="RunBegan"):
    """The run began: ``before_run`` is due, before anything else of the run.

    Its tag is ``"RunBegan"``, the class's name before it was renamed, so that
    every log recorded since still reads.
    """

    derived: ClassVar[bool] = True

    context: TrainRunContext


class RoundGathered(Event, frozen=True, kw_only=True):
    """One report round: ``metrics[i]`` from the i-th required rank; ``after_report`` is due.

    The dicts in ``metrics`` are read-only (their mutators raise ``TypeError``),
    shared by every callback: none sees another's edits.
    """

    derived: ClassVar[bool] = True

    context: TrainRunContext
    round: int
    #: The required ranks, in order: ``metrics[i]`` is rank ``ranks[i]``'s.
    ranks: tuple[int, ...]
    metrics: list[dict[str, Any]]
    checkpoint: str | None = None


class FailuresGathered(Event, frozen=True, kw_only=True):
    """Worker failures of one health-check period, or a stalled rank; ``after_exception``
    is due."""

    derived: ClassVar[bool] = True

    context: TrainRunContext
    index: int
    failures: tuple[WorkerFailure, ...]
    #: Ranks found stalled (``RankStalled``): ``after_exception`` gets each as a
    #: ``handlers.RankStalledError``, as Ray reports a worker failing its health check.
    stalls: tuple[RankStalled, ...] = ()


class AfterRun(Event, frozen=True, kw_only=True, tag="RunEnded"):
    """``after_run`` is due: every other gathered event of the run came before it.

    Its tag is ``"RunEnded"``, the class's name before it was renamed, so that
    every log recorded since still reads.
    """

    derived: ClassVar[bool] = True

    context: TrainRunContext
    result: RunResult
