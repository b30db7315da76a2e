"""What a log record that failed to decode becomes: the event after all, a
placeholder, or the reason it is corrupt.

A reader's fast path decodes each record once against the event union. This
is its slow path, for the records that fail: nested nearly as deep as the
recursion limit allows (decoded again on a fresh thread's stack); JSON
holding NaN or Infinity (decoded through ``json``). A record that is intact
but still not an event (a type nobody defined here: nothing is imported on a
file's word) becomes an ``EventPlaceholder`` (counted) in a version-2 log,
and corrupt in a version-1 one.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Literal

import msgspec

from .._codec import (
    decoder_for,
    event_union,
    known_tags,
    loads_json_nonfinite,
    may_hold_nonfinite,
)
from .._events import Event
from .._logging import get_logger
from .._text import clip
from ._placeholders import peek_msgpack_map, placeholder_from_raw

__all__ = ["Salvage"]

_log = get_logger("eventbus.reader")


class Salvage:
    """The slow path of one log's reader (see the module docstring).

    ``event_types`` is the header's map of type tag to defining module;
    ``placeholders`` counts the placeholders made.
    """

    def __init__(self, path: Path, event_types: Mapping[str, str]) -> None:
        self.path = path
        self.event_types = event_types
        self.placeholders = 0

    def __call__(
        self,
        kind: Literal["msgpack", "json"],
        data: bytes | bytearray | memoryview,
        exc: BaseException,
        *,
        placeholders: bool = False,
    ) -> Event | str:
        """What to yield for a record that failed to decode, or why it is corrupt.

        The event after all (nested so deep it needs a fresh stack; its type's
        or NaN/Infinity tokens in JSON,
        decoded through ``json``); with ``placeholders`` (an intact record of a
        version-2 log) an ``EventPlaceholder``; otherwise the reason the record
        is corrupt.
        """
        run: Callable[[Callable[[], object]], object] = _here
        if isinstance(exc, RecursionError):
            # Nested nearly as deep as the recursion limit allows: the writer's stack
            # was shallower than this reader's. A new thread's stack is the shallowest.
            run = _on_fresh_stack
            retried = _attempt(run, lambda: decoder_for(kind).decode(data))
            if isinstance(retried, Event):
                return retried
            exc = retried
        raw: object = None
        well_formed = via_json = False
        try:
            raw = run(
                lambda: (
                    msgspec.msgpack.decode(data) if kind == "msgpack" else msgspec.json.decode(data)
                )
            )
            well_formed = True
        except (msgspec.DecodeError, RecursionError):
            if kind == "json" and may_hold_nonfinite(data):
                try:
                    raw = run(lambda: loads_json_nonfinite(data))
                    well_formed = via_json = True
                except (ValueError, RecursionError):
                    pass
        if not well_formed:
            reason = _why(exc)
            if placeholders and kind == "msgpack":
                shown = bytes(data[:256]).hex(" ")
                return self._placeholder(
                    peek_msgpack_map(data), reason, text=f"{len(data)} bytes: {shown}"
                )
            return reason
        unknown = self._unknown(raw)
        if via_json:
            retried = _attempt(run, lambda: msgspec.convert(raw, event_union()))
            if isinstance(retried, Event):
                return retried
            exc = retried
        reason = unknown or _why(exc)
        if placeholders and (kind == "msgpack" or isinstance(raw, dict)):
            return self._placeholder(raw, reason)
        return reason

    def _placeholder(self, raw: object, reason: str, *, text: str | None = None) -> Event:
        self.placeholders += 1
        return placeholder_from_raw(raw, reason, text=text)

    def _unknown(self, raw: object) -> str | None:
        """Why a record whose ``type`` no event class has cannot decode: the class
        that wrote it is not defined here. Nothing is imported on a log's word."""
        if not isinstance(raw, dict):
            return None
        tag = raw.get("type")
        if not isinstance(tag, str) or tag in known_tags():
            return None
        shown = repr(clip(tag, 200))
        module = self.event_types.get(tag)
        if module is None:
            return (
                f"unknown event type {shown}: no event class of that name is defined; "
                "import the module that defines it before reading this log"
            )
        return (
            f"event type {shown} is defined in module {clip(module, 200)!r}: "
            "import it before reading this log"
        )


def _why(exc: BaseException) -> str:
    if isinstance(exc, RecursionError):
        return "nested too deep to decode (RecursionError)"
    return f"not a valid event: {clip(str(exc), 1000)}"


def _attempt(
    run: Callable[[Callable[[], object]], object], decode: Callable[[], object]
) -> Event | msgspec.DecodeError | RecursionError:
    """One more try at decoding a record: the event, or why it still failed."""
    try:
        found = run(decode)
    except (msgspec.DecodeError, RecursionError) as exc:
        return exc
    assert isinstance(found, Event)
    return found


def _here(work: Callable[[], object]) -> object:
    return work()


def _on_fresh_stack(work: Callable[[], object]) -> object:
    """``work()`` on a new thread, whose Python stack starts empty: the whole
    recursion limit is there for the decoder. Only for records that hit it."""
    outcome: list[tuple[bool, object]] = []

    def run() -> None:
        try:
            outcome.append((True, work()))
        except BaseException as exc:  # handed back to the caller's thread
            outcome.append((False, exc))

    thread = threading.Thread(target=run, name="eventbus-log-deep-decode", daemon=True)
    thread.start()
    thread.join()
    ok, value = outcome[0]
    if not ok:
        assert isinstance(value, BaseException)
        raise value
    return value
