"""``EventPlaceholder``: what stands in for an event a log cannot hold as itself, so that
one bad value never costs the rest of a log (docs/log-format.md, "Placeholders")."""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Literal

import msgspec

from .._codec import decoder_for, event_union, known_tags, loads_json_nonfinite, may_hold_nonfinite
from .._events import MAX_TIME, Event, EventPlaceholder, tag_of
from .._text import clip, describe

__all__ = ["decode_again", "placeholder_for"]

#: A placeholder's ``text`` (a rendering of what was there) is at most this long.
TEXT_LIMIT = 4096
#: A placeholder's ``reason`` is at most this long.
REASON_LIMIT = 1024
#: Containers deeper than this are rendered as ``…`` in placeholder text.
REPR_DEPTH = 8
#: Ints longer than this many bits are rendered by size (``repr`` of a huge int is slow).
REPR_INT_BITS = 1024


class _BoundedRepr:
    """``repr``-like text that stops at a length and a depth, whatever it is given."""

    def __init__(self, limit: int) -> None:
        self.parts: list[str] = []
        self.left = limit
        self.cut = False

    def write(self, text: str) -> None:
        if len(text) >= self.left:
            text = text[: self.left]
            self.cut = True
        self.parts.append(text)
        self.left -= len(text)

    def add(self, value: object, depth: int) -> None:
        if self.left <= 0:
            self.cut = True
            return
        if value is None or isinstance(value, bool | float):
            self.write(repr(value))
        elif isinstance(value, int):
            bits = value.bit_length()
            self.write(repr(int(value)) if bits <= REPR_INT_BITS else f"<int of {bits} bits>")
        elif isinstance(value, str):
            self.write(repr(str(value[: self.left])))
        elif isinstance(value, bytes | bytearray):
            self.write(repr(bytes(value[: self.left])))
        elif isinstance(value, dict | list | tuple | set | frozenset | msgspec.Struct):
            if depth >= REPR_DEPTH:
                self.write("…")
                return
            if isinstance(value, msgspec.Struct):
                opening, closing = f"{type(value).__name__}(", ")"
                items: Any = ((f"{n}=", getattr(value, n, None)) for n in value.__struct_fields__)
            elif isinstance(value, dict):
                opening, closing, items = "{", "}", value.items()
            else:
                opening, closing = (
                    "[]" if isinstance(value, list) else "()" if isinstance(value, tuple) else "{}"
                )
                items = ((None, item) for item in value)
            self.write(opening)
            for i, (key, item) in enumerate(items):
                if self.left <= 0:
                    break
                if i:
                    self.write(", ")
                if isinstance(value, msgspec.Struct):
                    self.write(key)
                elif isinstance(value, dict):
                    self.add(key, depth + 1)
                    self.write(": ")
                self.add(item, depth + 1)
            self.write(closing)
        else:
            try:
                text = repr(value)
            except Exception:
                text = f"<{type(value).__qualname__} object>"
            self.write(text)


def bounded_repr(value: object, limit: int = TEXT_LIMIT) -> str:
    """A readable rendering of ``value`` in at most about ``limit`` characters."""
    out = _BoundedRepr(limit)
    try:
        out.add(value, 0)
    except Exception as exc:  # a container that fails to iterate, say
        out.write(f"<{describe(exc)}>")
    return clip("".join(out.parts) + ("…" if out.cut else ""), limit + 1)


def plain_int(value: object) -> int:
    """A sequence number any encoder can write (``-1`` if ``value`` is not one)."""
    return value if type(value) is int and -(2**63) <= value < 2**63 else -1


def plain_float(value: object) -> float:
    """A time any encoder can write and any reader takes (``0.0`` if ``value`` is no
    finite bus time: a NaN or an infinity is why a record was damaged)."""
    if type(value) is int:
        try:
            value = float(value)
        except OverflowError:
            return 0.0
    if type(value) is float and math.isfinite(value) and abs(value) <= MAX_TIME:
        return value
    return 0.0


def placeholder_for(event: object, exc: BaseException) -> EventPlaceholder:
    """What the recorder writes instead of an event it cannot encode (never raises)."""
    try:
        return EventPlaceholder(
            seq=plain_int(getattr(event, "seq", -1)),
            time=plain_float(getattr(event, "time", 0.0)),
            event_type=clip(tag_of(type(event)), 200),
            reason=clip(f"not encodable: {describe(exc)}", REASON_LIMIT),
            text=bounded_repr(event),
        )
    except Exception:  # an object whose attributes fail: keep at least that it was there
        return EventPlaceholder(event_type="?", reason="not encodable", text="")


def placeholder_from_raw(raw: object, reason: str, *, text: str | None = None) -> EventPlaceholder:
    """A placeholder for a stored record, from what it holds as plain data (a map)."""
    fields: dict[Any, Any] = raw if isinstance(raw, dict) else {}
    event_type = fields.get("type")
    return EventPlaceholder(
        seq=plain_int(fields.get("seq", -1)),
        time=plain_float(fields.get("time", 0.0)),
        event_type=clip(event_type, 200) if isinstance(event_type, str) else "",
        reason=clip(reason, REASON_LIMIT),
        text=bounded_repr(raw) if text is None else clip(text, TEXT_LIMIT),
    )


