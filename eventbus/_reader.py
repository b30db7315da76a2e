"""Reading event logs: streamed, validated, honest about damage.

The file is read in chunks and decoded record by record, so a log of any
length is read in constant memory. Every record is validated against the
event union. A record cut short at the end (a crash mid-write) ends the
iteration and is reported in ``truncated``; every record before it is
returned. A record that is not a valid event raises ``CorruptLogError``
with its byte offset and index, or, with ``skip_corrupt=True``, is skipped
and counted.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from types import TracebackType
from typing import IO, Self

import msgspec

from ._codec import _decoder
from ._events import Event
from ._logformat import (
    LOG_MAGIC,
    MAX_RECORD,
    PREFIX,
    RECORD_LENGTH,
    CorruptLogError,
    LogFormat,
    LogFormatError,
    LogHeader,
    TruncatedTail,
    decode_jsonl_header,
    decode_msgpack_header,
)

__all__ = ["LogContents", "LogReader", "read_log"]

#: Corrupt records kept (as errors) when skipping; the rest are only counted.
KEEP_ERRORS = 100


class LogReader:
    """Iterate the events of a log file (either encoding, told apart by content).

    The header is read and checked on construction: ``LogFormatError`` for
    a file that is not an event log or was written by a newer schema.
    Iterate once; afterwards ``count`` is the number of events returned,
    ``truncated`` says where a torn last record starts (or is ``None``),
    ``skipped`` counts corrupt records passed over (``skip_corrupt=True``)
    and ``errors`` holds the first of them.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        skip_corrupt: bool = False,
        chunk_size: int = 1024 * 1024,
    ) -> None:
        self.path = Path(path)
        self.skip_corrupt = skip_corrupt
        self.chunk_size = chunk_size
        self.count = 0
        self.skipped = 0
        self.errors: list[CorruptLogError] = []
        self.truncated: TruncatedTail | None = None
        self._file: IO[bytes] = open(self.path, "rb")  # noqa: SIM115 (closed by close())
        self._iterated = False
        try:
            self.format, self.header, self.data_offset = self._read_header()
        except BaseException:
            self._file.close()
            raise

    def _read_header(self) -> tuple[LogFormat, LogHeader, int]:
        f = self._file
        start = f.read(PREFIX.size)
        if not start:
            raise LogFormatError(f"{self.path}: empty file, not an event log")
        if start.startswith(LOG_MAGIC) or LOG_MAGIC.startswith(start):
            if len(start) < PREFIX.size:
                raise LogFormatError(f"{self.path}: truncated log header ({len(start)} bytes)")
            meta_size = PREFIX.unpack(start)[3]
            if meta_size > MAX_RECORD:
                raise LogFormatError(f"{self.path}: damaged log header (metadata size {meta_size})")
            meta = f.read(min(meta_size, self._remaining(PREFIX.size)))
            if len(meta) < meta_size:
                raise LogFormatError(
                    f"{self.path}: truncated log header ({PREFIX.size + len(meta)} of "
                    f"{PREFIX.size + meta_size} bytes)"
                )
            header = decode_msgpack_header(self.path, start, meta)
            return "msgpack", header, PREFIX.size + meta_size
        if start.lstrip()[:1] == b"{":
            line = start + f.readline()
            if not line.endswith(b"\n"):
                raise LogFormatError(f"{self.path}: truncated log header (no end of line)")
            return "jsonl", decode_jsonl_header(self.path, line), len(line)
        raise LogFormatError(
            f"{self.path}: not an event log (starts with {start[:8]!r}, expected "
            f"{LOG_MAGIC!r} or a JSON Lines header)"
        )

    def __iter__(self) -> Iterator[Event]:
        if self._iterated:
            raise RuntimeError(f"{self.path}: a LogReader is iterated once; open a new one")
        self._iterated = True
        events = self._msgpack_events() if self.format == "msgpack" else self._jsonl_events()
        try:
            yield from events
        finally:
            self.close()

    def _corrupt(self, offset: int, index: int, reason: str, *, fatal: bool = False) -> None:
        """Raise, or count and keep the error when skipping corrupt records."""
        error = CorruptLogError(self.path, offset, index, reason)
        if fatal or not self.skip_corrupt:
            raise error
        self.skipped += 1
        if len(self.errors) < KEEP_ERRORS:
            self.errors.append(error)

    def _msgpack_events(self) -> Iterator[Event]:
        read = self._file.read
        decode = _decoder("msgpack").decode
        unpack = RECORD_LENGTH.unpack_from
        decode_error = msgspec.DecodeError
        data = b""
        pos = 0
        base = self.data_offset  # file offset of data[0]
        index = 0
        need = 0
        while True:
            chunk = read(max(self.chunk_size, need))
            if chunk:
                data = data[pos:] + chunk
                base += pos
                pos = 0
            end = len(data)
            view = memoryview(data)
            while pos + 4 <= end:
                size = unpack(data, pos)[0]
                stop = pos + 4 + size
                if stop > end:
                    if size > MAX_RECORD:
                        # A length no event has: the prefix itself is damaged and
                        # the next record cannot be found, so even skipping stops here.
                        self._corrupt(
                            base + pos, index, f"record length {size} is not plausible", fatal=True
                        )
                    break
                try:
                    event = decode(view[pos + 4 : stop])
                except decode_error as exc:
                    self._corrupt(base + pos, index, f"not a valid event: {exc}")
                else:
                    yield event
                pos = stop
                index += 1
            self.count = index - self.skipped
            view.release()
            if not chunk:
                break
            # A record longer than a chunk: read it whole, but never more than the
            # file still holds (a damaged length must not allocate what it claims).
            need = min(size + 4, self._remaining(base + end)) if pos + 4 <= end else 0
        self.count = index - self.skipped
        if pos < len(data):
            self.truncated = TruncatedTail(offset=base + pos, index=index, size=len(data) - pos)

    def _jsonl_events(self) -> Iterator[Event]:
        decode = _decoder("json").decode
        decode_error = msgspec.DecodeError
        offset = self.data_offset
        index = 0
        for line in self._file:
            complete = line.endswith(b"\n")
            if line.isspace():
                offset += len(line)
                continue
            try:
                event = decode(line)
            except decode_error as exc:
                if not complete:  # the last line, cut short mid-write
                    self.truncated = TruncatedTail(offset=offset, index=index, size=len(line))
                    return
                self._corrupt(offset, index, f"not a valid event: {exc}")
            else:
                self.count += 1
                yield event
            offset += len(line)
            index += 1

    def _remaining(self, offset: int) -> int:
        return max(0, os.fstat(self._file.fileno()).st_size - offset)

    def close(self) -> None:
        self._file.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<LogReader {str(self.path)!r} {self.format} schema={self.header.schema_version}>"


class LogContents(msgspec.Struct, frozen=True, kw_only=True):
    """A whole (small) log in memory: what ``read_log`` returns."""

    header: LogHeader
    events: list[Event]
    truncated: TruncatedTail | None = None
    skipped: int = 0


def read_log(path: str | os.PathLike[str], *, skip_corrupt: bool = False) -> LogContents:
    """Read a whole log into memory (tests, small logs); stream big ones with ``LogReader``."""
    with LogReader(path, skip_corrupt=skip_corrupt) as reader:
        events = list(reader)
    return LogContents(
        header=reader.header, events=events, truncated=reader.truncated, skipped=reader.skipped
    )
