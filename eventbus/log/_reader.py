"""Reading event logs: streamed in chunks, validated, and honest about damage (the reading
rules are docs/log-format.md's)."""

from __future__ import annotations

import enum
import io
import os
import shutil
import stat
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Self

import msgspec

from .._codec import decoder_for
from .._events import Event, EventPlaceholder
from . import _format
from ._format import (
    LOG_MAGIC,
    MAX_HEADER_LINE,
    MAX_RECORD,
    PREFIX,
    RECORD_HEADER,
    RECORD_MARK,
    RECORD_MARK_VALUE,
    CorruptLogError,
    LogError,
    LogFormat,
    LogFormatError,
    LogHeader,
    TruncatedTail,
    decode_jsonl_header,
    decode_msgpack_header,
    intact_record_in,
    length_check,
)
from ._placeholders import decode_again

__all__ = ["LogContents", "LogReader", "LogStreamError", "read_log", "require_file"]

#: Corrupt records kept (as errors) when skipping; the rest are only counted.
KEEP_ERRORS = 100
#: Bytes checksummed for damaged records (plus ``RESYNC_BUDGET_PER_BYTE`` per byte read)
#: before the reader skips them by their length instead, so that reading stays linear.
RESYNC_BUDGET = MAX_RECORD
RESYNC_BUDGET_PER_BYTE = 8
#: The most one read of a stream (no size to bound it by) may ask for: the longest record.
STREAM_READ = MAX_RECORD + RECORD_HEADER.size


_KINDS = {
    stat.S_IFIFO: "a pipe",
    stat.S_IFSOCK: "a socket",
    stat.S_IFCHR: "a character device",
    stat.S_IFBLK: "a block device",
}


class LogStreamError(LogError):
    """A log that can be read only once (a pipe, a FIFO, a device) given to what reads it twice."""


