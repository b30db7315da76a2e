"""Selecting events of a log by type, rank and sequence range (replay, ``show``)."""

from __future__ import annotations

from collections.abc import Iterable

import msgspec

from ._events import Event, event_types

__all__ = ["EventFilter"]


class EventFilter(msgspec.Struct, frozen=True, kw_only=True):
    """Keeps an event when it passes every criterion given.

    ``types``: event class names (a base class name, such as ``Event``, keeps
    its subclasses). ``ranks``: only events that have a ``rank`` field with
    one of these values (events without a rank are left out). ``from_seq`` /
    ``to_seq``: recorded sequence numbers, both inclusive.
    """

    types: tuple[str, ...] = ()
    ranks: tuple[int, ...] = ()
    from_seq: int | None = None
    to_seq: int | None = None

    def __post_init__(self) -> None:
        known = {Event.__name__, *(c.__name__ for c in event_types())}
        unknown = [t for t in self.types if t not in known]
        if unknown:
            names = ", ".join(map(repr, unknown))
            raise ValueError(f"unknown event type {names}; known: {', '.join(sorted(known))}")

    @classmethod
    def of(
        cls,
        *,
        types: Iterable[str | type[Event]] = (),
        ranks: Iterable[int] = (),
        from_seq: int | None = None,
        to_seq: int | None = None,
    ) -> EventFilter:
        """Build from classes or names."""
        names = tuple(t if isinstance(t, str) else t.__name__ for t in types)
        return cls(types=names, ranks=tuple(ranks), from_seq=from_seq, to_seq=to_seq)

    @property
    def empty(self) -> bool:
        return not (self.types or self.ranks) and self.from_seq is None and self.to_seq is None

    def __call__(self, event: Event) -> bool:
        if self.from_seq is not None and event.seq < self.from_seq:
            return False
        if self.to_seq is not None and event.seq > self.to_seq:
            return False
        if self.types and not _has_type(type(event), self.types):
            return False
        if self.ranks:
            rank = getattr(event, "rank", None)
            if rank is None or rank not in self.ranks:
                return False
        return True


_matches: dict[tuple[type[Event], tuple[str, ...]], bool] = {}


def _has_type(cls: type[Event], names: tuple[str, ...]) -> bool:
    key = (cls, names)
    found = _matches.get(key)
    if found is None:
        found = _matches[key] = any(c.__name__ in names for c in cls.__mro__)
    return found
