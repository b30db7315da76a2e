"""Encoding and validated decoding of events, msgpack and JSON.

Decoders are built once per set of known event types and reused (msgspec
decoders are fast only when reused). Decoding validates against the tagged
union of every ``Event`` subclass, so an unknown ``type`` or a bad field is an
``EventDecodeError`` naming the path, and nothing is ever unpickled.
"""

from __future__ import annotations

from typing import Any, Union

import msgspec

from ._events import Event, event_types

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


def _union() -> Any:
    types = event_types()
    return types[0] if len(types) == 1 else Union[types]  # noqa: UP007 (runtime union)


def _decoder(kind: str) -> Any:
    cached = _decoders.get(kind)
    if cached is not None and cached[0] == Event._generation:
        return cached[1]
    union = _union()
    decoder = msgspec.msgpack.Decoder(union) if kind == "msgpack" else msgspec.json.Decoder(union)
    _decoders[kind] = (Event._generation, decoder)
    return decoder


def encode_msgpack(event: Event) -> bytes:
    return _msgpack_encoder.encode(event)


def encode_json(event: Event) -> bytes:
    return _json_encoder.encode(event)


def decode_msgpack(data: bytes | bytearray | memoryview) -> Event:
    """Decode one msgpack event; raises ``EventDecodeError`` on anything invalid."""
    try:
        event: Event = _decoder("msgpack").decode(data)
    except msgspec.DecodeError as exc:
        raise EventDecodeError(f"invalid event: {exc}") from exc
    return event


def decode_json(data: bytes | str) -> Event:
    """Decode one JSON event; raises ``EventDecodeError`` on anything invalid."""
    try:
        event: Event = _decoder("json").decode(data)
    except msgspec.DecodeError as exc:
        raise EventDecodeError(f"invalid event: {exc}") from exc
    return event