def require_file(path: str | os.PathLike[str], purpose: str) -> None:
    """Refuse, before opening it (a FIFO would wait for a writer), a log that can be read
    only once; ``purpose`` says what reads it twice."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return
    if stat.S_ISREG(mode) or stat.S_ISDIR(mode):
        return
    raise LogStreamError(
        f"{os.fsdecode(path)}: is {_KINDS.get(stat.S_IFMT(mode), 'not a regular file')}, "
        "which can be read only once, and "
        f"{purpose} reads a log twice: copy it to a file first"
    )


class LogReader:
    """Iterates the events of a log, in either encoding (told apart by content), once.

    Raises ``LogError`` at once for a file that is not a log this library can read.

    Args:
        path: the log; a pipe or FIFO is read as a file is.
        skip_corrupt: go on past a damaged record (counted in ``skipped``, the
            first ones kept in ``errors``) instead of raising a ``LogError``.
        chunk_size: bytes read at a time.

    After the iteration, ``count`` is the events yielded (placeholders included) and
    ``truncated`` where a torn last record starts (``None`` if none).
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
        self.chunk_size = max(1, chunk_size)
        self.count = 0
        self.skipped = 0
        self.errors: list[CorruptLogError] = []
        self.truncated: TruncatedTail | None = None
        self._file: io.BufferedReader = open(self.path, "rb")  # noqa: SIM115 (closed by close())
        self._iterated = False
        #: The header's bytes as read from a stream, for ``copy_to``.
        self._head = b""
        try:
            self.stream = not stat.S_ISREG(os.fstat(self._file.fileno()).st_mode)
            self.format, self.header, self.data_offset = self._read_header()
        except BaseException:
            self._file.close()
            raise
        #: Placeholders made for intact records not decodable as their type.
        self.placeholders = 0
        self._failed_checksums = 0

    def _read_header(self) -> tuple[LogFormat, LogHeader, int]:
        """The header; what does not start as a log (``/dev/zero``) is refused at its
        first bytes."""
        f = self._file
        # One read, never waiting for more: enough to refuse most that is no log.
        first = f.peek(PREFIX.size)[: PREFIX.size]
        if first and not _may_start_log(first):
            raise self._not_a_log(first)
        start = f.read(PREFIX.size)
        if not start:
            raise LogFormatError(
                f"{self.path}: empty file, not an event log (expected {LOG_MAGIC!r} or a "
                "JSON Lines header line)"
            )
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
            if self.stream:
                self._head = start + meta
            return "msgpack", header, PREFIX.size + meta_size
        if start.lstrip()[:1] == b"{":
            if b"\n" in start:  # a first line shorter than the prefix: no header, cut there
                line = start[: start.index(b"\n") + 1]
            else:
                line = start + f.readline(MAX_HEADER_LINE + 1 - len(start))
            if len(line) > MAX_HEADER_LINE:
                raise LogFormatError(
                    f"{self.path}: first line is not an event-log header (longer than "
                    f"{MAX_HEADER_LINE >> 20} MiB, expected a JSON object with an "
                    f"{_format.JSONL_MARKER!r} key on a line of at most that)"
                )
            if not line.endswith(b"\n"):
                raise LogFormatError(f"{self.path}: truncated log header (no end of line)")
            header = decode_jsonl_header(self.path, line)
            if self.stream:
                self._head = bytes(line)
            return "jsonl", header, len(line)
        raise self._not_a_log(start)

    def _not_a_log(self, start: bytes) -> LogFormatError:
        return LogFormatError(
            f"{self.path}: not an event log (starts with {start[:8]!r}, expected "
            f"{LOG_MAGIC!r} or a JSON Lines header)"
        )

    def __iter__(self) -> Iterator[Event]:
        """The events; the file closes when they end."""
        if self._iterated:
            raise RuntimeError(f"{self.path}: a LogReader is iterated once; open a new one")
        self._iterated = True
        return self._jsonl_events() if self.format == "jsonl" else self._msgpack_events()

    def _corrupt(self, offset: int, index: int, reason: str) -> None:

        error = CorruptLogError(self.path, offset, index, reason)
        if not self.skip_corrupt:
            raise error
        self.skipped += 1
        if len(self.errors) < KEEP_ERRORS:
            self.errors.append(error)

    # --- msgpack -------------------------------------------------------------------------

    def _msgpack_events(self) -> Iterator[Event]:
        """Each record in turn; whatever stops that is ``_next_record``'s to sort out."""
        try:
            buffer = _Buffer(self._file, self.data_offset, self.chunk_size, self._remaining)
            unpack = RECORD_HEADER.unpack_from
            hsize = RECORD_HEADER.size
            mark = RECORD_MARK_VALUE
            crc32 = zlib.crc32
            decode = decoder_for("msgpack").decode
            undecodable = (msgspec.DecodeError, RecursionError)
            index = 0
            at = self.data_offset  # the file offset of the next record
            while True:
                data = buffer.data
                pos = at - buffer.base
                last = len(data) - hsize  # the last place a whole header can start
                # A bytes slice: cheaper to make, checksum and decode than a memoryview's.
                while pos <= last:
                    m, check, size, crc = unpack(data, pos)
                    stop = pos + hsize + size
                    # ``length_check`` inlined: this loop runs per record.
                    if m != mark or check != (size ^ size >> 16) & 0xFFFF or stop > len(data):
                        break
                    payload = data[pos + hsize : stop]
                    if crc32(payload) != crc:
                        self._failed_checksums += size  # and once more by ``_examine``
                        break
                    try:
                        event = decode(payload)
                    except undecodable as exc:
                        found = decode_again("msgpack", payload, exc, self.header.event_types)
                        assert isinstance(found, Event)  # an intact record: never corrupt
                        self.placeholders += isinstance(found, EventPlaceholder)
                        event = found
                        decode = decoder_for("msgpack").decode  # a class may be new since
                    yield event
                    pos = stop
                    index += 1
                self.count = index - self.skipped
                at, index = self._next_record(buffer, buffer.base + pos, index)
                if at < 0:
                    break
            self.count = index - self.skipped
        finally:
            self.close()

    def _examine(self, buffer: _Buffer, at: int) -> tuple[_Found, int, str]:
        """What starts at file offset ``at``: a record, the end, a torn tail, or damage."""
        hsize = RECORD_HEADER.size
        data, pos = buffer.hold(at, hsize)
        if len(data) - pos < hsize:  # the end of the file
            if pos == len(data):
                return _Found.END, -1, ""
            if RECORD_MARK.startswith(data[pos : pos + 2]):
                return _Found.TORN, -1, ""
            return _Found.DAMAGE, -1, "damaged record header (no record marker)"
        m, check, size, crc = RECORD_HEADER.unpack_from(data, pos)
        if m != RECORD_MARK_VALUE:
            return _Found.DAMAGE, -1, "damaged record header (no record marker)"
        if check != length_check(size):
            return _Found.DAMAGE, -1, f"damaged record header (length {size} fails its check)"
        if size > MAX_RECORD:
            reason = (
                f"damaged record header (length {size} is over the {MAX_RECORD >> 20} MiB limit)"
            )
            return _Found.DAMAGE, -1, reason
        data, pos = buffer.hold(at, hsize + size)
        if len(data) - pos < hsize + size:  # the payload runs past the end of the file
            if not intact_record_in(data, pos + 1, len(data)):
                return _Found.TORN, -1, ""  # a whole header, part of its payload: cut short
            reason = (
                f"damaged record (its length {size} runs past the end of the file, "
                "but an intact record follows)"
            )
            return _Found.DAMAGE, -1, reason
        with memoryview(data) as view:
            if zlib.crc32(view[pos + hsize : pos + hsize + size]) == crc:
                return _Found.RECORD, at + hsize + size, ""
        self._failed_checksums += size
        return (
            _Found.DAMAGE,
            at + hsize + size,
            f"checksum mismatch (a damaged record of {size} bytes)",
        )

    def _next_record(self, buffer: _Buffer, at: int, index: int) -> tuple[int, int]:
        """Where the next intact record starts from file offset ``at`` (-1: the log ended),
        and its index; damage there is reported and resynchronised past."""
        found, stop, reason = self._examine(buffer, at)
        searching = False
        while found is _Found.DAMAGE:
            if stop >= 0 or not searching:
                self._corrupt(at, index, reason)
                index += 1
            # Look inside the damaged record, or past it once ``RESYNC_BUDGET`` is spent.
            budget = RESYNC_BUDGET + RESYNC_BUDGET_PER_BYTE * (at - self.data_offset)
            past = stop >= 0 and self._failed_checksums > budget
            at = buffer.find(RECORD_MARK, stop if past else at + 1)
            if at < 0:
                return -1, index
            found, stop, reason = self._examine(buffer, at)
            searching = True
        if found is _Found.TORN:
            self.truncated = TruncatedTail(offset=at, index=index, size=buffer.end - at)
        return (at if found is _Found.RECORD else -1), index

    # --- JSON Lines --------------------------------------------------------------------

    def _jsonl_events(self) -> Iterator[Event]:

        try:
            max_line = _format.MAX_LINE  # looked up here, so a test can lower it
            readline = self._file.readline
            limit = max_line + 1  # the longest line and its newline
            quick = min(limit, max(self.chunk_size, 1 << 16))  # one read holds most lines
            decode = decoder_for("json").decode
            undecodable = (msgspec.DecodeError, RecursionError)
            offset = self.data_offset
            index = 0
            line: bytes | bytearray
            while line := readline(quick):
                size = len(line)
                if size == quick and line[-1] != 10:
                    if size < limit:
                        # In one bytearray: ``readline(limit)`` would hold a long line twice.
                        line = _rest_of_line(self._file, line, limit, self.chunk_size)
                        size = len(line)
                    if size == limit and line[-1] != 10:
                        # Longer than any event: skip to the next newline, holding no more of it.
                        size += _skip_line(self._file, self.chunk_size)
                        self._corrupt(offset, index, f"line longer than {max_line} bytes")
                        offset += size
                        index += 1
                        continue
                if line.isspace():
                    offset += size
                    continue
                try:
                    event = decode(line)
                except undecodable as exc:
                    found = decode_again("json", line, exc, self.header.event_types)
                    self.placeholders += isinstance(found, EventPlaceholder)
                    decode = decoder_for("json").decode  # a class may be new since
                    if isinstance(found, str):
                        if line[-1] != 10:  # the last line, cut short mid-write
                            self.truncated = TruncatedTail(offset=offset, index=index, size=size)
                            return
                        self._corrupt(offset, index, found)
                        offset += size
                        index += 1
                        continue
                    event = found
                self.count += 1
                yield event
                offset += size
                index += 1
        finally:
            self.close()

    def copy_to(self, target: IO[bytes]) -> None:
        """Write the whole log, header included, to ``target`` instead of iterating it:
        how a log that can be read only once (``/dev/stdin``) becomes a file."""
        if self._iterated:
            raise RuntimeError(f"{self.path}: a LogReader is iterated once; open a new one")
        self._iterated = True
        try:
            if self.stream:
                target.write(self._head)
            else:
                self._file.seek(0)
            shutil.copyfileobj(self._file, target, 1 << 20)
        finally:
            self.close()

    # --- the file ------------------------------------------------------------------------

    def _remaining(self, offset: int) -> int:
        """The most a read at ``offset`` may ask for (a file may grow while read)."""
        if self.stream:
            return STREAM_READ
        return max(0, os.fstat(self._file.fileno()).st_size - offset)

    def close(self) -> None:
        self._file.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<LogReader {str(self.path)!r} {self.format} schema={self.header.schema_version}>"


