"""The reader's second try at a record its fast decoder refused.

A reader decodes each record once against the union of every event type.
The few records that fail come here: one nested nearly as deep as the
recursion limit allows is decoded again on a fresh thread's stack, and a JSON
line holding ``NaN`` or ``Infinity`` is parsed by Python's ``json``. An
intact record that is still not an event (a type nobody defined here, since
nothing is imported on a file's word) becomes an ``EventPlaceholder``, so a
log the recorder wrote is always readable to its end.
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
from .._text import clip
from ._placeholders import peek_msgpack_map, placeholder_from_raw

__all__ = ["DecodeFallback"]


class DecodeFallback:
    """Decodes, for one log's reader, the records its fast decoder refused.

    Args:
        path: the log, for messages.
        event_types: the header's map of event type tag to defining module, so
            that a placeholder's reason names the module to import.

    ``placeholders`` counts the placeholders it made.
    """

    def __init__(self, path: Path, event_types: Mapping[str, str]) -> None:
        self.path = path
        self.event_types = event_types
        self.placeholders = 0

    def __call__(
        self, kind: Literal["msgpack", "json"], data: bytes | bytearray, exc: BaseException
    ) -> Event | str:
        """The event after all, a placeholder, or why the record is corrupt.

        ``exc`` is what the fast decoder raised. A msgpack record got here with
        its CRC intact, so it is never corrupt: it is the event or a
        placeholder. A JSON line is corrupt (the reason is returned) when it
        is not even a well-formed object.
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
            if kind == "msgpack":
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
        if kind == "msgpack" or isinstance(raw, dict):
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
        except BaseException as exc:  # raised again in the caller's thread
            outcome.append((False, exc))

    thread = threading.Thread(target=run, name="eventbus-log-deep-decode", daemon=True)
    thread.start()
    thread.join()
    ok, value = outcome[0]
    if not ok:
        assert isinstance(value, BaseException)
        raise value
    return value