def peek_msgpack_map(data: bytes | bytearray | memoryview, entries: int = 8) -> dict[str, object]:
    """The first scalar entries of a msgpack map too malformed to decode: the recorder
    writes ``type``, ``seq`` and ``time`` first, so a placeholder can still name them."""
    data = bytes(data[: 64 * entries + 16])
    found: dict[str, object] = {}
    pos = 0

    def take(n: int) -> bytes:
        nonlocal pos
        if pos + n > len(data):
            raise IndexError
        chunk = data[pos : pos + n]
        pos += n
        return chunk

    def number(n: int, signed: bool = False) -> int:
        return int.from_bytes(take(n), "big", signed=signed)

    def scalar() -> object:
        b = take(1)[0]
        if b <= 0x7F or b >= 0xE0:
            return b if b <= 0x7F else b - 0x100
        if 0xA0 <= b <= 0xBF or b in (0xD9, 0xDA, 0xDB):
            size = b - 0xA0 if b <= 0xBF else number({0xD9: 1, 0xDA: 2, 0xDB: 4}[b])
            return take(size).decode("utf-8", "replace")
        if b == 0xC0:
            return None
        if b in (0xC2, 0xC3):
            return b == 0xC3
        if b in (0xCC, 0xCD, 0xCE, 0xCF):
            return number(1 << (b - 0xCC))
        if b in (0xD0, 0xD1, 0xD2, 0xD3):
            return number(1 << (b - 0xD0), signed=True)
        if b == 0xCB:
            return float(msgspec.msgpack.decode(b"\xcb" + take(8)))
        raise ValueError("not a scalar")

    try:
        first = take(1)[0]
        if 0x80 <= first <= 0x8F:
            count = first - 0x80
        elif first in (0xDE, 0xDF):
            count = number(2 if first == 0xDE else 4)
        else:
            return found
        for _ in range(min(count, entries)):
            key = scalar()
            value = scalar()
            if not isinstance(key, str):
                break
            found[key] = value
    except (IndexError, ValueError, KeyError, msgspec.DecodeError):
        pass
    return found


# --- the reader's second try --------------------------------------------------------


def decode_again(
    kind: Literal["msgpack", "json"],
    data: bytes | bytearray,
    exc: BaseException,
    event_types: Mapping[str, str],
) -> Event | str:
    """The event after all, a placeholder, or why a JSON line is corrupt (one that is not
    even a well-formed object). ``exc`` is what the fast decoder raised; a msgpack record
    got here with its CRC intact, so it is never corrupt. ``event_types``: the header's
    tags and modules, for a placeholder's reason."""
    deep = isinstance(exc, RecursionError)  # the writer's stack was shallower than ours

    def run(work: Callable[[], Any]) -> Any:
        if not deep:
            return work()
        # A new thread's stack starts empty: the whole recursion limit is the decoder's.
        with ThreadPoolExecutor(1, thread_name_prefix="eventbus-log-deep-decode") as pool:
            return pool.submit(work).result()

    if deep:
        retried = _attempt(run, lambda: decoder_for(kind).decode(data))
        if isinstance(retried, Event):
            return retried
        exc = retried
    plain = msgspec.msgpack.decode if kind == "msgpack" else msgspec.json.decode
    raw: object = None
    parsed = via_json = False
    try:
        raw, parsed = run(lambda: plain(data)), True
    except (msgspec.DecodeError, RecursionError):
        if kind == "json" and may_hold_nonfinite(data):
            with contextlib.suppress(ValueError, RecursionError):
                raw, parsed = run(lambda: loads_json_nonfinite(data)), True
                via_json = True
    if not parsed:
        if kind == "json":
            return _why(exc)
        shown = f"{len(data)} bytes: {bytes(data[:256]).hex(' ')}"
        return placeholder_from_raw(peek_msgpack_map(data), _why(exc), text=shown)
    unknown = _unknown(raw, event_types)
    if via_json:
        retried = _attempt(run, lambda: msgspec.convert(raw, event_union()))
        if isinstance(retried, Event):
            return retried
        exc = retried
    reason = unknown or _why(exc)
    if kind == "msgpack" or isinstance(raw, dict):
        return placeholder_from_raw(raw, reason)
    return reason


def _unknown(raw: object, event_types: Mapping[str, str]) -> str | None:
    """Why a record whose ``type`` no event class has cannot decode: the class that wrote
    it is not defined here. Nothing is imported on a log's word."""
    tag = raw.get("type") if isinstance(raw, dict) else None
    if not isinstance(tag, str) or tag in known_tags():
        return None
    shown = repr(clip(tag, 200))
    module = event_types.get(tag)
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
    run: Callable[[Callable[[], Any]], Any], decode: Callable[[], Any]
) -> Event | msgspec.DecodeError | RecursionError:
    """One more try at decoding a record: the event, or why it still failed."""
    try:
        found: Event = run(decode)
    except (msgspec.DecodeError, RecursionError) as exc:
        return exc
    return found
