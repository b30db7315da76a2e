"""Encoding and validated decoding of events, msgpack and JSON.

Decoders are built once per set of known event types and reused (msgspec
decoders are fast only when reused). Decoding validates against the tagged
union of every ``Event`` subclass, so an unknown ``type`` or a bad field is an
``EventDecodeError`` naming the path, and nothing is ever unpickled.

NaN and ±infinity are real training signals (a diverging loss), so they must
survive JSON too. msgspec's JSON encoder writes them as ``null``; here an
event that may hold one is written through Python's ``json`` module instead,
as the bare tokens ``NaN``, ``Infinity`` and ``-Infinity`` (what ``json``
itself writes and reads), and a line that fails msgspec's strict decoder and
could hold such a token is decoded through ``json`` and validated with
``msgspec.convert``. Both detours are off the common path.

This module also renders what cannot be kept as itself: bounded, readable
text for ``EventPlaceholder`` (never more than ``TEXT_LIMIT`` characters,
whatever the value: deep, huge, cyclic or with a failing ``__repr__``).
"""

from __future__ import annotations

import json
import re
from typing import Any, Union

import msgspec

from ._events import Event, EventPlaceholder, event_types

__all__ = [
    "EventDecodeError",
    "decode_json",
    "decode_msgpack",
    "encode_json",
    "encode_msgpack",
]

#: A placeholder's ``text`` (a rendering of what was there) is at most this long.
TEXT_LIMIT = 4096
#: A placeholder's ``reason`` is at most this long.
REASON_LIMIT = 1024
#: Containers deeper than this are rendered as ``…`` in placeholder text.
REPR_DEPTH = 8
#: Ints longer than this many bits are rendered by size (``repr`` of a huge int is slow).
REPR_INT_BITS = 1024


class EventDecodeError(ValueError):
    """A message is not a valid event: malformed bytes, unknown type or bad field."""


_msgpack_encoder = msgspec.msgpack.Encoder()
_json_encoder = msgspec.json.Encoder()
_decoders: dict[str, tuple[int, Any]] = {}
_unions: list[tuple[int, Any]] = []
_tags: list[tuple[int, frozenset[str]]] = []
#: Built once: ``json.dumps`` with options builds an encoder per call (~2 µs).
_nonfinite_json_encoder = json.JSONEncoder(
    ensure_ascii=False, allow_nan=True, separators=(",", ":")
)
#: A msgpack float64 (0xCB, then 8 big-endian bytes) whose exponent bits are all ones.
_NONFINITE_FLOAT64 = re.compile(rb"\xcb[\x7f\xff][\xf0-\xff]")


def event_union() -> Any:
    """The tagged union of every event class defined so far (rebuilt when one is added)."""
    if _unions and _unions[0][0] == Event._generation:
        return _unions[0][1]
    types = event_types()
    union = types[0] if len(types) == 1 else Union[types]  # noqa: UP007 (runtime union)
    _unions[:] = [(Event._generation, union)]
    return union


def _decoder(kind: str) -> Any:
    cached = _decoders.get(kind)
    if cached is not None and cached[0] == Event._generation:
        return cached[1]
    union = event_union()
    decoder = msgspec.msgpack.Decoder(union) if kind == "msgpack" else msgspec.json.Decoder(union)
    _decoders[kind] = (Event._generation, decoder)
    return decoder


def known_tags() -> frozenset[str]:
    """The tags of every event class defined so far (cached until one is added)."""
    if _tags and _tags[0][0] == Event._generation:
        return _tags[0][1]
    tags = frozenset(tag_of(cls) for cls in event_types())
    _tags[:] = [(Event._generation, tags)]
    return tags


def tag_of(cls: type) -> str:
    """The ``type`` tag an event class is written with."""
    config = getattr(cls, "__struct_config__", None)
    tag = getattr(config, "tag", None)
    return str(tag) if tag is not None else cls.__name__


def event_modules() -> dict[str, str]:
    """Event type tag -> defining module, for every event class defined so far."""
    return {tag_of(cls): cls.__module__ for cls in event_types()}


