"""Report gathering: one FIFO per rank, one round per report of every required rank.

Ranks report at their own pace: rank 0 may be several reports ahead. A round
is released only when every required rank has a report waiting; then exactly
one report per required rank is taken, in rank order. The count of required
ranks still missing a report is kept up to date, so a report costs O(1) and
a round O(required ranks).

A round is told two ways: synchronously to the ``ReportCallback``s given
(Ray Train's shape: a handler over a list of callbacks), and, on a bus, as a
``RoundGathered`` event carrying the run's context, to which training
callbacks subscribe like any handler.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Sequence
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
from eventbus.events import RoundGathered, TrainRunContext

from ._interfaces import ReportCallback
from ._metric_values import FrozenDict, MetricsError, freeze_metrics
from ._metrics import mean_metrics

__all__ = ["ReportCallbackHandler"]

ContextFor = Callable[[Event], TrainRunContext]

#: Largest world size a run may have: the gatherer keeps a FIFO per rank, and a
#: report claiming a billion ranks must not make it allocate a billion.
MAX_WORLD_SIZE = 1 << 17

_log = get_logger("handlers.reports")


class ReportCallbackHandler:
    """Gathers ``Report`` events into rounds: calls ``after_report`` of each callback
    and, subscribed to a bus, emits a ``RoundGathered``.

    ``world_size`` defaults to the run's (the context's, or the first
    report's); ``required_ranks`` to all ranks. A ``WorkerGroupRestarted``
    discards partial rounds and sets both anew. Bad reports (another run's,
    a rank or index out of place, metrics that are not JSON values a log can
    hold) become ``ReportRejected`` events naming rank and field. A round
    has the checkpoint any of its ranks named (ranks naming none agree);
    ranks naming different ones give a ``CheckpointMismatch`` and a warning
    naming them, and the round has no checkpoint. Nothing already gathered is lost either
    way. Callbacks get each rank's metrics as a read-only copy (``FrozenDict``).

    ``announce_checkpoints``: a round's checkpoint is also announced as
    ``CheckpointSaved`` (on which the state store snapshots), right behind
    its ``RoundGathered``, so the snapshot holds the callbacks' states as of
    that round and no later one. A live run announces; a replay has the
    recorded announcements.
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
        #: Per rank, the reports waiting for their round, with their frozen metrics.
        self._queues: list[deque[tuple[Report, FrozenDict]]] = []
        self._required: list[bool] = []
        self._last_index: list[int] = []
        self._missing = 0
        self._configured = False
        #: Figures: reports accepted, rounds released, reports rejected, partial reports discarded.
        self.reports = 0
        self.rounds = 0
        self.rejected = 0
        self.discarded = 0
        self.mismatches = 0
        #: The checkpoint of the latest round that had one (where a restart resumes).
        self.last_checkpoint: str | None = None
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
        self._queues = [deque() for _ in range(world_size)]
        self._last_index = [-1] * world_size
        self._required = [False] * world_size
        for rank in required:
            self._required[rank] = True
        self._missing = len(required)
        self._configured = True

    def handle(self, report: Report | WorkerGroupRestarted) -> None:
        """A report (the hot path: every check is a comparison or a C-level type
        scan) or a restart."""
        if type(report) is not Report:
            if isinstance(report, WorkerGroupRestarted):
                self.on_restart(report)
            return
        if not self._configured:
            context = self._context_for(report)
            try:
                self._configure(context.world_size or report.world_size, None)
            except ValueError as exc:
                self._reject(report, "world_size", str(exc))
                return
        if self.run_id is None:
            self.run_id = self._context_for(report).run_id
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
        last_index = self._last_index
        if type(index) is not int:
            self._reject(report, "index", f"{index!r} is not an int")
            return
        if index <= last_index[rank]:
            last = last_index[rank]
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
        last_index[rank] = index
        self.reports += 1
        queue = self._queues[rank]
        if not queue:
            self._missing -= 1
            if self._missing == 0:
                queue.append((report, metrics))
                self._release()
                return
        queue.append((report, metrics))

    def _release(self) -> None:
        queues = self._queues
        required = self.required_ranks
        while True:
            entries = [queues[r].popleft() for r in required]
            self._missing = sum(1 for r in required if not queues[r])
            self._deliver(entries)
            if self._missing:
                return

    def _deliver(self, entries: Sequence[tuple[Report, FrozenDict]]) -> None:
        first = entries[0][0]
        # Ray's rule: the round has a checkpoint if any rank named one (all ranks
        # write to one storage location, usually rank 0 alone names it). Ranks
        # naming none agree with it; only two different names are a mismatch.
        checkpoint: str | None = None
        for report, _ in entries:
            named = report.checkpoint
            if named is not None and named != checkpoint:
                if checkpoint is not None:
                    self._mismatch([report for report, _ in entries])
                    checkpoint = None
                    break
                checkpoint = named
        self.rounds += 1
        if checkpoint is not None:
            self.last_checkpoint = checkpoint
        context = self._context_for(first)
        metrics: list[dict[str, Any]] = [frozen for _, frozen in entries]
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

    def _mismatch(self, reports: Sequence[Report]) -> None:
        """Loud, because the round loses its checkpoint: no snapshot, no best checkpoint."""
        self.mismatches += 1
        named = {r.rank: r.checkpoint for r in reports if r.checkpoint is not None}
        _log.warning(
            "ranks named different checkpoints for one round: the round has no checkpoint",
            round=self.rounds,
            checkpoints=named,
        )
        if self._bus is not None:
            self._bus.emit(
                CheckpointMismatch(
                    run_id=reports[0].run_id,
                    round=self.rounds,
                    checkpoints={r.rank: r.checkpoint for r in reports},
                ),
                derived=True,
            )

    def on_restart(self, event: WorkerGroupRestarted) -> None:
        """Drop partial rounds; the group may have a new size and required ranks."""
        if self.run_id is not None and event.run_id != self.run_id:
            self._reject(event, "run_id", f"{event.run_id!r}, but this run is {self.run_id!r}")
            return
        self.discarded += sum(len(q) for q in self._queues)
        try:
            self._configure(event.world_size, event.required_ranks or None)
        except ValueError as exc:
            self._reject(event, "required_ranks", str(exc))
            if self._configured:  # keep the old group, minus the partial rounds the restart ended
                self._configure(self.world_size, self.required_ranks)

    def _reject(self, event: Any, field: str, reason: str) -> None:
        """Count and announce a rejection; the rejected event's own fields may be of
        any type, so only well-typed ones are copied into the announcement."""
        self.rejected += 1
        if self._bus is not None:
            run_id = event.run_id if type(event.run_id) is str else (self.run_id or "")
            rank = getattr(event, "rank", -1)
            self._bus.emit(
                ReportRejected(
                    run_id=run_id,
                    rank=rank if type(rank) is int else -1,
                    field=field,
                    reason=reason if len(reason) <= 1000 else f"{reason[:997]}...",
                ),
                derived=True,
            )


def _first_event_context() -> ContextFor:
    """Used alone, the handler builds the run context from the first event it sees."""
    holder: list[TrainRunContext] = []

    def context_for(event: Event) -> TrainRunContext:
        if not holder:
            holder.append(TrainRunContext.from_event(event))
        return holder[0]

    return context_for
