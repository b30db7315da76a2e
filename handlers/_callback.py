"""``UserCallback``: what users subclass to write a training callback."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from eventbus import Event, EventBus
from eventbus._subscription import DeliveryMode, ErrorPolicy, OverBudgetPolicy, Subscription
from eventbus.state._model import callback_name

from ._attach import attach_user_callbacks
from ._user import base_hook

if TYPE_CHECKING:
    from eventbus import RunResult, TrainRunContext

__all__ = ["UserCallback"]


class UserCallback:
    """Base class of training callbacks: Ray Train v2's hooks, plus the run's.

    Override any of the methods, as ``def`` or ``async def``. Each overridden method
    becomes its own bus subscription named ``<Class>.<method>``, with the bus's deadline,
    error policy and budget accounting. Its ``repr`` is its readable name (the class name
    with its ``state_key``, or alone).

    Attributes:
        timeout: each call's deadline, seconds (``EventBus.subscribe``'s).
        budget: its share of a health-check period.
        on_error: ``"log"``, ``"raise"`` or ``"disable"`` (after ``max_faults``).
        max_faults: faults before ``on_error="disable"`` disables it.
        over_budget: ``"warn"``, ``"coalesce"`` or ``"disable"``.
        probation: whole periods a hook disabled by ``over_budget="disable"`` stays so.
        delivery: ``"inline"`` or ``"lane"``, as ``EventBus.subscribe``'s.
        blocking: run sync hooks in a worker thread, abandoned at the deadline.
        event_types: raw events this callback also wants, delivered to
            ``on_event(run_context, event)``.

    A callback stops the run by setting ``should_stop``; with ``stops_on``, the names of
    the metrics whose rounds may change it (``EarlyStopping``'s metric), the Hugging Face
    adapter's hooks wait for it only at logs carrying one of them.

    ``None`` means the bus's default. A callback that must see the bus itself defines
    ``__eventbus_subscribe__(self, bus) -> Iterable[Subscription]``, called once its hooks
    are subscribed; the subscriptions it returns count as its own.
    """

    timeout: ClassVar[float | None] = None
    budget: ClassVar[float | None] = None
    on_error: ClassVar[ErrorPolicy | None] = None
    max_faults: ClassVar[int | None] = None
    over_budget: ClassVar[OverBudgetPolicy | None] = None
    probation: ClassVar[int | None] = None
    delivery: ClassVar[DeliveryMode | None] = None
    blocking: ClassVar[bool] = False
    event_types: ClassVar[tuple[type[Event], ...]] = ()

    def __repr__(self) -> str:
        return callback_name(self)

    @base_hook
    def before_run(self, run_context: TrainRunContext) -> Any:
        """Called once, before any other method."""

    @base_hook
    def after_report(
        self, run_context: TrainRunContext, metrics: list[dict[str, Any]], checkpoint: str | None
    ) -> Any:
        """Called once per gathered round: ``metrics[i]`` is the i-th required rank's dict."""

    @base_hook
    def after_exception(
        self, run_context: TrainRunContext, worker_exceptions: dict[int, Exception]
    ) -> Any:
        """Called once per health-check period in which workers failed: ``{rank: exception}``."""

    @base_hook
    def after_run(self, run_context: TrainRunContext, result: RunResult) -> Any:
        """Called once, last, also when the run failed or was cancelled."""

    @base_hook
    def on_event(self, run_context: TrainRunContext, event: Event) -> Any:
        """Called for each event of ``event_types`` (none by default)."""

    @classmethod
    def __eventbus_attach__(cls, bus: EventBus, callbacks: list[Any]) -> list[list[Subscription]]:
        """Attach ``callbacks`` to ``bus`` as a run does; per callback, its subscriptions."""
        return attach_user_callbacks(bus, callbacks).user.subscriptions_by_callback
