"""One history per run across resumes: where a log ends, and what its resumes rolled back
(a resumed run appends to its log, so the log holds what the crash undid too)."""

from __future__ import annotations

import math
import os
from bisect import bisect_right
from collections.abc import Iterable

import msgspec

from .._events import (
    BudgetReport,
    Event,
    HealthCheckTick,
    Report,
    RunFinished,
    RunResumed,
    RunStarted,
)
from .._periods import close_period
from ._reader import LogReader, require_file

__all__ = ["LogTail", "Rollbacks", "rollbacks", "scan_tail"]

#: The type tag every ``RunResumed`` record holds (msgpack and JSON alike).
RESUMED_TAG = b"RunResumed"

SEARCH_BLOCK = 1 << 20


class LogTail(msgspec.Struct, frozen=True, kw_only=True):
    """What a log held when a recorder appended to it: where the resumed run's bus
    continues from. ``closed``: the recorded bus closed (no period cut by a crash);
    ``dropped_bytes``: a torn last record, cut off; ``skipped``: corrupt records (kept)."""

    events: int = 0
    last_seq: int = -1
    last_time: float | None = None
    last_period: int = -1
    period_end: float | None = None
    closed: bool = False
    dropped_bytes: int = 0
    skipped: int = 0

    def cut_period(self, *, period: float, budget: float) -> BudgetReport | None:
        """The partial report of the period a crash cut (``None`` if the bus closed), with
        no handlers: what they cost died with the process."""
        if self.closed or self.last_time is None:
            return None
        start = self.period_end if self.period_end is not None else self.last_time
        end = max(start, self.last_time)
        index = self.last_period + 1
        return close_period((), index, start, end, budget, period=period, partial=True)[0]


def scan_tail(reader: LogReader) -> LogTail:
    """Read ``reader`` to its end for the figures a resumed run continues from."""
    last_seq = -1
    last_time: float | None = None
    last_period = -1
    period_end: float | None = None
    closed = False
    running = False  # a run started and not finished: a partial report is a resume's
    for event in reader:
        if event.seq > last_seq:
            last_seq = event.seq
        last_time = event.time
        if isinstance(event, HealthCheckTick | BudgetReport):
            if event.period >= last_period:
                last_period, period_end = event.period, event.end
            if isinstance(event, BudgetReport):
                closed = event.partial and not running
        elif isinstance(event, RunStarted | RunFinished):
            running = isinstance(event, RunStarted)
    return LogTail(
        events=reader.count,
        last_seq=last_seq,
        last_time=last_time,
        last_period=last_period,
        period_end=period_end,
        closed=closed,
        skipped=reader.skipped,
    )


class Rollbacks:
    """The resumes of a log (its ``RunResumed`` events, in log order), and which of its
    events they rolled back: for one at ``seq`` s with ``position`` p, an earlier ``Report``
    E when ``E.index >= p.next_index[E.rank]``, any other event when
    ``p.checkpoint_seq < E.seq < s`` (never ``RunStarted`` or ``RunResumed``)."""

    __slots__ = ("_ahead", "_last", "_spans", "_unrequired", "resumes")

    def __init__(self, resumes: Iterable[RunResumed]) -> None:

        self.resumes: tuple[RunResumed, ...] = tuple(resumes)
        # No event at or past the last resume is rolled back: one comparison for most.
        self._last = max((r.seq for r in self.resumes), default=-1)
        spans: list[tuple[int, int]] = []
        firsts: dict[int, list[tuple[int, int]]] = {}  # rank: (resume seq, next index)
        unrequired: dict[int, list[tuple[int, int]]] = {}  # rank: spans it goes by seq in
        for r in self.resumes:
            checkpoint_seq = r.position.checkpoint_seq
            span = (checkpoint_seq + 1, r.seq - 1)  # seqs strictly between the two
            if checkpoint_seq >= 0:
                spans.append(span)
            for rank, first in enumerate(r.position.next_index):
                if first >= 0:
                    firsts.setdefault(rank, []).append((r.seq, first))
                elif checkpoint_seq >= 0:
                    unrequired.setdefault(rank, []).append(span)
        self._spans = _Spans(spans)
        self._ahead = {rank: _LeastAfter(plans) for rank, plans in firsts.items()}
        self._unrequired = {rank: _Spans(plans) for rank, plans in unrequired.items()}

    def is_rolled_back(self, event: Event) -> bool:
        """Whether a resume rolled ``event`` back."""
        seq = event.seq
        if seq >= self._last:
            return False
        if isinstance(event, Report):
            ahead = self._ahead.get(event.rank)
            if ahead is not None and ahead.least(seq) <= event.index:
                return True
            unrequired = self._unrequired.get(event.rank)
            return unrequired is not None and unrequired.holds(seq)
        if isinstance(event, RunResumed | RunStarted):
            return False
        return self._spans.holds(seq)


class _Spans:
    """Closed spans of ``seq``, merged into sorted disjoint ones (one bisection a lookup)."""

    __slots__ = ("_firsts", "_lasts")

    def __init__(self, spans: Iterable[tuple[int, int]]) -> None:
        self._firsts: list[int] = []
        self._lasts: list[int] = []
        for first, last in sorted(spans):
            if first > last:
                continue  # no seq between a checkpoint and a resume right after it
            if self._lasts and first <= self._lasts[-1] + 1:  # overlaps or touches
                self._lasts[-1] = max(self._lasts[-1], last)
            else:
                self._firsts.append(first)
                self._lasts.append(last)

    def holds(self, seq: int) -> bool:
        i = bisect_right(self._firsts, seq) - 1
        return i >= 0 and seq <= self._lasts[i]


class _LeastAfter:
    """Resumes of one rank as ``(resume seq, next index)``, with suffix minimums."""

    __slots__ = ("_least", "_seqs")

    def __init__(self, plans: list[tuple[int, int]]) -> None:
        plans.sort()
        self._seqs = [seq for seq, _ in plans]
        self._least = [first for _, first in plans]
        for i in range(len(plans) - 2, -1, -1):
            self._least[i] = min(self._least[i], self._least[i + 1])

    def least(self, seq: int) -> float:
        """The least next index of the resumes recorded after ``seq`` (inf if none)."""
        i = bisect_right(self._seqs, seq)
        return self._least[i] if i < len(self._least) else math.inf


def _mentions_resumed(path: str | os.PathLike[str], offset: int) -> bool:
    """Whether the bytes of the file past ``offset`` (the header) hold the type tag."""
    overlap = len(RESUMED_TAG) - 1
    block = bytearray(SEARCH_BLOCK + overlap)
    with open(path, "rb") as f, memoryview(block) as view:
        f.seek(offset)
        kept = 0
        while read := f.readinto(view[kept : kept + SEARCH_BLOCK]):
            end = kept + read
            if block.find(RESUMED_TAG, 0, end) >= 0:
                return True
            kept = min(overlap, end)
            view[:kept] = view[end - kept : end]
    return False


def rollbacks(path: str | os.PathLike[str]) -> Rollbacks | None:
    """The resumes of the log at ``path`` and what they rolled back; ``None`` if it has none
    (one byte search, no decoding). ``LogFormatError`` for a file that is not an event log;
    ``LogStreamError`` for one that can be read only once."""
    require_file(path, "finding a log's rollbacks")
    with LogReader(path) as reader:
        offset = reader.data_offset
    if not _mentions_resumed(path, offset):
        return None
    with LogReader(path, skip_corrupt=True) as reader:
        resumes = [event for event in reader if type(event) is RunResumed]
    return Rollbacks(resumes) if resumes else None
