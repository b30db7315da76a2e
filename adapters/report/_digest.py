"""One pass over a log into fixed-size figures: everything a run's report shows, in memory
that does not grow with the log. Events a resume rolled back are left out, as a replay does."""

from __future__ import annotations

import json
import os
from collections import Counter
from collections.abc import Callable
from itertools import filterfalse
from pathlib import Path
from typing import Any

import msgspec

from eventbus import (
    BudgetReport,
    CheckpointSaved,
    Event,
    HandlerFailed,
    HandlerStateChanged,
    HandlerTimedOut,
    HealthCheckTick,
    Report,
    ReportRejected,
    RoundGathered,
    RunFinished,
    RunResumed,
    RunStarted,
    StateRestored,
    StateSnapshotted,
    WorkerFailure,
    WorkerGroupRestarted,
)
from eventbus.log import LogReader
from eventbus.log._format import TruncatedTail
from eventbus.log._history import rollbacks

from ._cost import CostDigest
from ._limits import (
    MAX_LISTED,
    MAX_MESSAGE,
    MAX_NAME,
    MAX_RANKS_TRACKED,
    MAX_RESTORES,
    MAX_TRACEBACK,
    clip,
)
from ._metrics import MetricCharts


class Failure(msgspec.Struct, frozen=True, kw_only=True):
    """A worker's exception: when, where, what."""

    rank: int
    elapsed: float
    round: float
    error_type: str
    message: str
    traceback: str
    retryable: bool


class Fault(msgspec.Struct, frozen=True, kw_only=True):
    """A callback that raised or ran past its deadline."""

    handler: str
    elapsed: float
    event_type: str
    kind: str  # "failed" or "timed out"
    detail: str  # the error and message, or how long it ran and what became of it
    traceback: str = ""


class Damage(msgspec.Struct, frozen=True, kw_only=True):
    """What could not be read: a torn last record, corrupt records, placeholders."""

    truncated: TruncatedTail | None = None
    skipped: int = 0
    first_error: str = ""
    placeholders: int = 0

    @property
    def any(self) -> bool:
        return self.truncated is not None or self.skipped > 0 or self.placeholders > 0

    def lost(self) -> str:
        """What was lost, in words: the page's banner and the command's warning say it."""
        lost = []
        if self.truncated is not None:
            lost.append(
                f"the last record was cut short at byte {self.truncated.offset} "
                f"({self.truncated.size} bytes lost: a crash mid-write)"
            )
        if self.skipped:
            lost.append(f"{self.skipped} corrupt record(s) skipped ({self.first_error})")
        if self.placeholders:
            lost.append(f"{self.placeholders} record(s) did not decode as their type, left out")
        return "; ".join(lost)


