"""Encoding and validated decoding of events, msgpack and JSON (nothing is ever unpickled).
NaN and ±infinity (a diverging loss) survive JSON as bare tokens, off the common path."""

from __future__ import annotations

import json
import re
from typing import Any, Union

import msgspec

from ._events import Event, event_types, registry, tag_of
from ._public import public_module

__all__ = [
    "EventDecodeError",
    "decode_json",
    "decode_msgpack",
    "encode_json",
    "encode_msgpack",
]


class EventDecodeError(ValueError):
    """A message is not a valid event: malformed bytes, unknown type or bad field."""


_msgpack_encoder = msgspec.msgpack.Encoder()
_json_encoder = msgspec.json.Encoder()
_decoders: dict[str, tuple[int, Any]] = {}
_unions: list[tuple[int, Any]] = []
_tags: list[tuple[int, frozenset[str]]] = []
#: Built once: ``json.dumps`` with options builds an encoder per call.
_nonfinite_json_encoder = json.JSONEncoder(
    ensure_ascii=False, allow_nan=True, separators=(",", ":")
)
#: A msgpack float64 (0xCB, then 8 big-endian bytes) whose exponent bits are all ones.
_NONFINITE_FLOAT64 = re.compile(rb"\xcb[\x7f\xff][\xf0-\xff]")


def event_union() -> Any:
    """The tagged union of every event class defined so far (rebuilt when one is added)."""
    if _unions and _unions[0][0] == registry.generation:
        return _unions[0][1]
    types = event_types()
    union = types[0] if len(types) == 1 else Union[types]  # noqa: UP007 (runtime union)
    _unions[:] = [(registry.generation, union)]
    return union


def decoder_for(kind: str) -> Any:
    """The decoder of every event type defined so far (rebuilt when one is added)."""
    cached = _decoders.get(kind)
    if cached is not None and cached[0] == registry.generation:
        return cached[1]
    union = event_union()
    decoder = msgspec.msgpack.Decoder(union) if kind == "msgpack" else msgspec.json.Decoder(union)
    _decoders[kind] = (registry.generation, decoder)
    return decoder


def known_tags() -> frozenset[str]:
    """The tags of every event class defined so far (cached until one is added)."""
    if _tags and _tags[0][0] == registry.generation:
        return _tags[0][1]
    tags = frozenset(tag_of(cls) for cls in event_types())
    _tags[:] = [(registry.generation, tags)]
    return tags


def event_modules() -> dict[str, str]:
    """Event type tag -> the public module of its class (stable when private ones move)."""
    return {tag_of(cls): public_module(cls) for cls in event_types()}


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
    """Whether ``value`` may hold a NaN or an infinity (msgspec's JSON would write ``null``),
    by a byte search of its msgpack encoding."""
    try:
        packed = _msgpack_encoder.encode(value)
    except Exception:  # msgpack cannot hold it (an int beyond 64 bits): take the detour
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
    """Parse JSON that may hold ``NaN``/``Infinity`` tokens (plain objects, no types); raises
    ``ValueError`` (malformed) or ``RecursionError`` (nested too deep)."""
    if isinstance(data, memoryview):
        data = data.tobytes()
    return json.loads(data)


def decode_msgpack(data: bytes | bytearray | memoryview) -> Event:
    """Decode one msgpack event; raises ``EventDecodeError`` on anything invalid."""
    try:
        event: Event = decoder_for("msgpack").decode(data)
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
        event: Event = decoder_for("json").decode(data)
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