# --- encoding ------------------------------------------------------------------------------


def encode_msgpack(event: Event) -> bytes:
    return _msgpack_encoder.encode(event)


def encode_json(event: Event) -> bytes:
    """One event as JSON; NaN and ±inf as the tokens ``NaN``, ``Infinity``, ``-Infinity``."""
    line = _json_encoder.encode(event)
    if b"null" in line and has_nonfinite(event):
        line = encode_json_nonfinite(event)
    return line


def has_nonfinite(value: object) -> bool:
    """Whether ``value`` may hold a NaN or an infinity (msgspec's JSON wrote ``null`` for it).

    One msgpack encoding (which keeps floats bit for bit) and a byte search:
    C speed, no walk in Python. A false positive only costs the careful path.
    """
    try:
        packed = _msgpack_encoder.encode(value)
    except Exception:  # msgpack cannot hold it (an int beyond 64 bits): take the careful path
        return True
    return _NONFINITE_FLOAT64.search(packed) is not None


def encode_json_nonfinite(value: object) -> bytes:
    """JSON through Python's ``json``, which writes NaN and ±inf as bare tokens."""
    # str_keys: keys become strings as msgspec's JSON writes them (a NaN key is "nan").
    return _nonfinite_json_encoder.encode(msgspec.to_builtins(value, str_keys=True)).encode()


# --- decoding ------------------------------------------------------------------------------


def may_hold_nonfinite(data: bytes | bytearray | memoryview | str) -> bool:
    """Whether a JSON text could hold a ``NaN``/``Infinity`` token (cheap, C speed)."""
    if isinstance(data, str):
        return "NaN" in data or "Infinity" in data
    if isinstance(data, memoryview):
        data = data.tobytes()
    return b"NaN" in data or b"Infinity" in data


def loads_json_nonfinite(data: bytes | bytearray | memoryview | str) -> Any:
    """Parse JSON that may hold ``NaN``/``Infinity`` tokens (plain objects, no types).

    Raises ``ValueError`` (malformed) or ``RecursionError`` (nested too deep).
    """
    if isinstance(data, memoryview):
        data = data.tobytes()
    return json.loads(data)


def decode_msgpack(data: bytes | bytearray | memoryview) -> Event:
    """Decode one msgpack event; raises ``EventDecodeError`` on anything invalid."""
    try:
        event: Event = _decoder("msgpack").decode(data)
    except msgspec.DecodeError as exc:
        raise EventDecodeError(f"invalid event: {exc}") from exc
    except RecursionError:
        raise EventDecodeError("invalid event: nested too deep to decode") from None
    return event


def decode_json(data: bytes | str) -> Event:
    """Decode one JSON event; raises ``EventDecodeError`` on anything invalid.

    Accepts the ``NaN``/``Infinity``/``-Infinity`` tokens ``encode_json`` writes.
    """
    try:
        event: Event = _decoder("json").decode(data)
    except msgspec.DecodeError as exc:
        if may_hold_nonfinite(data):
            try:
                converted: Event = msgspec.convert(loads_json_nonfinite(data), event_union())
            except (ValueError, RecursionError):
                pass
            else:
                return converted
        raise EventDecodeError(f"invalid event: {exc}") from exc
    except RecursionError:
        raise EventDecodeError("invalid event: nested too deep to decode") from None
    return event


# --- what cannot be kept as itself ---------------------------------------------------------


def clip(text: str, limit: int) -> str:
    """At most ``limit`` characters, always encodable as UTF-8 (lone surrogates escaped)."""
    if len(text) > limit:
        text = text[: max(0, limit - 1)] + "…"
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def describe(exc: BaseException) -> str:
    """``Type: message``, even for an exception whose ``__str__`` fails."""
    try:
        message = str(exc)
    except Exception:
        message = "<unprintable message>"
    return f"{type(exc).__name__}: {message}" if message else type(exc).__name__


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
    """A time any encoder can write (``0.0`` if ``value`` is not a number)."""
    if type(value) is float:
        return value
    if type(value) is int:
        try:
            return float(value)
        except OverflowError:
            return 0.0
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
