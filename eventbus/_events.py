"""Event types: one tagged union of frozen msgspec structs, so a record decodes to one class
or fails validation (never code execution: exceptions travel as text, never pickled)."""

from __future__ import annotations

import traceback as _traceback
from typing import Annotated, Any, ClassVar, Literal

import msgspec

#: Bumped whenever an event changes shape incompatibly; logs carry it.
SCHEMA_VERSION = 2

Metrics = dict[str, Any]

MAX_TIME = 1e12
#: A time on the bus's clock, finite: a NaN or infinity would stall periods.
BusTime = Annotated[float, msgspec.Meta(ge=-MAX_TIME, le=MAX_TIME)]
RunStatus = Literal["finished", "failed", "cancelled", "preempted"]


class Event(msgspec.Struct, frozen=True, kw_only=True, tag_field="type", tag=True, gc=False):
    """Base of every event.

    Handlers and the log get a copy stamped by the bus with ``seq`` and dispatch ``time``
    (a publisher may set ``time`` itself). ``gc=False``: a subclass that can sit in a
    reference cycle declares ``gc=True``. ``derived`` marks events a handler makes from
    others (rounds); a replay into a bus that makes them again leaves recorded ones out.
    """

    derived: ClassVar[bool] = False

    seq: int = -1
    time: BusTime = 0.0

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        registry.add(cls)


class EventRegistry:
    """Every event class, one per ``type`` tag (a second one would decode as the wrong class),
    checked when next needed: msgspec makes the tag after ``__init_subclass__``."""

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
    """Rank ``rank`` made no report for ``periods`` periods (``silent_s`` bus seconds)
    while others reported (up to ``others_at``): a hung worker. Not derived: a replay
    delivers the recorded verdict. ``last_index``: its latest report (-1: none)."""

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
    """Workers restarted: partial rounds are discarded. ``required_ranks``: the ranks a
    round needs from now on (empty: every rank of ``world_size``)."""

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

    ``rounds`` counts rounds gathered, the checkpoint's included; ``next_index[r]`` is
    rank ``r``'s next report index (``-1``: not required); ``checkpoint_seq`` is the
    ``seq`` of its ``CheckpointSaved`` (later events are rolled back).
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
    #: Failures of the checkpoint's unfinished period: delivered to ``after_exception``.
    pending_failures: tuple[WorkerFailure, ...] = ()


class RunResumed(Event, frozen=True, kw_only=True):
    """The run resumed from ``checkpoint`` at ``position``, after its ``RunStarted``; a replay
    leaves out the rolled-back events recorded before it."""

    run_id: str
    checkpoint: str
    position: RunPosition


class RunFinished(Event, frozen=True, kw_only=True):
    """The run ended. ``stopped_by``/``stop_reason``: what asked it to stop early, if
    anything; ``summary``: the trainer's own figures of the whole run (``train_runtime``)."""

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
    """A handler call ran past its deadline: ``cancelled`` (async), ``abandoned``
    (blocking, left in its thread) or ``overrun`` (plain sync: it finished, late)."""

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
    ``partial``: the unfinished last period of a bus that closed."""

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
    ``error``: why nothing was written (``path`` is then empty)."""

    run_id: str
    checkpoint: str
    path: str
    keys: tuple[str, ...] = ()
    errors: dict[str, str] = msgspec.field(default_factory=dict)
    error: str = ""


class EventPlaceholder(Event, frozen=True, kw_only=True):
    """Stands in, in a log, for an event that could not be encoded or decoded; ``text``
    is a bounded rendering of it. Replays skip placeholders."""

    event_type: str
    reason: str
    text: str = ""


class StateRestored(Event, frozen=True, kw_only=True):
    """Callback states were restored. ``missing``: saved, not live; ``unsaved``: never saved."""

    run_id: str
    checkpoint: str
    restored: tuple[str, ...] = ()
    missing: tuple[str, ...] = ()
    unsaved: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()
    #: ``"Class: N saved, M live"`` where the counts differ.
    mismatched: tuple[str, ...] = ()


# --- what training callbacks are told (derived by the gathering) ---------------------


class TrainRunContext(msgspec.Struct, frozen=True, kw_only=True):
    """Immutable facts about one run, given to every callback call. ``start_time``:
    epoch seconds from ``RunStarted``, else the bus time of the run's first event."""

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
    """What one hook of a training callback cost over a run, in bus-clock seconds.

    Attributes:
        handler: The hook's name (``EarlyStopping.after_report``; ``...#2`` for a second).
        calls: Calls made, failed and timed-out ones included.
        total: Seconds spent in it.
        mean: Seconds per call (0 without calls).
        max: Its longest call, in seconds.
        periods_over_budget: Periods whose budget report named it over budget.
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
    #: What asked the run to stop early, and why; ``None`` if nothing did.
    stopped_by: str | None = None
    stop_reason: str | None = None
    #: Rounds whose ranks named different checkpoints (each such round has none).
    checkpoint_mismatches: int = 0
    #: Each training-callback hook's cost, in subscription order: to the run's end as
    #: given to ``after_run``, to the bus's close in ``Run.result``.
    callbacks: tuple[CallbackCost, ...] = ()
    #: The trainer's own figures of the whole run (``RunFinished.summary``), if any.
    summary: Metrics = msgspec.field(default_factory=dict)


class BeforeRun(Event, frozen=True, kw_only=True, tag="RunBegan"):
    """The run began: ``before_run`` is due. Tagged ``"RunBegan"``, its old name, for old logs."""

    derived: ClassVar[bool] = True

    context: TrainRunContext


class RoundGathered(Event, frozen=True, kw_only=True):
    """One report round; ``after_report`` is due. The ``metrics`` dicts are read-only:
    every callback shares them."""

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
    #: Ranks found stalled, given to ``after_exception`` as ``RankStalledError``s.
    stalls: tuple[RankStalled, ...] = ()


class AfterRun(Event, frozen=True, kw_only=True, tag="RunEnded"):
    """``after_run`` is due, after every other gathered event of the run. Tagged
    ``"RunEnded"``, its old name, for old logs."""

    derived: ClassVar[bool] = True

    context: TrainRunContext
    result: RunResult