class RunDigest:
    """A run as its report shows it; made by ``digest_log`` (or fed events by hand)."""

    def __init__(self, path: Path, run_id: str = "") -> None:
        self.path = path
        self.run_id = run_id
        self.name = ""
        self.world_size = 0
        self.config = ""  # the run's configuration, as JSON
        self.wall_start: float | None = None
        self.status = "unfinished"
        self.error: str | None = None
        self.stopped_by: str | None = None
        self.stop_reason: str | None = None
        #: Events read, by type: rounds, reports, restarts, placeholders...
        self.counts: Counter[type[Event]] = Counter()
        self.events = 0
        self.rolled_back = 0
        self.failures_by_rank: dict[int, int] = {}
        self.last_checkpoint: str | None = None
        self.resumes: list[str] = []
        self.rejections: list[str] = []
        self.snapshot_keys: tuple[str, ...] = ()
        self.snapshot_key_count = 0
        self.snapshot_errors: dict[str, str] = {}
        self.restores: list[StateRestored] = []
        self.failures: list[Failure] = []
        self.faults: list[Fault] = []
        self.damage = Damage()
        self.by_round = MetricCharts("round")
        self.by_report: MetricCharts | None = MetricCharts("report index")
        self.cost = CostDigest()
        self._elapsed_before = 0.0
        self._segment_start: float | None = None
        self._last_time = 0.0
        self._dispatch: dict[type[Event], Callable[[Any], None]] = {
            Report: self._report,
            RoundGathered: self._round,
            BudgetReport: self.cost.add_report,
            CheckpointSaved: self._checkpoint,
            WorkerFailure: self._failure,
            WorkerGroupRestarted: self._restart,
            RunStarted: self._started,
            RunResumed: self._resumed,
            RunFinished: self._finished,
            StateSnapshotted: self._snapshotted,
            StateRestored: self._restored,
            HandlerFailed: self._fault,
            HandlerTimedOut: self._fault,
            HandlerStateChanged: self.cost.state_changed,
            HealthCheckTick: self.cost.tick,
            ReportRejected: self._rejected,
        }

    @property
    def metrics(self) -> MetricCharts:
        """Rounds as the callbacks got them; report indices for a log without rounds."""
        if self.by_report is not None and not self.by_round.metrics:
            return self.by_report
        return self.by_round

    @property
    def duration(self) -> float:
        """Seconds of bus time the run lasted, each resumed process's own added up."""
        return self._elapsed(self._last_time)

    def add(self, event: Event) -> None:
        """Fold one event (in log order) into the figures."""
        self.events += 1
        self.counts[type(event)] += 1
        time = event.time
        if time - time != 0.0:  # NaN or infinite (a hostile log): no time to count
            time = self._last_time
        if self._segment_start is None:
            self._segment_start = time
        elif type(event) is RunStarted:  # a resumed process: its bus clock starts anew
            self._elapsed_before = self.duration
            self._segment_start = time
        self._last_time = time
        handle = self._dispatch.get(type(event))
        if handle is not None:
            handle(event)

    def _elapsed(self, time: float) -> float:
        """Seconds of bus time into the run at ``time`` of the current process."""
        start = self._segment_start if self._segment_start is not None else time
        return self._elapsed_before + max(0.0, time - start)

    def _report(self, event: Report) -> None:
        by_report = self.by_report
        if by_report is not None:
            by_report.add(event.index, (event.rank,), (event.metrics,))

    def _round(self, event: RoundGathered) -> None:
        if self.by_report is not None:  # the log has rounds: chart those
            self.by_report = None
        self.by_round.add(event.round, event.ranks, event.metrics)

    def _mark(self, kind: str, label: str, x: float | None = None) -> None:
        for charts in filter(None, (self.by_round, self.by_report)):
            charts.mark(charts.last_x + 1 if x is None else x, kind, label)

    def _checkpoint(self, event: CheckpointSaved) -> None:
        self.last_checkpoint = clip(event.checkpoint, MAX_MESSAGE)
        self._mark("checkpoint", f"checkpoint {clip(event.checkpoint)}", event.index)

    def _failure(self, event: WorkerFailure) -> None:
        rank = event.rank
        if rank in self.failures_by_rank or len(self.failures_by_rank) < MAX_RANKS_TRACKED:
            self.failures_by_rank[rank] = self.failures_by_rank.get(rank, 0) + 1
        x = self.metrics.last_x + 1
        self._mark("failure", f"rank {rank}: {clip(event.error_type)}: {clip(event.message)}")
        if len(self.failures) < MAX_LISTED:
            self.failures.append(
                Failure(
                    rank=rank,
                    elapsed=self._elapsed(event.time),
                    round=x,
                    error_type=clip(event.error_type),
                    message=clip(event.message, MAX_MESSAGE),
                    traceback=clip(event.traceback, MAX_TRACEBACK),
                    retryable=event.retryable,
                )
            )

    def _restart(self, event: WorkerGroupRestarted) -> None:
        self._mark("restart", f"workers restarted (world size {event.world_size})")

    def _started(self, event: RunStarted) -> None:
        self.cost.new_bus()
        self.run_id = clip(event.run_id) or self.run_id
        self.name = clip(event.name)
        self.world_size = event.world_size
        self.config = clip(json.dumps(event.config, default=repr, indent=1), MAX_MESSAGE)
        if event.wall_time and self.wall_start is None:
            self.wall_start = event.wall_time

    def _resumed(self, event: RunResumed) -> None:
        if len(self.resumes) < MAX_RESTORES:
            self.resumes.append(clip(event.checkpoint, MAX_MESSAGE))
        self._mark("resume", f"resumed from {clip(event.checkpoint)}", event.position.rounds)

    def _finished(self, event: RunFinished) -> None:
        self.status = event.status
        self.error = _clipped(event.error)
        self.stopped_by = _clipped(event.stopped_by)
        self.stop_reason = _clipped(event.stop_reason)

    def _snapshotted(self, event: StateSnapshotted) -> None:
        self.snapshot_keys = tuple(clip(key, MAX_NAME) for key in event.keys[:MAX_RESTORES])
        self.snapshot_key_count = len(event.keys)
        for key, why in event.errors.items():
            if len(self.snapshot_errors) < MAX_RESTORES:
                self.snapshot_errors[clip(key)] = clip(why, MAX_MESSAGE)
        if event.error and len(self.snapshot_errors) < MAX_RESTORES:
            self.snapshot_errors[clip(event.checkpoint)] = clip(event.error, MAX_MESSAGE)

    def _restored(self, event: StateRestored) -> None:
        if len(self.restores) < MAX_RESTORES:
            self.restores.append(
                msgspec.structs.replace(
                    event,
                    checkpoint=clip(event.checkpoint, MAX_MESSAGE),
                    restored=_few(event.restored),
                    missing=_few(event.missing),
                    unsaved=_few(event.unsaved),
                    mismatched=_few(event.mismatched),
                    warnings=_few(event.warnings, MAX_MESSAGE),
                )
            )

    def _fault(self, event: HandlerFailed | HandlerTimedOut) -> None:
        if len(self.faults) >= MAX_LISTED:
            return
        if isinstance(event, HandlerFailed):
            kind, traceback = "failed", clip(event.traceback, MAX_TRACEBACK)
            detail = clip(f"{event.error_type}: {event.message}", MAX_MESSAGE)
        else:
            kind, traceback = "timed out", ""
            detail = (
                f"ran {event.elapsed:.3f} s past a {event.timeout:g} s deadline ({event.outcome})"
            )
        self.faults.append(
            Fault(
                handler=clip(event.handler),
                elapsed=self._elapsed(event.time),
                event_type=clip(event.event_type),
                kind=kind,
                detail=detail,
                traceback=traceback,
            )
        )

    def _rejected(self, event: ReportRejected) -> None:
        if len(self.rejections) < MAX_RESTORES:
            self.rejections.append(
                clip(f"rank {event.rank}, {event.field}: {event.reason}", MAX_MESSAGE)
            )


def _clipped(text: str | None) -> str | None:
    return None if text is None else clip(text, MAX_MESSAGE)


def _few(names: tuple[str, ...], limit: int = MAX_NAME) -> tuple[str, ...]:
    """The first names of a list, each clipped, and how many more there were."""
    kept = tuple(clip(name, limit) for name in names[:MAX_RESTORES])
    more = len(names) - MAX_RESTORES
    return (*kept, f"... and {more} more") if more > 0 else kept


def digest_log(path: str | os.PathLike[str]) -> RunDigest:
    """Read the log at ``path`` once. A damaged log still gives what was read (the damage
    in ``digest.damage``): ``LogError`` or ``OSError`` only for a file that is no log."""
    plan = rollbacks(path)
    with LogReader(path, skip_corrupt=True) as reader:
        digest = RunDigest(Path(path), reader.header.run_id)
        add = digest.add
        for event in reader if plan is None else filterfalse(plan.is_rolled_back, reader):
            add(event)
    digest.rolled_back = reader.count - digest.events
    digest.damage = Damage(
        truncated=reader.truncated,
        skipped=reader.skipped,
        first_error=str(reader.errors[0]) if reader.errors else "",
        placeholders=reader.placeholders,
    )
    return digest
