"""Training callbacks, each overridden method its own bus subscription (``<Class>.<method>``),
with the bus's deadline, error policy and budget accounting."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, TypeVar

from eventbus import (
    AfterRun,
    BeforeRun,
    Event,
    EventBus,
    FailuresGathered,
    RoundGathered,
    TrainRunContext,
    WorkerFailure,
)
from eventbus._options import Faults, OptionTypeError, Probation, Seconds, Share
from eventbus._stages import Stage
from eventbus._subscription import DeliveryMode, ErrorPolicy, OverBudgetPolicy, Subscription
from eventbus.options import OptionError, checked
from eventbus.state._model import callback_name, is_stateful

from ._errors import RankStalledError

if TYPE_CHECKING:
    from ._callback import UserCallback

__all__ = ["UserCallbackHandler", "base_hook", "implemented_hooks", "training_callbacks"]

#: Marks the base class's no-op hooks: a callback implements only the others.
_BASE_HOOK = "__eventbus_base_hook__"

F = TypeVar("F", bound=Callable[..., Any])


def base_hook(method: F) -> F:
    """Mark a base class's no-op hook, so that only overriding it subscribes."""
    setattr(method, _BASE_HOOK, True)
    return method


def _after_report(e: RoundGathered) -> tuple[Any, ...]:
    return (e.context, list(e.metrics), e.checkpoint)


#: Each training hook, and the event that makes it due.
_HOOKS: dict[str, type[Event]] = {
    "before_run": BeforeRun,
    "after_report": RoundGathered,
    "after_exception": FailuresGathered,
    "after_run": AfterRun,
}


class UserCallbackHandler:
    """Subscribes every hook ``callbacks`` implement to its gathered event, in callback order
    (one that needs the bus itself defines ``__eventbus_subscribe__(self, bus)``). The run
    context, each failure's exception and the run's end are the attachment's."""

    def __init__(
        self,
        callbacks: Iterable[UserCallback | Any],
        *,
        context_of: Callable[[Event], TrainRunContext],
        exception_of: Callable[[WorkerFailure], Exception],
        after_the_end: Callable[[Event], bool],
    ) -> None:
        self.callbacks = training_callbacks(callbacks)
        self._context_of = context_of
        self._exception_of = exception_of
        self._after_the_end = after_the_end
        self.subscriptions: list[Subscription] = []
        #: Per callback (same order), the subscriptions of its hooks.
        self.subscriptions_by_callback: list[list[Subscription]] = []

    def subscribe(self, bus: EventBus, *, order: int = Stage.CALLBACKS) -> list[Subscription]:
        """Subscribe each overridden method of each callback, in callback order."""
        names: dict[str, int] = {}
        context_of = self._context_of

        def on_event_args(event: Event) -> tuple[Any, ...]:
            return (context_of(event), event)

        exception_of = self._exception_of

        def after_exception_args(e: FailuresGathered) -> tuple[Any, ...]:
            """``{rank: exception}``: each failure's, each stall's."""
            exceptions = {f.rank: exception_of(f) for f in e.failures}
            for stall in e.stalls:
                exceptions.setdefault(stall.rank, RankStalledError(stall))
            return (e.context, exceptions)

        #: Each hook's arguments, from the event that makes it due.
        args_by_hook: dict[str, Callable[[Any], tuple[Any, ...]]] = {
            "before_run": lambda e: (e.context,),
            "after_report": _after_report,
            "after_exception": after_exception_args,
            "after_run": lambda e: (e.context, e.result),
        }

        for callback in self.callbacks:
            own: list[Subscription] = []
            self.subscriptions_by_callback.append(own)
            options = _subscription_options(callback)
            hooks: list[tuple[str, tuple[type[Event], ...], Callable[[Any], tuple[Any, ...]]]]
            hooks = [(hook, (_HOOKS[hook],), args) for hook, args in args_by_hook.items()]
            event_types = tuple(getattr(callback, "event_types", ()) or ())
            if event_types:
                hooks.append(("on_event", event_types, on_event_args))
            for hook, types, args_of in hooks:
                method = _overridden(callback, hook)
                if method is None:
                    continue
                name = f"{type(callback).__name__}.{hook}"
                names[name] = names.get(name, 0) + 1
                if names[name] > 1:
                    name = f"{name}#{names[name]}"
                kwargs = dict(options)
                if inspect.iscoroutinefunction(method):
                    kwargs.pop("blocking", None)  # blocking is for sync methods only
                handler = _calling(method, args_of)
                if hook == "on_event":
                    handler = _until_the_end(handler, self._after_the_end)
                try:
                    sub = bus.subscribe(types, handler, name=name, order=order, **kwargs)
                except (OptionError, OptionTypeError) as exc:  # its own timeout, budget...
                    raise type(exc)(exc.option, f"{name}: {exc}") from None
                own.append(sub)
            subscribe_itself = getattr(type(callback), "__eventbus_subscribe__", None)
            if subscribe_itself is not None:
                own.extend(subscribe_itself(callback, bus))
            self.subscriptions.extend(own)
        return self.subscriptions


