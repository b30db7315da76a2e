"""What stands in for an event a log cannot hold as itself: ``EventPlaceholder``.

The recorder makes one for an event it cannot encode, the reader for an
intact record that does not decode as its type. Either way the placeholder
keeps what can be kept (the type, ``seq``, ``time``) and a readable, bounded
rendering of what was there: never more than ``TEXT_LIMIT`` characters,
whatever the value (deep, huge, cyclic, or with a failing ``__repr__``), and
never an exception, so one bad value never costs the rest of a log.
"""

from __future__ import annotations

import math
from typing import Any

import msgspec

from .._events import MAX_TIME, EventPlaceholder, tag_of
from .._text import clip, describe

__all__ = [
    "TEXT_LIMIT",
    "bounded_repr",
    "peek_msgpack_map",
    "placeholder_for",
    "placeholder_from_raw",
]

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
        elif depth >= REPR_DEPTH and isinstance(value, dict | list | tuple | set | frozenset):
            self.write("…")
        elif isinstance(value, dict):
            self.write("{")
            for i, (key, item) in enumerate(value.items()):
                if self.left <= 0:
                    break
                if i:
                    self.write(", ")
                self.add(key, depth + 1)
                self.write(": ")
                self.add(item, depth + 1)
            self.write("}")
        elif isinstance(value, list | tuple | set | frozenset):
            brackets = (
                "[]" if isinstance(value, list) else "()" if isinstance(value, tuple) else "{}"
            )
            self.write(brackets[0])
            for i, item in enumerate(value):
                if self.left <= 0:
                    break
                if i:
                    self.write(", ")
                self.add(item, depth + 1)
            self.write(brackets[1])
        elif isinstance(value, msgspec.Struct) and depth < REPR_DEPTH:
            self.write(f"{type(value).__name__}(")
            for i, name in enumerate(value.__struct_fields__):
                if self.left <= 0:
                    break
                if i:
                    self.write(", ")
                self.write(f"{name}=")
                self.add(getattr(value, name, None), depth + 1)
            self.write(")")
        else:
            try:
                text = repr(value)
            except Exception:
                text = f"<{type(value).__qualname__} object>"
            self.write(text)

    def text(self) -> str:
        return "".join(self.parts) + ("…" if self.cut else "")


def bounded_repr(value: object, limit: int = TEXT_LIMIT) -> str:
    """A readable rendering of ``value`` in at most about ``limit`` characters."""
    out = _BoundedRepr(limit)
    try:
        out.add(value, 0)
    except Exception as exc:  # a container that fails to iterate, say
        out.write(f"<{describe(exc)}>")
    return clip(out.text(), limit + 1)


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
    """A placeholder for a stored record that does not decode as its type.

    ``raw`` is what the record holds as plain data (a map, normally):
    ``type``, ``seq`` and ``time`` come from it when they are there.
    """
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
    """The first scalar entries of a msgpack map, without decoding the rest.

    For a record too deep or too malformed to decode: the recorder writes
    ``type``, ``seq`` and ``time`` first, so a placeholder can still name
    them. Stops at the first entry that is not a string key with a scalar value.
    """
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
