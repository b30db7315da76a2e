"""The event-log file format: header, record framing, limits, errors, in msgpack (framed
records) or JSON Lines; docs/log-format.md describes both byte by byte."""

from __future__ import annotations

import struct
import time
import zlib
from pathlib import Path
from typing import Literal

import msgspec

from .._events import SCHEMA_VERSION

__all__ = [
    "LOG_FORMAT_VERSION",
    "LOG_MAGIC",
    "CorruptLogError",
    "LogError",
    "LogFormat",
    "LogFormatError",
    "LogHeader",
    "TruncatedTail",
    "format_for_path",
    "intact_record_in",
]

#: PNG-style: a non-ASCII first byte and CR LF / ^Z / LF catch text-mode mangling.
LOG_MAGIC = b"\x89EVB\r\n\x1a\n"
#: Version of the framing (header and record layout), independent of the event schema.
LOG_FORMAT_VERSION = 2
#: ``LOG_MAGIC``, format version (u16), schema version (u16), metadata length (u32), little-endian.
PREFIX = struct.Struct("<8sHHI")
#: A record header: marker, length check (u16s), payload length, CRC-32 (u32s), little-endian.
RECORD_HEADER = struct.Struct("<HHII")
#: The first bytes of every record: 0xC1 occurs in neither msgpack nor UTF-8.
RECORD_MARK = b"\xc1\xeb"
RECORD_MARK_VALUE: int = int.from_bytes(RECORD_MARK, "little")
#: Longer payloads are not events (the length is damaged); also a JSON line's limit.
MAX_RECORD = 64 * 1024 * 1024
MAX_LINE = MAX_RECORD

MAX_HEADER_LINE = 1024 * 1024

JSONL_MARKER = "eventbus_log"

LogFormat = Literal["msgpack", "jsonl"]


def length_check(size: int) -> int:
    """The 16-bit check of a record length, so a reader trusts a length before checksumming
    (the hot loops of the recorder and the reader inline it)."""
    return (size ^ size >> 16) & 0xFFFF


class LogHeader(msgspec.Struct, frozen=True, kw_only=True):
    """What a log says about itself. ``created`` is wall time (Unix seconds);
    ``event_types`` maps each known type tag to the module defining it."""

    format_version: int = LOG_FORMAT_VERSION
    schema_version: int = SCHEMA_VERSION
    run_id: str = ""
    created: float = msgspec.field(default_factory=time.time)
    writer: str = "train-eventbus"
    event_types: dict[str, str] = msgspec.field(default_factory=dict)


class TruncatedTail(msgspec.Struct, frozen=True, kw_only=True):
    """A record cut short at the end of the file (a crash mid-write): at ``offset``,
    record number ``index``, ``size`` bytes of it there."""

    offset: int
    index: int
    size: int

    def describe(self, path: str | Path) -> str:
        return (
            f"{path}: truncated at byte {self.offset} (record {self.index}, "
            f"{self.size} bytes of a partial record); the {self.index} records before it are intact"
        )


class LogError(ValueError):
    """A file that cannot be read as an event log; the message names file and place."""


class LogFormatError(LogError):
    """Not an event log, a damaged header, or a newer format/schema than this library."""


class CorruptLogError(LogError):
    """A record that is not a valid event, at byte ``offset``, record number ``index``."""

    def __init__(self, path: str | Path, offset: int, index: int, reason: str) -> None:
        self.path = str(path)
        self.offset = offset
        self.index = index
        self.reason = reason
        super().__init__(f"{path}: corrupt record {index} at byte {offset}: {reason}")


class _JsonlHeader(msgspec.Struct, frozen=True, kw_only=True):
    """A JSON Lines header line: ``LogHeader`` with the format version under the marker."""

    format_version: int | None = msgspec.field(default=None, name=JSONL_MARKER)
    schema_version: int = SCHEMA_VERSION
    run_id: str = ""
    created: float = 0.0
    writer: str = ""
    event_types: dict[str, str] = msgspec.field(default_factory=dict)


