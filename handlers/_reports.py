"""Report gathering: a round is released once every required rank has a report waiting,
in rank order, as Ray Train's ``metrics[i]`` promises. The two oldest rounds are kept as
slots by rank, so a complete round's slots are already its ``metrics`` list."""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from functools import partial
from typing import Any

from eventbus import (
    CheckpointMismatch,
    CheckpointSaved,
    Event,
    EventBus,
    HealthCheckTick,
    RankRecovered,
    RankStalled,
    Report,
    ReportRejected,
    RoundGathered,
    TrainRunContext,
    WorkerGroupRestarted,
)
from eventbus._events import RunPosition
from eventbus._logging import get_logger
from eventbus._stages import Stage
from eventbus._subscription import Subscription

from ._errors import ReportError
from ._metric_values import FrozenDict, MetricsError, freeze_metrics
from ._metrics import mean_metrics
from ._options import MAX_WORLD_SIZE

__all__ = ["ReportCallbackHandler"]

_log = get_logger("handlers.reports")


class ReportCallbackHandler:
    """Gathers ``Report`` events into rounds and emits each as a ``RoundGathered``.

    A bad report becomes a ``ReportRejected`` (the run goes on); a round's checkpoint is
    the one any rank named, as in Ray Train (different ones: ``CheckpointMismatch``).

    Args:
        world_size: the run's ranks (default: the run context's, else the first report's).
        required_ranks: the ranks a round waits for (default: all).
        context_for: gives the run context of an event (default: built from the first).
        announce_checkpoints: emit a ``CheckpointSaved`` behind each round with a
            checkpoint (a live run; a replay's log holds them already).
        emit: takes events made before ``subscribe`` (default: dropped).
        stall_periods: periods of silence after which a rank the others wait for has
            stalled (``RankStalled``, once, until ``RankRecovered``); default the bus's.
    """

    def __init__(
        self,
        *,
        world_size: int | None = None,
        required_ranks: Iterable[int] | None = None,
        context_for: Callable[[Event], TrainRunContext] | None = None,
        announce_checkpoints: bool = False,
        emit: Callable[[Event], object] | None = None,
        stall_periods: int | None = None,
    ) -> None:
        self.announce_checkpoints = announce_checkpoints
        self.stall_periods = stall_periods
        self._hears = False  # rounds come whole; progress comes from ``heard``
        self.stalls = 0
        self._period = 0.0  # seconds
        self._context_for = context_for or self._first_context
        self._context: TrainRunContext | None = None
        self._emit = emit
        self.run_id: str | None = None
        self._size(0, [])  # the world size is not known yet
        #: ``(rank, index)`` of reports of rounds taken whole, until the bus brings them back.
        self._taken: deque[tuple[int, int]] = deque()
        self._done = 0  # reports in released and discarded rounds
        self.rounds = 0
        self.rejected = 0
        self.discarded = 0
        self.mismatches = 0
        self.restarts = 0
        self.last_checkpoint: str | None = None
        self._positions: dict[int, RunPosition] = {}
        if world_size is not None:
            self._configure(world_size, required_ranks)
        elif required_ranks is not None:
            raise ValueError("required_ranks needs world_size")

    # --- wiring ------------------------------------------------------------------

    def subscribe(self, bus: EventBus, *, order: int = Stage.GATHER_REPORTS) -> Subscription:
        """Gather from ``bus``, inline, as its one gathering (a second would deliver
        every round twice)."""
        if bus.gathering is not None:
            raise ValueError(
                "this bus already gathers reports into rounds (training callbacks are "
                "attached to it): attach every training callback in one call, or use "
                "another bus; a second gatherer would deliver each round twice"
            )
        self._emit = partial(bus.emit, derived=True)
        if self.stall_periods is None:
            self.stall_periods = bus.options.stall_periods
        self._period = bus.period
        watched = (HealthCheckTick,) if self.stall_periods is not None else ()
        bus.gathering = subscription = bus.subscribe(
            (Report, WorkerGroupRestarted, *watched),
            self.handle,
            name="handlers.ReportCallbackHandler",
            order=order,
        )
        return subscription

    # --- rules -------------------------------------------------------------------

    def _configure(self, world_size: int, required_ranks: Iterable[int] | None) -> None:
        if type(world_size) is not int or not 1 <= world_size <= MAX_WORLD_SIZE:
            raise ValueError(f"world_size must be from 1 to {MAX_WORLD_SIZE}, got {world_size!r}")
        ranks = range(world_size) if required_ranks is None else tuple(required_ranks)
        if required_ranks is not None and not all(type(rank) is int for rank in ranks):
            raise ValueError(f"required ranks must be ints, got {ranks!r}")
        required = sorted(set(ranks))
        if not required or required[0] < 0 or required[-1] >= world_size:
            raise ValueError(
                f"required ranks {required} must be a non-empty subset of 0..{world_size - 1}"
            )
        self._size(world_size, required)

    def _size(self, world_size: int, required: list[int]) -> None:
        """Start the gathering over for ``world_size`` ranks (0: not known yet)."""
        self.world_size = world_size
        self.required_ranks = tuple(required)
        self._required = [False] * world_size
        for rank in required:
            self._required[rank] = True
        self._all_required = len(required) == world_size
        self._last_index = [-1] * world_size
        #: Per rank, its latest report index (or ``heard``'s) and the bus time it got
        #: there (NaN: none since the group started).
        self._progress = [-1] * world_size
        self._last_time = [math.nan] * world_size
        self._stalled: dict[int, tuple[int, float, RankStalled]] = {}
        #: The oldest open round: slots by rank, checkpoints named, required ranks lacking.
        self._slots: list[Any] = [None] * world_size
        self._named: dict[int, str] | None = None
        self._missing = len(required)
        self._not_required = world_size - len(required)
        #: The round after it, and per rank the reports for the rounds after that.
        self._following: list[Any] = [None] * world_size
        self._following_named: dict[int, str] | None = None
        self._ahead: dict[int, deque[tuple[FrozenDict, str | None]]] = {}

    @property
    def reports(self) -> int:
        """Reports accepted (counted per round: the per-report path is hot)."""
        waiting = len(self.required_ranks) - self._missing
        waiting += self.world_size - self._following.count(None)
        waiting += sum(len(queue) for queue in self._ahead.values())
        return self._done + waiting

    def handle(self, event: Report | WorkerGroupRestarted | HealthCheckTick) -> None:
        if isinstance(event, Report):
            taken = self._taken
            if taken and taken[0] == (event.rank, event.index):
                taken.popleft()  # a record of a round taken whole
                self._moved(event.rank, event.index, event.time)
                return
            self._admit(event)
        elif isinstance(event, HealthCheckTick):
            self.watch(event)
        elif isinstance(event, WorkerGroupRestarted):
            self.on_restart(event)

    def _admit(self, report: Report) -> None:
        """Check ``report`` (a rejection names its field), then slot it."""
        if self.run_id is None and not self._begin(report):
            return
        if report.run_id != self.run_id:
            self._reject(report, "run_id", f"{report.run_id!r}, but this run is {self.run_id!r}")
            return
        rank = report.rank
        world_size = self.world_size
        if type(rank) is not int or not 0 <= rank < world_size:
            self._reject(report, "rank", f"rank {rank!r} is outside world size {world_size}")
            return
        if report.world_size != world_size:
            reason = f"{report.world_size}, but the run has {world_size}"
            self._reject(report, "world_size", reason)
            return
        index = report.index
        if type(index) is not int:
            self._reject(report, "index", f"{index!r} is not an int")
            return
        last = self._last_index[rank]
        if index <= last:
            reason = (
                f"{index} is negative" if index < 0 else f"{index} after {last}: not increasing"
            )
            self._reject(report, "index", reason)
            return
        metrics = report.metrics
        if type(metrics) is not FrozenDict:  # a live run's Reporter froze them already
            try:
                metrics = freeze_metrics(metrics)
            except MetricsError as exc:
                self._reject(report, exc.field, exc.reason)
                return
        checkpoint = report.checkpoint
        if checkpoint is not None and (type(checkpoint) is not str or not checkpoint):
            self._reject(report, "checkpoint", f"{checkpoint!r} is not a checkpoint location")
            return
        if not self._required[rank]:
            reason = f"rank {rank} is not required (required: {list(self.required_ranks)})"
            self._reject(report, "rank", reason)
            return
        self._last_index[rank] = index
        self._progress[rank] = index
        self._last_time[rank] = report.time
        if self._slots[rank] is None:
            self._slots[rank] = metrics
            if checkpoint is not None:
                self._named = _with(self._named, rank, checkpoint)
            self._missing -= 1
            if not self._missing:
                self._release(report)
        elif self._following[rank] is None:
            self._following[rank] = metrics
            if checkpoint is not None:
                self._following_named = _with(self._following_named, rank, checkpoint)
        else:  # reports in both open rounds already: this one waits in its rank's queue
            queue = self._ahead.get(rank)
            if queue is None:
                queue = self._ahead[rank] = deque()
            queue.append((metrics, checkpoint))

    def _first_context(self, event: Event) -> TrainRunContext:
        """Without a lifecycle handler: the run context built from the first event."""
        if self._context is None:
            self._context = TrainRunContext.from_event(event)
        return self._context

    def _begin(self, report: Report) -> bool:
        """The run's first report: learn its id, and its world size unless given."""
        context = self._context_for(report)
        if not self.world_size:
            try:
                self._configure(context.world_size or report.world_size, None)
            except ValueError as exc:
                self._reject(report, "world_size", str(exc))
                return False
        self.run_id = context.run_id
        return True

    def _release(self, report: Report) -> None:
        """Deliver the complete oldest round, opening the next first (an emit may raise)."""
        slots, named = self._slots, self._named
        self._slots, self._named = self._following, self._following_named
        following: list[Any] = [None] * self.world_size
        following_named: dict[int, str] | None = None
        if self._ahead:  # each rank two or more rounds ahead moves its next report up
            for rank, queue in list(self._ahead.items()):
                following[rank], checkpoint = queue.popleft()
                if checkpoint is not None:
                    following_named = _with(following_named, rank, checkpoint)
                if not queue:
                    del self._ahead[rank]
        self._following, self._following_named = following, following_named
        required = self.required_ranks
        self._done += len(required)
        # Slots of ranks not required stay empty: they are not missing.
        self._missing = self._slots.count(None) - self._not_required
        metrics = slots if self._all_required else [slots[r] for r in required]
        events = self._deliver(metrics, named, report)
        emit = self._emit
        if emit is not None:
            for event in events:
                emit(event)

    def take_round(
        self,
        run_id: str,
        metrics: Sequence[Mapping[str, Any]],
        checkpoint: str | None = None,
    ) -> list[Event]:
        """A round gathered already (Ray, Lightning): ``metrics[i]`` of the i-th required rank.

        Raises ``ReportError`` for the first bad rank (nothing taken). Returns the events
        to publish: each rank's ``Report`` (for the log), then what the round makes.
        """
        if self.reports != self._done:
            waiting = [rank for rank in range(self.world_size) if self.waiting_from(rank)]
            raise RuntimeError(
                f"a whole round while reports of ranks {waiting} wait for theirs: "
                "it would overtake them; report the other ranks' first"
            )
        ranks = self.required_ranks if self.world_size else tuple(range(len(metrics)))
        if not metrics or len(metrics) != len(ranks):
            raise ValueError(
                f"a whole round has the metrics of each required rank {list(ranks)}, "
                f"in rank order: {len(ranks)} mappings, got {len(metrics)}"
            )
        frozen: list[Any] = []
        for rank, rank_metrics in zip(ranks, metrics, strict=True):
            try:
                frozen.append(freeze_metrics(rank_metrics))
            except MetricsError as exc:
                raise ReportError(rank, exc.field, exc.reason) from None
        if checkpoint is not None and (type(checkpoint) is not str or not checkpoint):
            raise ReportError(
                ranks[0], "checkpoint", f"{checkpoint!r} is not a checkpoint location"
            )
        if not self.world_size:
            self._configure(len(ranks), None)
        last, world_size = self._last_index, self.world_size
        reports = [
            Report(
                run_id=run_id,
                rank=rank,
                world_size=world_size,
                index=last[rank] + 1,
                metrics=rank_metrics,
                checkpoint=checkpoint,
            )
            for rank, rank_metrics in zip(ranks, frozen, strict=True)
        ]
        if self.run_id is None:
            self._begin(reports[0])  # configured already: it learns the run's id
        if run_id != self.run_id:
            raise ValueError(f"a round of run {run_id!r}, but this run is {self.run_id!r}")
        for report in reports:
            last[report.rank] = report.index
            self._taken.append((report.rank, report.index))
        self._done += len(ranks)
        named = None if checkpoint is None else dict.fromkeys(ranks, checkpoint)
        return [*reports, *self._deliver(frozen, named, reports[0])]

    def _deliver(
        self, metrics: list[Any], named: dict[int, str] | None, report: Report
    ) -> list[Event]:
        """Count a complete round and return its events. Ray's rule: the checkpoint any
        rank named is the round's; only two different names are a mismatch."""
        events: list[Event] = []
        checkpoint: str | None = None
        if named:
            names = set(named.values())
            if len(names) == 1:
                (checkpoint,) = names
            else:
                events.append(self._mismatch(report.run_id, named))
        self.rounds += 1
        if checkpoint is not None:
            self.last_checkpoint = checkpoint
            self._keep_position(checkpoint)  # for the snapshot, whoever announces it
        context = self._context_for(report)
        round_ = self.rounds - 1
        ranks = self.required_ranks
        events.append(
            RoundGathered(
                context=context, round=round_, ranks=ranks, metrics=metrics, checkpoint=checkpoint
            )
        )
        if checkpoint is not None and self.announce_checkpoints:
            events.append(
                CheckpointSaved(
                    run_id=context.run_id,
                    checkpoint=checkpoint,
                    index=round_,
                    ranks=ranks,
                    metrics=mean_metrics(metrics),
                )
            )
        return events

    # --- resuming ----------------------------------------------------------------

    def _keep_position(self, checkpoint: str) -> None:
        """Note where the run stands at release (by the snapshot, later reports may be in)."""
        next_index = [
            last + 1 - (self._slots[rank] is not None)
            - (self._following[rank] is not None) - len(self._ahead.get(rank, ()))
            if self._required[rank] else -1
            for rank, last in enumerate(self._last_index)
        ]  # fmt: skip
        round_ = self.rounds - 1
        self._positions[round_] = RunPosition(
            checkpoint=checkpoint,
            rounds=self.rounds,
            next_index=tuple(next_index),
            world_size=self.world_size,
            required_ranks=self.required_ranks,
            reports=self._done,
            rejected=self.rejected,
            mismatches=self.mismatches,
            restarts=self.restarts,
        )
        for old in [r for r in self._positions if r < round_ - 64]:  # never snapshotted
            del self._positions[old]

    def position_at(self, round_: int) -> RunPosition | None:
        """Where the run stood when round ``round_`` (one with a checkpoint) was released."""
        return self._positions.pop(round_, None)

    def resume_at(self, checkpoint: str, position: RunPosition | None = None) -> None:
        """Continue from ``checkpoint`` and, when known, the run's ``position`` there."""
        self.last_checkpoint = checkpoint
        if position is None:
            return
        self._configure(position.world_size, position.required_ranks or None)
        for rank, index in enumerate(position.next_index[: self.world_size]):
            if self._required[rank] and index > 0:
                self._last_index[rank] = self._progress[rank] = index - 1
        self.rounds, self._done = position.rounds, position.reports
        self.rejected, self.mismatches = position.rejected, position.mismatches
        self.restarts = position.restarts

    # --- stalled ranks -------------------------------------------------------------

    def heard(self, run_id: str, rank: int, index: int, time: float) -> None:
        """Rank ``rank`` is at report ``index`` as of bus ``time``: for engines whose rounds
        come whole (Ray), only progress shows whom the others wait for."""
        if not self.world_size:
            raise RuntimeError("progress heard before the run's world size is known")
        if self.run_id is None:
            self.run_id = run_id
        elif run_id != self.run_id:
            raise ValueError(f"progress of run {run_id!r}, but this run is {self.run_id!r}")
        if type(rank) is not int or not 0 <= rank < self.world_size or not self._required[rank]:
            raise ValueError(
                f"progress of rank {rank!r}, which is not a required rank "
                f"(required: {list(self.required_ranks)})"
            )
        if type(index) is not int or index < 0:
            raise ValueError(f"progress of rank {rank}: index {index!r} is no report index")
        self._hears = True
        self._moved(rank, index, time)

    def _moved(self, rank: int, index: int, time: float) -> None:
        """Advance ``rank``'s progress (rounds and ``heard`` may cross: never back)."""
        if index > self._progress[rank]:
            self._progress[rank] = index
            if not self._last_time[rank] >= time:  # NaN: nothing since the group started
                self._last_time[rank] = time

    def watch(self, tick: HealthCheckTick) -> None:
        """Find stalled and recovered ranks. Only a rank the others wait for can stall:
        ranks silent together (a shared pause, the run's end) have not."""
        periods = self.stall_periods
        if periods is None or not self.world_size or self.run_id is None:
            return
        times, progress = self._last_time, self._progress
        for rank, time_ in enumerate(times):
            if math.isnan(time_):  # no report since the group started
                times[rank] = tick.start
        stalled = self._stalled
        for rank, (index, since, _) in list(stalled.items()):
            if progress[rank] > index:
                del stalled[rank]
                self._recovered(rank, times[rank] - since)
        if not self._period:
            self._period = tick.end - tick.start
        behind = self._behind()
        if not behind:
            return
        limit, end = periods * self._period, tick.end
        ahead = max(progress[rank] for rank in self.required_ranks)
        for rank in behind:
            if end - times[rank] >= limit and rank not in stalled:
                self._stall(rank, end - times[rank], ahead)

    def _behind(self) -> list[int]:
        """The ranks the others wait for."""
        required = self.required_ranks
        if self._missing < len(required):
            return self.lacking()
        if not self._hears:
            return []  # no round partial: no rank is waited for
        progress = self._progress
        furthest = max(progress[rank] for rank in required)
        return [rank for rank in required if progress[rank] < furthest]

    def _stall(self, rank: int, silent: float, others_at: int) -> None:
        periods, period = self.stall_periods or 0, self._period
        last = self._progress[rank]
        stall = RankStalled(
            run_id=self.run_id or "",
            rank=rank,
            silent_s=silent,
            last_index=last,
            others_at=others_at,
            periods=periods,
            period=period,
        )
        self._stalled[rank] = (last, self._last_time[rank], stall)
        self.stalls += 1
        at = f"last at step {last}" if last >= 0 else "none yet"
        _log.warning(
            f"rank {rank} stalled: no report for {silent:.1f} s ({periods} periods of "
            f"{period:g} s), {at}; the other ranks are at step {others_at}",
            run_id=self.run_id,
        )
        if self._emit is not None:
            self._emit(stall)

    def _recovered(self, rank: int, silent: float) -> None:
        index = self._progress[rank]
        _log.warning(
            f"rank {rank} recovered after {silent:.1f} s: reported step {index}",
            run_id=self.run_id,
        )
        if self._emit is not None:
            self._emit(
                RankRecovered(run_id=self.run_id or "", rank=rank, silent_s=silent, index=index)
            )

    def lacking(self) -> list[int]:
        """The required ranks the oldest open round still lacks a report from."""
        slots = self._slots
        return [rank for rank in self.required_ranks if slots[rank] is None]

    def waiting_from(self, rank: int) -> bool:
        """Whether a report of ``rank`` waits for its round."""
        if rank < len(self._slots) and (
            self._slots[rank] is not None or self._following[rank] is not None
        ):
            return True
        return rank in self._ahead

    def _mismatch(self, run_id: str, named: dict[int, str]) -> CheckpointMismatch:
        """Loud, because the round loses its checkpoint: no snapshot, no best checkpoint."""
        self.mismatches += 1
        names = dict(sorted(named.items()))
        _log.warning("ranks named different checkpoints", round=self.rounds, checkpoints=names)
        return CheckpointMismatch(
            run_id=run_id,
            round=self.rounds,
            checkpoints={rank: named.get(rank) for rank in self.required_ranks},
        )

    def on_restart(self, event: WorkerGroupRestarted) -> None:
        """Drop partial rounds; the group may have a new size and required ranks."""
        if self.run_id is not None and event.run_id != self.run_id:
            self._reject(event, "run_id", f"{event.run_id!r}, but this run is {self.run_id!r}")
            return
        self.restarts += 1
        waiting = self.reports - self._done
        self.discarded += waiting
        self._done += waiting
        try:
            self._configure(event.world_size, event.required_ranks or None)
        except ValueError as exc:
            self._reject(event, "required_ranks", str(exc))
            if self.world_size:  # keep the old group, minus the partial rounds the restart ended
                self._configure(self.world_size, self.required_ranks)
        self._last_time = [event.time] * self.world_size  # the new group's silence starts here

    def _reject(self, event: Any, field: str, reason: str) -> None:
        """Count and announce a rejection; warn at the 1st, 2nd, 4th, 8th... (no flood)."""
        self.rejected += 1
        reason = reason if len(reason) <= 1000 else f"{reason[:997]}..."
        rank = getattr(event, "rank", -1)
        rank = rank if type(rank) is int else -1
        count = self.rejected
        if count & (count - 1) == 0:
            _log.warning(
                f"report of rank {rank} rejected ({field}): {reason}",
                rejected_so_far=count,
                next_warning_at=2 * count,
            )
        if self._emit is not None:
            run_id = event.run_id if type(event.run_id) is str else (self.run_id or "")
            self._emit(ReportRejected(run_id=run_id, rank=rank, field=field, reason=reason))


def _with(named: dict[int, str] | None, rank: int, checkpoint: str) -> dict[int, str]:
    if named is None:
        named = {}
    named[rank] = checkpoint
    return named