def _may_start_log(start: bytes) -> bool:
    """Whether a log may begin with ``start``: the magic or part of it, or ``{"``."""
    if start.startswith(LOG_MAGIC) or LOG_MAGIC.startswith(start):
        return True
    text = start.lstrip()
    if not text:
        return True
    if text[:1] != b"{":
        return False
    rest = text[1:].lstrip()
    return not rest or rest[:1] == b'"'


def _rest_of_line(file: IO[bytes], start: bytes, limit: int, chunk: int) -> bytes | bytearray:
    """A line longer than one read, up to ``limit`` bytes, in one buffer."""
    line = bytearray(start)
    piece = start
    while len(line) < limit and piece[-1] != 10:
        piece = file.readline(min(limit - len(line), max(chunk, 1 << 16)))
        if not piece:
            break
        line += piece
    return line


def _skip_line(file: IO[bytes], chunk: int) -> int:
    """Read past the rest of a line; returns its size in bytes."""
    skipped = 0
    while piece := file.readline(chunk):
        skipped += len(piece)
        if piece[-1] == 10:
            break
    return skipped


class LogContents(msgspec.Struct, frozen=True, kw_only=True):
    """A whole (small) log in memory: what ``read_log`` returns."""

    header: LogHeader
    events: list[Event]
    truncated: TruncatedTail | None = None
    skipped: int = 0
    placeholders: int = 0