_meta_encoder = msgspec.msgpack.Encoder()
_meta_decoder = msgspec.msgpack.Decoder(LogHeader)
_json_header_decoder = msgspec.json.Decoder(_JsonlHeader)


def format_for_path(path: str | Path) -> LogFormat:
    """The encoding a new log gets from its name: ``.jsonl`` is JSON Lines."""
    return "jsonl" if Path(path).suffix.lower() == ".jsonl" else "msgpack"


def encode_header(header: LogHeader, fmt: LogFormat) -> bytes:
    fields: dict[str, object] = {
        "run_id": header.run_id,
        "created": header.created,
        "writer": header.writer,
    }
    if header.event_types:
        fields["event_types"] = header.event_types
    if fmt == "jsonl":
        first = {JSONL_MARKER: header.format_version, "schema_version": header.schema_version}
        return msgspec.json.encode(first | fields) + b"\n"
    meta = _meta_encoder.encode(fields)
    return PREFIX.pack(LOG_MAGIC, header.format_version, header.schema_version, len(meta)) + meta


def check_versions(path: str | Path, header: LogHeader) -> None:
    """Refuse what this library cannot read; older schemas decode with today's defaults."""
    version = header.format_version
    if version != LOG_FORMAT_VERSION:
        newer = version > LOG_FORMAT_VERSION
        advice = "upgrade train-eventbus" if newer else "no released train-eventbus wrote it"
        raise LogFormatError(
            f"{path}: unsupported log format version {version} (this eventbus reads "
            f"version {LOG_FORMAT_VERSION}): {advice}"
        )
    if header.schema_version > SCHEMA_VERSION:
        raise LogFormatError(
            f"{path}: log event schema version {header.schema_version} is newer than this "
            f"eventbus understands ({SCHEMA_VERSION}); upgrade train-eventbus to read it"
        )


def decode_msgpack_header(path: str | Path, prefix: bytes, meta: bytes) -> LogHeader:
    """``prefix`` is the fixed part (``PREFIX.size`` bytes), ``meta`` the metadata map."""
    _, format_version, schema_version, _ = PREFIX.unpack(prefix)
    try:
        fields = _meta_decoder.decode(meta)
    except (msgspec.DecodeError, RecursionError) as exc:
        raise LogFormatError(f"{path}: damaged log header metadata: {exc}") from None
    header = msgspec.structs.replace(
        fields, format_version=format_version, schema_version=schema_version
    )
    check_versions(path, header)
    return header


def decode_jsonl_header(path: str | Path, line: bytes) -> LogHeader:
    try:
        fields = _json_header_decoder.decode(line)
    except msgspec.ValidationError as exc:
        raise LogFormatError(f"{path}: damaged event-log header: {exc}") from None
    except (msgspec.DecodeError, RecursionError) as exc:
        raise LogFormatError(f"{path}: first line is not an event-log header: {exc}") from None
    if fields.format_version is None:
        raise LogFormatError(
            f"{path}: first line is not an event-log header (no {JSONL_MARKER!r} key)"
        )
    header = LogHeader(**msgspec.structs.asdict(fields))
    check_versions(path, header)
    return header


def intact_record_in(data: bytes, start: int, end: int) -> bool:
    """Whether ``data[start:end]`` holds a whole, intact record: a torn tail holds none,
    a damaged length claiming past the end may. Bounded work on a crafted tail."""
    hsize = RECORD_HEADER.size
    budget = 4 * (end - start) + (1 << 20)
    q = data.find(RECORD_MARK, start, end)
    while q >= 0 and q + hsize <= end:
        _, check, size, crc = RECORD_HEADER.unpack_from(data, q)
        stop = q + hsize + size
        if check == length_check(size) and stop <= end:
            budget -= size
            if budget < 0:
                return False
            with memoryview(data) as view:
                if zlib.crc32(view[q + hsize : stop]) == crc:
                    return True
        q = data.find(RECORD_MARK, q + 1, end)
    return False
