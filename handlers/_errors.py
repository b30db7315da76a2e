"""Exceptions that stand for what went wrong in workers, rebuilt from events' text
(nothing is ever unpickled)."""

from __future__ import annotations

from functools import partial
from typing import Any

from eventbus import RankStalled, WorkerFailure

__all__ = ["RankStalledError", "ReportError", "WorkerError", "WorkerGroupError"]


class WorkerError(Exception):
    """A worker's exception as ``after_exception`` receives it from a log or a replay,
    carried as text (the original would need pickle): the ``rank`` that raised it, its
    ``error_type`` (``RuntimeError``), ``message``, formatted ``traceback``, and whether
    the worker said a retry may succeed (``retryable``).
    """

    def __init__(
        self,
        rank: int,
        error_type: str,
        message: str,
        traceback: str = "",
        *,
        retryable: bool = False,
    ) -> None:
        super().__init__(f"{error_type}: {message}" if message else error_type)
        self.rank = rank
        self.error_type = error_type
        self.message = message
        self.traceback = traceback
        self.retryable = retryable

    def __reduce__(self) -> tuple[Any, ...]:  # pickled whole (Ray ships exceptions)
        rebuild = partial(type(self), retryable=self.retryable)
        return rebuild, (self.rank, self.error_type, self.message, self.traceback)

    @classmethod
    def from_failure(cls, failure: WorkerFailure) -> WorkerError:
        return cls(
            failure.rank,
            failure.error_type,
            failure.message,
            failure.traceback,
            retryable=failure.retryable,
        )

    def to_failure(self, run_id: str) -> WorkerFailure:
        return WorkerFailure(
            run_id=run_id,
            rank=self.rank,
            error_type=self.error_type,
            message=self.message,
            traceback=self.traceback,
            retryable=self.retryable,
        )


class RankStalledError(Exception):
    """A rank that stalled, as ``after_exception`` receives it: ``{rank: RankStalledError}``,
    wrapping the ``RankStalled`` event (``stall``), with its fields."""

    def __init__(self, stall: RankStalled) -> None:
        at = f"step {stall.last_index}" if stall.last_index >= 0 else "no step yet"
        super().__init__(
            f"rank {stall.rank} stalled: no report for {stall.silent_s:.1f} s "
            f"({stall.periods} periods of {stall.period:g} s), last at {at}; "
            f"the other ranks are at step {stall.others_at}"
        )
        self.stall = stall
        self.rank = stall.rank
        self.silent_s = stall.silent_s
        self.last_index = stall.last_index

    def __reduce__(self) -> tuple[Any, ...]:  # pickled whole (Ray ships exceptions)
        return type(self), (self.stall,)


class WorkerGroupError(Exception):
    """Workers failed and no restart was left: ``failures`` maps rank to its exception."""

    def __init__(self, failures: dict[int, BaseException]) -> None:
        ranks = ", ".join(str(r) for r in sorted(failures))
        first = failures[min(failures)]
        super().__init__(f"worker rank(s) {ranks} failed; first: {type(first).__name__}: {first}")
        self.failures = failures


class ReportError(ValueError):
    """A report its rank could not make: ``field`` (``metrics['loss']``, ``checkpoint``)
    holds what a log cannot, for ``reason``. Nothing was reported."""

    def __init__(self, rank: int, field: str, reason: str) -> None:
        super().__init__(f"rank {rank}: report refused: {field}: {reason}")
        self.rank = rank
        self.field = field
        self.reason = reason

    def __reduce__(self) -> tuple[Any, ...]:  # pickled whole (Ray ships exceptions)
        return type(self), (self.rank, self.field, self.reason)
