"""The callback interfaces: what users implement, and what the handlers call.

``UserCallback`` is the one users subclass (all methods optional, sync or
async): each hook it overrides becomes its own bus subscription, to the
event the gathering emits for it. ``ReportCallback``, ``ExceptionCallback``
and ``RunCallback`` are the narrow interfaces the gathering handlers also
call directly, synchronously, inside the bus (Ray Train's shape: an
``XxxCallbackHandler`` over a list of ``XxxCallback``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar, Protocol, runtime_checkable

from eventbus import DeliveryMode, ErrorPolicy, Event, OverBudgetPolicy

if TYPE_CHECKING:
    from eventbus.events import RunResult, TrainRunContext

__all__ = ["ExceptionCallback", "ReportCallback", "RunCallback", "UserCallback"]


class UserCallback:
    """Base class of user callbacks (Ray Train v2 names, plus run hooks).

    Override any of the methods, as ``def`` or ``async def``. Each overridden
    method becomes its own bus subscription named ``<Class>.<method>``, with
    the bus's deadline, error policy and budget accounting. The class
    attributes below tune that subscription (``delivery`` is the bus's
    ``mode``: inline or lane); ``None`` means the bus default.
    ``event_types``: raw events this callback also wants, delivered to
    ``on_event(run_context, event)`` (for displays that count reports).
    """

    timeout: ClassVar[float | None] = None
    budget: ClassVar[float | None] = None
    on_error: ClassVar[ErrorPolicy | None] = None
    max_faults: ClassVar[int | None] = None
    over_budget: ClassVar[OverBudgetPolicy | None] = None
    delivery: ClassVar[DeliveryMode | None] = None
    blocking: ClassVar[bool] = False
    event_types: ClassVar[tuple[type[Event], ...]] = ()

    def before_run(self, run_context: TrainRunContext) -> Any:
        """Called once, before any other method."""

    def after_report(
        self, run_context: TrainRunContext, metrics: list[dict[str, Any]], checkpoint: str | None
    ) -> Any:
        """Called once per gathered round: ``metrics[i]`` is the i-th required rank's dict."""

    def after_exception(
        self, run_context: TrainRunContext, worker_exceptions: dict[int, Exception]
    ) -> Any:
        """Called once per health-check period in which workers failed: ``{rank: exception}``."""

    def after_run(self, run_context: TrainRunContext, result: RunResult) -> Any:
        """Called once, last, also when the run failed or was cancelled."""

    def on_event(self, run_context: TrainRunContext, event: Event) -> Any:
        """Called for each event of ``event_types`` (none by default)."""


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