def _calling(
    method: Callable[..., Any], args_of: Callable[[Any], tuple[Any, ...]]
) -> Callable[[Any], Any]:
    """The bus handler that calls ``method`` with an event's arguments for it."""
    if inspect.iscoroutinefunction(method):

        async def call_async(event: Any) -> None:
            await method(*args_of(event))

        return call_async

    if args_of is _after_report:
        # The hook due every round: its arguments spelled out, no tuple to spread.
        def call_after_report(event: RoundGathered) -> Any:
            return method(event.context, list(event.metrics), event.checkpoint)

        return call_after_report

    def call(event: Any) -> Any:
        # The bus awaits a coroutine a sync method returns.
        return method(*args_of(event))

    return call


def _until_the_end(
    handler: Callable[[Any], Any], after_the_end: Callable[[Event], bool]
) -> Callable[[Any], Any]:
    """``handler``, skipping the events that come after the run's end."""
    if inspect.iscoroutinefunction(handler):

        async def until_the_end_async(event: Event) -> None:
            if not after_the_end(event):
                await handler(event)

        return until_the_end_async

    def until_the_end(event: Event) -> Any:
        return None if after_the_end(event) else handler(event)

    return until_the_end


def implemented_hooks(callback: Any) -> dict[str, Callable[..., Any]]:
    """The training hooks ``callback`` really implements, by name (bound methods)."""
    hooks = {hook: _overridden(callback, hook) for hook in _HOOKS}
    return {hook: method for hook, method in hooks.items() if method is not None}


def training_callbacks(callbacks: Iterable[Any]) -> list[Any]:
    """``callbacks`` as a list, or ``TypeError`` naming the first that is no training
    callback (at the call, not at every round)."""
    if isinstance(callbacks, str | bytes) or not isinstance(callbacks, Iterable):
        raise TypeError(f"callbacks must be a list of training callbacks, got {callbacks!r}")
    found = list(callbacks)
    for index, callback in enumerate(found):
        if isinstance(callback, type):
            why = f"is a class: pass an instance, {callback.__name__}(...)"
        elif (
            implemented_hooks(callback)
            or getattr(type(callback), "__eventbus_attach__", None) is not None
            or is_stateful(callback)
        ):
            _subscription_options(callback)  # its options checked here, at the call
            continue  # a UserCallback, an object with its hooks, or one with state only
        elif callable(callback):
            why = (
                "is a function, not a training callback: subclass handlers.UserCallback, "
                "or subscribe the function to events with run.bus.subscribe"
            )
        else:
            why = (
                "is not a training callback: expected a handlers.UserCallback (or an "
                "object with before_run, after_report, after_exception or after_run)"
            )
        raise TypeError(f"callbacks[{index}]: {_shown(callback)} {why}")
    return found


#: What a callback's class may set for its subscriptions, and the range of each.
_CALLBACK_OPTIONS: dict[str, Any] = {
    "timeout": Seconds,
    "budget": Share,
    "max_faults": Faults,
    "on_error": ErrorPolicy,
    "over_budget": OverBudgetPolicy,
    "probation": Probation,
    "delivery": DeliveryMode,
}


def _shown(obj: object) -> str:
    try:
        text = repr(obj)
    except Exception:
        text = f"<{type(obj).__qualname__}>"
    return text if len(text) <= 80 else f"{text[:77]}..."


def _overridden(callback: Any, hook: str) -> Callable[..., Any] | None:
    """The bound method if ``callback`` really implements ``hook`` (not a base no-op)."""
    method: Callable[..., Any] | None = getattr(callback, hook, None)
    if method is None or not callable(method) or getattr(method, _BASE_HOOK, False):
        return None
    return method


def _subscription_options(callback: Any) -> dict[str, Any]:
    """The subscription options ``callback``'s class sets, checked (the error names it)."""
    options: dict[str, Any] = {}
    for option, annotation in _CALLBACK_OPTIONS.items():
        value = getattr(callback, option, None)
        if value is None:
            continue
        try:
            checked(option, value, annotation)
        except (OptionError, OptionTypeError) as exc:
            raise type(exc)(exc.option, f"{callback_name(callback)}: {exc}") from None
        options[option] = value
    if getattr(callback, "blocking", False):
        options["blocking"] = True
    return options
