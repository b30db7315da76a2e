"""Report gathering: one FIFO per rank, one round per report of every required rank.

Ranks report at their own pace: rank 0 may be several reports ahead. A round
is released only when every required rank has a report waiting; then exactly
one report per required rank is taken, in rank order.

The heads of the FIFOs are kept as two rounds (the oldest open one and the
next) of slots by rank, so a report costs a few comparisons, a slot store and
a count, whatever the world size, and a complete round's slots are already
its ``metrics`` list. Only reports of a rank two or more rounds ahead wait in
a queue of that rank's. The first report of a run, reports naming a
checkpoint and every rejection take ``_admit``, which names what is wrong.

A round is told two ways: synchronously to the ``ReportCallback``s given
(Ray Train's shape: a handler over a list of callbacks), and, on a bus, as a
``RoundGathered`` event carrying the run's context, to which training
callbacks subscribe like any handler.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Iterable
from typing import Any

from eventbus import (
    CheckpointMismatch,
    CheckpointSaved,
    Event,
    EventBus,
    Report,
    ReportRejected,
    Stage,
    Subscription,
    WorkerGroupRestarted,
    get_logger,
)
from eventbus.events import RoundGathered, RunPosition, TrainRunContext

from ._interfaces import ReportCallback
from ._metric_values import FrozenDict, MetricsError, freeze_metrics
from ._metrics import mean_metrics
from .options import MAX_WORLD_SIZE

__all__ = ["ReportCallbackHandler"]

ContextFor = Callable[[Event], TrainRunContext]

#: The run's id before its first report: equal to no report's, so the first report
#: takes the slow path, which learns the run's id (and begins the run).
_NO_RUN: Any = object()

_log = get_logger("handlers.reports")


class ReportCallbackHandler:
    """Gathers ``Report`` events into rounds: calls ``after_report`` of each callback
    and, subscribed to a bus, emits a ``RoundGathered``.

    ``world_size`` defaults to the run's (the context's, or the first
    report's); ``required_ranks`` to all ranks; a ``WorkerGroupRestarted``
    discards partial rounds and sets both anew. Bad reports become
    ``ReportRejected`` events naming rank and field. A round has the
    checkpoint any of its ranks named; different names are a
    ``CheckpointMismatch`` and the round has none. Callbacks get each rank's
    metrics read-only (``FrozenDict``). ``announce_checkpoints``: a round's
    checkpoint is announced as ``CheckpointSaved`` right behind its
    ``RoundGathered`` (a replay has the recorded ones), so the state store's
    snapshot holds the callbacks' states as of that round.
    """

    def __init__(
        self,
        report_callbacks: Iterable[ReportCallback] = (),
        *,
        world_size: int | None = None,
        required_ranks: Iterable[int] | None = None,
        context_for: ContextFor | None = None,
        announce_checkpoints: bool = False,
    ) -> None:
        self.report_callbacks = list(report_callbacks)
        self.announce_checkpoints = announce_checkpoints
        self._context_for = context_for or _first_event_context()
        self._bus: EventBus | None = None
        self.world_size = 0
        self.required_ranks: tuple[int, ...] = ()
        self.run_id: str | None = None
        self._run_key: Any = _NO_RUN
        self._required: list[bool] = []
        self._all_required = True
        #: Per rank, the index of its latest accepted report; infinite for ranks
        #: not required, so that one comparison turns both away from the fast path.
        self._last_index: list[float] = []
        #: The oldest open round: its slots by rank (``None``: no report yet), the
        #: checkpoints named in it (``None``: none), how many required ranks it lacks.
        self._slots: list[Any] = []
        self._named: dict[int, str] | None = None
        self._missing = 0
        self._not_required = 0
        #: The round after it, the same way, and per rank two or more rounds ahead
        #: its reports for the rounds after that, oldest first, with their checkpoints.
        self._following: list[Any] = []
        self._following_named: dict[int, str] | None = None
        self._ahead: dict[int, deque[tuple[FrozenDict, str | None]]] = {}
        #: Reports in released rounds and discarded ones (``reports`` adds those waiting).
        self._done = 0
        self._configured = False
        #: Figures: rounds released, reports rejected, partial reports discarded.
        self.rounds = 0
        self.rejected = 0
        self.discarded = 0
        self.mismatches = 0
        #: The checkpoint of the latest round that had one (where a restart resumes).
        self.last_checkpoint: str | None = None
        #: Where the run stood at each recent checkpoint round, by round (``position_at``).
        self._positions: dict[int, RunPosition] = {}
        if world_size is not None:
            self._configure(world_size, required_ranks)
        elif required_ranks is not None:
            raise ValueError("required_ranks needs world_size")

    # --- wiring ------------------------------------------------------------------

    def subscribe(self, bus: EventBus, *, order: int = Stage.GATHER_REPORTS) -> Subscription:
        """Gather from ``bus`` (inline, so rounds follow publish order exactly).

        One gatherer per bus: a second would deliver every round twice.
        """
        if RoundGathered in bus.derived_types:
            raise ValueError(
                "this bus already gathers reports into rounds (training callbacks are "
                "attached to it): attach every training callback in one call, or use "
                "another bus; a second gatherer would deliver each round twice"
            )
        self._bus = bus
        bus.derives(RoundGathered, ReportRejected, CheckpointMismatch)
        if self.announce_checkpoints:
            bus.derives(CheckpointSaved)
        return bus.subscribe(
            (Report, WorkerGroupRestarted),
            self.handle,
            name="handlers.ReportCallbackHandler",
            order=order,
        )

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
        self.world_size = world_size
        self.required_ranks = tuple(required)
        self._required = [False] * world_size
        for rank in required:
            self._required[rank] = True
        self._all_required = len(required) == world_size
        self._last_index = [-1 if needed else math.inf for needed in self._required]
        self._slots = [None] * world_size
        self._named = None
        self._missing = len(required)
        self._not_required = world_size - len(required)
        self._following = [None] * world_size
        self._following_named = None
        self._ahead = {}
        self._configured = True

    @property
    def reports(self) -> int:
        """Reports accepted (counted per round, not per report: the per-report path is
        the hot one)."""
        waiting = len(self.required_ranks) - self._missing
        waiting += self.world_size - self._following.count(None)
        waiting += sum(len(queue) for queue in self._ahead.values())
        return self._done + waiting

    def handle(self, report: Report | WorkerGroupRestarted) -> None:
        """A report or a restart. A well-formed report of a required rank passes
        one chain of comparisons and fills its slot; anything else is ``_admit``'s."""
        if type(report) is Report:
            rank = report.rank
            index = report.index
            world_size = self.world_size  # 0 until configured: the first report is _admit's
            last_index = self._last_index
            if (
                type(rank) is int
                and type(index) is int
                and 0 <= rank < world_size
                and index > last_index[rank]  # never for a rank not required
                and report.world_size == world_size
                and report.run_id == self._run_key
                and report.checkpoint is None
            ):
                metrics = report.metrics
                if type(metrics) is not FrozenDict:  # as a live run's Reporter already froze them
                    try:
                        metrics = freeze_metrics(metrics)
                    except MetricsError as exc:
                        self._reject(report, exc.field, exc.reason)
                        return
                last_index[rank] = index
                slots = self._slots
                if slots[rank] is None:
                    slots[rank] = metrics
                    self._missing -= 1
                    if not self._missing:
                        self._release(report)
                    return
                slots = self._following
                if slots[rank] is None:
                    slots[rank] = metrics
                    return
                self._queue_ahead(rank, metrics, None)
                return
            self._admit(report)
        elif isinstance(report, WorkerGroupRestarted):
            self.on_restart(report)

    def _admit(self, report: Report) -> None:
        """Every rule in order, each rejection naming its field; what passes is accepted."""
        if not self._configured:
            context = self._context_for(report)
            try:
                self._configure(context.world_size or report.world_size, None)
            except ValueError as exc:
                self._reject(report, "world_size", str(exc))
                return
        if self.run_id is None:
            self.run_id = self._run_key = self._context_for(report).run_id
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
        last = self._last_index[rank] if self._required[rank] else -1
        if index <= last:
            reason = (
                f"{index} is negative" if index < 0 else f"{index} after {last}: not increasing"
            )
            self._reject(report, "index", reason)
            return
        try:
            metrics = freeze_metrics(report.metrics)
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
        else:
            self._queue_ahead(rank, metrics, checkpoint)

    def _queue_ahead(self, rank: int, metrics: FrozenDict, checkpoint: str | None) -> None:
        """``rank`` has reports in both open rounds already: this one waits in its queue."""
        queue = self._ahead.get(rank)
        if queue is None:
            queue = self._ahead[rank] = deque()
        queue.append((metrics, checkpoint))

    def _release(self, report: Report) -> None:
        """The oldest open round is complete (``report`` completed it, so the rounds
        after it lack that rank's): deliver it. The next round is opened first, so a
        report callback that raises leaves the gatherer as it should be."""
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
        self._deliver(metrics, named, report)

    def _deliver(self, metrics: list[Any], named: dict[int, str] | None, report: Report) -> None:
        # Ray's rule: the round has a checkpoint if any rank named one (all ranks
        # write to one storage location, usually rank 0 alone names it). Ranks
        # naming none agree with it; only two different names are a mismatch.
        checkpoint: str | None = None
        if named:
            names = set(named.values())
            if len(names) == 1:
                (checkpoint,) = names
            else:
                self._mismatch(report.run_id, named)
        self.rounds += 1
        if checkpoint is not None:
            self.last_checkpoint = checkpoint
            if self.announce_checkpoints:  # a live run, whose snapshot will want it
                self._keep_position(checkpoint)
        context = self._context_for(report)
        for callback in self.report_callbacks:
            callback.after_report(context, metrics, checkpoint)
        bus = self._bus
        if bus is None:
            return
        round_ = self.rounds - 1
        ranks = self.required_ranks
        bus.emit(
            RoundGathered(
                context=context, round=round_, ranks=ranks, metrics=metrics, checkpoint=checkpoint
            ),
            derived=True,
        )
        if checkpoint is not None and self.announce_checkpoints:
            bus.emit(
                CheckpointSaved(
                    run_id=context.run_id,
                    checkpoint=checkpoint,
                    index=round_,
                    ranks=ranks,
                    metrics=mean_metrics(metrics),
                ),
                derived=True,
            )

    # --- resuming ----------------------------------------------------------------

    def _keep_position(self, checkpoint: str) -> None:
        """Note where the run stands as the round of ``checkpoint`` is released (not
        when it is snapshotted: by then later rounds' reports may have come in).
        A rank's next index is the one after its latest accepted report, less
        those it has waiting (its indices increase by one, as a ``Reporter``'s)."""
        next_index = [
            int(last) + 1 - (self._slots[rank] is not None)
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
        )
        for old in [r for r in self._positions if r < round_ - 64]:  # never snapshotted
            del self._positions[old]

    def position_at(self, round_: int) -> RunPosition | None:
        """Where the run stood when round ``round_`` (one with a checkpoint) was released."""
        return self._positions.pop(round_, None)

    def resume_at(self, position: RunPosition, checkpoint: str) -> None:
        """Continue from ``position`` (rounds, each rank's next index, figures);
        ``checkpoint`` is where a restart resumes."""
        self._configure(position.world_size, position.required_ranks or None)
        for rank, index in enumerate(position.next_index[: self.world_size]):
            if self._required[rank] and index > 0:
                self._last_index[rank] = index - 1
        self.rounds, self._done = position.rounds, position.reports
        self.rejected, self.mismatches = position.rejected, position.mismatches
        self.last_checkpoint = checkpoint

    def lacking(self) -> list[int]:
        """The required ranks the oldest open round still lacks a report from."""
        slots = self._slots
        return [rank for rank in self.required_ranks if slots[rank] is None]

    def waiting_from(self, rank: int) -> bool:
        """Whether a report of ``rank`` waits for its round."""
        queued = (self._slots[rank], self._following[rank]) if rank < len(self._slots) else ()
        return any(slot is not None for slot in queued) or rank in self._ahead

    def _mismatch(self, run_id: str, named: dict[int, str]) -> None:
        """Loud, because the round loses its checkpoint: no snapshot, no best checkpoint."""
        self.mismatches += 1
        names = dict(sorted(named.items()))
        _log.warning("ranks named different checkpoints", round=self.rounds, checkpoints=names)
        if self._bus is not None:
            self._bus.emit(
                CheckpointMismatch(
                    run_id=run_id,
                    round=self.rounds,
                    checkpoints={rank: named.get(rank) for rank in self.required_ranks},
                ),
                derived=True,
            )

    def on_restart(self, event: WorkerGroupRestarted) -> None:
        """Drop partial rounds; the group may have a new size and required ranks."""
        if self.run_id is not None and event.run_id != self.run_id:
            self._reject(event, "run_id", f"{event.run_id!r}, but this run is {self.run_id!r}")
            return
        waiting = self.reports - self._done
        self.discarded += waiting
        self._done += waiting
        try:
            self._configure(event.world_size, event.required_ranks or None)
        except ValueError as exc:
            self._reject(event, "required_ranks", str(exc))
            if self._configured:  # keep the old group, minus the partial rounds the restart ended
                self._configure(self.world_size, self.required_ranks)

    def _reject(self, event: Any, field: str, reason: str) -> None:
        """Count and announce a rejection, and say so on the console at the 1st, 2nd,
        4th, 8th... (heard, never a flood). The rejected event's own fields may be of
        any type, so only well-typed ones are copied into the announcement."""
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
        if self._bus is not None:
            run_id = event.run_id if type(event.run_id) is str else (self.run_id or "")
            self._bus.emit(
                ReportRejected(run_id=run_id, rank=rank, field=field, reason=reason),
                derived=True,
            )


def _with(named: dict[int, str] | None, rank: int, checkpoint: str) -> dict[int, str]:
    """``named`` (a new dict for ``None``: most rounds name no checkpoint) plus ``rank``'s."""
    if named is None:
        named = {}
    named[rank] = checkpoint
    return named


def _first_event_context() -> ContextFor:
    """Used alone, the handler builds the run context from the first event it sees."""
    holder: list[TrainRunContext] = []

    def context_for(event: Event) -> TrainRunContext:
        if not holder:
            holder.append(TrainRunContext.from_event(event))
        return holder[0]

    return context_for
