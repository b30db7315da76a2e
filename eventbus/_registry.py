"""Who is subscribed, in which order, with which lane, and which handlers each event type
reaches (computed once per type, dropped on any change: a dict lookup per dispatch)."""

from __future__ import annotations

from ._events import Event
from ._lanes import Lane
from ._policy import Policy
from ._subscription import Subscription

__all__ = ["Registry", "Route"]

#: The handlers one event type reaches, in delivery order, each with its lane if it has one.
Route = tuple[tuple[Subscription, Lane | None], ...]


class Registry:
    """The bus's subscriptions (``subs``, in delivery order) and their lanes; ``routes`` and
    ``barriers`` change in place, never replaced: the dispatcher holds them in locals."""

    __slots__ = ("_policy", "barriers", "lanes", "routes", "subs")

    def __init__(self, policy: Policy) -> None:
        self._policy = policy
        self.subs: list[Subscription] = []
        #: Every lane whose task has not ended (a cancelled one drains first).
        self.lanes: dict[Subscription, Lane] = {}
        self.routes: dict[type[Event], Route] = {}
        #: Event types delivered one event at a time (a handler asked for ``barrier``).
        self.barriers: set[type[Event]] = set()

    def add(self, sub: Subscription, lane: Lane | None) -> None:
        if lane is not None:
            self.lanes[sub] = lane
        self.subs.append(sub)
        self.subs.sort(key=lambda s: (s.order, s.index))
        self.routes.clear()

    def route(self, event_type: type[Event]) -> Route:
        lanes = self.lanes
        route = tuple((s, lanes.get(s)) for s in self.subs if issubclass(event_type, s.types))
        self.routes[event_type] = route
        if any(s.barrier for s, _ in route):
            self.barriers.add(event_type)
        else:
            self.barriers.discard(event_type)
        return route

    def lane_ended(self, sub: Subscription) -> None:
        self.lanes.pop(sub, None)

    # --- Owner, for the subscriptions ---------------------------------------------

    def cancel(self, sub: Subscription) -> None:
        if sub in self.subs:
            self.subs.remove(sub)
            self.routes.clear()
        lane = self.lanes.get(sub)
        if lane is not None:
            lane.close()

    def enable(self, sub: Subscription) -> None:
        self._policy.set_state(sub, "normal", "enabled by the user")

    def queued(self, sub: Subscription) -> int:
        lane = self.lanes.get(sub)
        return lane.queued if lane is not None else 0