def read_log(path: str | os.PathLike[str], *, skip_corrupt: bool = False) -> LogContents:
    """Read a whole log into memory (tests, small logs); stream big ones with ``LogReader``."""
    with LogReader(path, skip_corrupt=skip_corrupt) as reader:
        events = list(reader)
    return LogContents(
        header=reader.header,
        events=events,
        truncated=reader.truncated,
        skipped=reader.skipped,
        placeholders=reader.placeholders,
    )


class _Found(enum.Enum):
    RECORD = "a whole, intact record"
    END = "the end of the log"
    TORN = "a record cut short at the end of the file"
    DAMAGE = "a damaged record, or bytes that start none"


class _Buffer:
    """The bytes of a msgpack log its reader still needs, from file offset ``base``; never
    more than the file holds, so a damaged length cannot make it allocate what it claims."""

    __slots__ = ("base", "chunk_size", "data", "eof", "read", "remaining")

    def __init__(
        self, file: IO[bytes], base: int, chunk_size: int, remaining: Callable[[int], int]
    ) -> None:
        self.read = file.read
        self.base = base
        self.data = b""
        self.chunk_size = chunk_size
        self.remaining = remaining
        self.eof = False

    @property
    def end(self) -> int:

        return self.base + len(self.data)

    def hold(self, at: int, size: int) -> tuple[bytes, int]:
        """The buffer holding ``size`` bytes at ``at`` (if the file has them), and ``at`` in it."""
        while self.end < at + size and not self.eof:
            want = min(max(self.chunk_size, at + size - self.end), self.remaining(self.end))
            chunk = self.read(want) if want > 0 else b""
            if not chunk:
                self.eof = True
                break
            drop = at - self.base
            self.data = self.data[drop:] + chunk
            self.base = at
        return self.data, at - self.base

    def find(self, marker: bytes, at: int) -> int:
        """The file offset of the next ``marker`` at or after ``at``; -1 if none."""
        while True:
            data, pos = self.hold(at, 0)
            found = data.find(marker, pos)
            if found >= 0:
                return self.base + found
            if self.eof:
                return -1
            at = max(at, self.end - len(marker) + 1)  # a marker may straddle two reads
            self.hold(at, self.end - at + 1)
