"""User callbacks, each method its own bus subscription.

The gathering handlers call this handler synchronously inside the bus; it
turns each call into a derived event (``RunBegan``, ``RoundGathered``,
``FailuresGathered``, ``RunEnded``) and every overridden method of every
user callback is subscribed to its event. So each callback call gets the
bus's deadline, error policy and budget accounting, and a slow or failing
callback is named in diagnostics as ``<Class>.<method>``.
"""

from __future__ import annotations

import inspect
import uuid
from collections.abc import Callable, Iterable
from typing import Any

from eventbus import Event, EventBus, Subscription, WorkerFailure

from ._context import RunResult, TrainRunContext
from ._errors import WorkerError
from ._events import FailuresGathered, RoundGathered, RunBegan, RunEnded
from ._interfaces import UserCallback

__all__ = ["UserCallbackHandler", "implemented_hooks"]

_HOOKS: tuple[tuple[str, type[Event]], ...] = (
    ("before_run", RunBegan),
    ("after_report", RoundGathered),
    ("after_exception", FailuresGathered),
    ("after_run", RunEnded),
)
#: UserCallback attribute -> EventBus.subscribe keyword.
_OPTIONS = {
    "timeout": "timeout",
    "budget": "budget",
    "on_error": "on_error",
    "max_faults": "max_faults",
    "over_budget": "over_budget",
    "delivery": "mode",
}


class UserCallbackHandler:
    """Invokes ``callbacks`` in order, through the bus (see the module docstring).

    It is a ``ReportCallback``, ``ExceptionCallback`` and ``RunCallback``:
    give it to the gathering handlers, and ``subscribe`` it to the bus.
    """

    def __init__(self, callbacks: Iterable[UserCallback | Any]) -> None:
        self.callbacks = list(callbacks)
        self.origin = uuid.uuid4().hex[:16]
        self.run_context: TrainRunContext | None = None
        self.subscriptions: list[Subscription] = []
        self._bus: EventBus | None = None
        self._rounds = 0
        self._failure_batches = 0

    # --- wiring --------------------------------------------------------------------

    def subscribe(self, bus: EventBus, *, order: int = 0) -> list[Subscription]:
        """Subscribe each overridden method of each callback, in callback order."""
        self._bus = bus
        names: dict[str, int] = {}
        for callback in self.callbacks:
            options = _subscription_options(callback)
            hooks = [(h, (t,)) for h, t in _HOOKS]
            event_types = tuple(getattr(callback, "event_types", ()) or ())
            if event_types:
                hooks.append(("on_event", event_types))
            for hook, types in hooks:
                method = _overridden(callback, hook)
                if method is None:
                    continue
                name = f"{type(callback).__name__}.{hook}"
                names[name] = names.get(name, 0) + 1
                if names[name] > 1:
                    name = f"{name}#{names[name]}"
                handler = self._handler(method, hook)
                kwargs = dict(options)
                if inspect.iscoroutinefunction(method):
                    kwargs.pop("blocking", None)  # blocking is for sync methods only
                self.subscriptions.append(
                    bus.subscribe(types, handler, name=name, order=order, **kwargs)
                )
        return self.subscriptions

    def _handler(self, method: Callable[..., Any], hook: str) -> Callable[[Any], Any]:
        origin = self.origin
        args_of = self._args_for(hook)
        check_origin = hook != "on_event"
        if inspect.iscoroutinefunction(method):

            async def call_async(event: Any) -> None:
                if not check_origin or event.origin == origin:
                    await method(*args_of(event))

            return call_async

        def call(event: Any) -> Any:
            # The result goes back to the bus: a coroutine returned by a sync method
            # is then awaited there, never dropped.
            if not check_origin or event.origin == origin:
                return method(*args_of(event))
            return None

        return call

    def _args_for(self, hook: str) -> Callable[[Any], tuple[Any, ...]]:
        def context(event: Any) -> TrainRunContext:
            return self.run_context or TrainRunContext.from_event(event)

        if hook == "before_run":
            return lambda e: (e.context,)
        if hook == "after_report":
            return lambda e: (context(e), list(e.metrics), e.checkpoint)
        if hook == "after_exception":
            return lambda e: (context(e), {f.rank: WorkerError.from_failure(f) for f in e.failures})
        if hook == "after_run":
            return lambda e: (context(e), e.result)
        return lambda e: (context(e), e)

    def _emit(self, event: Event) -> None:
        if self._bus is None:
            raise RuntimeError(
                "UserCallbackHandler is not subscribed to a bus: call subscribe(bus)"
            )
        self._bus.emit(event, derived=True)

    # --- the interfaces the gathering handlers call ------------------------------------

    def before_run(self, run_context: TrainRunContext) -> None:
        self.run_context = run_context
        self._emit(RunBegan(origin=self.origin, context=run_context))

    def after_report(
        self, run_context: TrainRunContext, metrics: list[dict[str, Any]], checkpoint: str | None
    ) -> None:
        self.run_context = run_context
        self._emit(
            RoundGathered(
                origin=self.origin,
                run_id=run_context.run_id,
                round=self._rounds,
                metrics=metrics,
                checkpoint=checkpoint,
            )
        )
        self._rounds += 1

    def after_exception(
        self, run_context: TrainRunContext, worker_exceptions: dict[int, Exception]
    ) -> None:
        self.run_context = run_context
        failures = tuple(
            _as_failure(run_context.run_id, r, e) for r, e in worker_exceptions.items()
        )
        self._emit(
            FailuresGathered(
                origin=self.origin,
                run_id=run_context.run_id,
                index=self._failure_batches,
                failures=failures,
            )
        )
        self._failure_batches += 1

    def after_run(self, run_context: TrainRunContext, result: RunResult) -> None:
        self.run_context = run_context
        self._emit(RunEnded(origin=self.origin, result=result))


def implemented_hooks(callback: Any) -> dict[str, Callable[..., Any]]:
    """The training hooks ``callback`` really implements, by name (bound methods).

    A ``UserCallback`` subclass implements what it overrides; any other object,
    whatever hook methods it has.
    """
    hooks = {hook: _overridden(callback, hook) for hook, _ in _HOOKS}
    return {hook: method for hook, method in hooks.items() if method is not None}


def _overridden(callback: Any, hook: str) -> Callable[..., Any] | None:
    """The bound method if ``callback`` really implements ``hook`` (not the base no-op)."""
    method: Callable[..., Any] | None = getattr(callback, hook, None)
    if method is None or not callable(method):
        return None
    if isinstance(callback, UserCallback) and getattr(type(callback), hook) is getattr(
        UserCallback, hook
    ):
        return None
    return method


def _subscription_options(callback: Any) -> dict[str, Any]:
    options = {
        keyword: value
        for attribute, keyword in _OPTIONS.items()
        if (value := getattr(callback, attribute, None)) is not None
    }
    if getattr(callback, "blocking", False):
        options["blocking"] = True
    return options


def _as_failure(run_id: str, rank: int, exc: Exception) -> WorkerFailure:
    if isinstance(exc, WorkerError):
        return exc.to_failure(run_id)
    return WorkerFailure.from_exception(run_id, rank, exc)
