"""The narrow callback interfaces the gathering handlers call directly.

``ReportCallback``, ``ExceptionCallback`` and ``RunCallback`` are called
synchronously, inside the bus (Ray Train's shape: an ``XxxCallbackHandler``
over a list of ``XxxCallback``). What users subclass is ``UserCallback``
(``_callback.py``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    from eventbus.events import RunResult, TrainRunContext

__all__ = ["ExceptionCallback", "ReportCallback", "RunCallback"]


@runtime_checkable
class ReportCallback(Protocol):
    """Anything that wants gathered report rounds (called inside the bus: keep it cheap)."""

    def after_report(
        self, run_context: TrainRunContext, metrics: list[dict[str, Any]], checkpoint: str | None
    ) -> None: ...


@runtime_checkable
class ExceptionCallback(Protocol):
    """Anything that wants the worker failures gathered in a health-check period."""

    def after_exception(
        self, run_context: TrainRunContext, worker_exceptions: dict[int, Exception]
    ) -> None: ...


@runtime_checkable
class RunCallback(Protocol):
    """Anything that wants the run's start and end."""

    def before_run(self, run_context: TrainRunContext) -> None: ...

    def after_run(self, run_context: TrainRunContext, result: RunResult) -> None: ...
