"""Reading event logs: streamed, validated, honest about damage.

The file is read in chunks and decoded record by record, so a log of any
length is read in constant memory. Every record is validated against the
event union. A record cut short at the end (a crash mid-write) ends the
iteration and is reported in ``truncated``; every record before it is
returned. A damaged record raises ``CorruptLogError`` with its byte offset
and index, or, with ``skip_corrupt=True``, is skipped and counted, and
reading goes on from the next intact record (format version 2 finds it by
its sync marker and checksums, so damage costs only the records it hit).

A record that is intact (its checksum holds, or, in JSON Lines, it is a
well-formed object) but does not decode as its type is yielded as an
``EventPlaceholder`` and counted in ``placeholders`` (``_salvage`` has that
slow path): a log the recorder wrote is always readable to its end.

A pipe, a FIFO or ``/dev/stdin`` is read as a file is. Its size is unknown,
so a read is bounded by what a record may be (``MAX_RECORD`` and a header)
instead of by what the file still holds: a damaged length never makes the
reader allocate what it claims. What reads a log twice (``rollbacks``)
refuses a stream with ``LogStreamError`` (``require_file``).
"""

from __future__ import annotations

import os
import stat
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Self

import msgspec

from .._codec import decoder_for
from .._events import Event
from . import _format
from ._format import (
    LOG_MAGIC,
    MAX_HEADER_LINE,
    MAX_RECORD,
    PREFIX,
    RECORD_HEADER,
    RECORD_LENGTH,
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
)
from ._salvage import Salvage

__all__ = ["LogContents", "LogReader", "LogStreamError", "read_log", "require_file"]

#: Corrupt records kept (as errors) when skipping; the rest are only counted.
KEEP_ERRORS = 100
#: Damaged records cost the CRC of what their lengths claim, up to ``MAX_RECORD``
#: bytes each. Past this many such bytes (plus ``WASTE_FACTOR`` times the bytes
#: read so far) the reader checks each length before its CRC and skips a failed
#: record whole instead of searching inside it, so a file crafted to be
#: expensive still costs linear time. Damage that happens never gets there.
WASTE_ALLOWANCE = MAX_RECORD
WASTE_FACTOR = 8
#: The most one read of a stream (a pipe: no size to bound it by) may ask for: a whole
#: record of the longest length a record may have, and its header.
STREAM_READ = MAX_RECORD + RECORD_HEADER.size


class LogStreamError(LogError):
    """A log that can be read only once (a pipe, a FIFO, a device) given to what reads it twice."""


def require_file(path: str | os.PathLike[str], purpose: str) -> None:
    """Refuse a log that can be read only once before opening it (opening a FIFO would
    wait for a writer), naming it, what it is and what to do; ``purpose`` says what
    reads it twice. A missing file or a directory is left to opening it to report."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return
    if stat.S_ISREG(mode) or stat.S_ISDIR(mode):
        return
    raise LogStreamError(
        f"{os.fsdecode(path)}: is {_file_kind(mode)}, which can be read only once, and "
        f"{purpose} reads a log twice: copy it to a file first"
    )


def _file_kind(mode: int) -> str:
    """What a file that is not a regular one is, for messages."""
    if stat.S_ISFIFO(mode):
        return "a pipe"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISCHR(mode):
        return "a character device"
    if stat.S_ISBLK(mode):
        return "a block device"
    return "not a regular file"


class LogReader:
    """Iterate the events of a log file (either encoding, told apart by content).

    The header is read and checked on construction: ``LogFormatError`` for
    a file that is not an event log or was written by a newer schema.
    Iterate once; afterwards ``count`` is the number of events returned
    (placeholders included), ``placeholders`` how many ``EventPlaceholder``s
    the reader made for intact records that did not decode as their type
    (those the recorder wrote are events like any other, not counted here),
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
        self.chunk_size = max(1, chunk_size)
        self.count = 0
        self.skipped = 0
        self.errors: list[CorruptLogError] = []
        self.truncated: TruncatedTail | None = None
        self._file: IO[bytes] = open(self.path, "rb")  # noqa: SIM115 (closed by close())
        self._iterated = False
        try:
            #: Not a regular file (a pipe...): no size, reads bounded by ``STREAM_READ``.
            self.stream = not stat.S_ISREG(os.fstat(self._file.fileno()).st_mode)
            self.format, self.header, self.data_offset = self._read_header()
        except BaseException:
            self._file.close()
            raise
        self._undecodable = Salvage(self.path, self.header.event_types)

    @property
    def placeholders(self) -> int:
        """Placeholders this reader made for intact records not decodable as their type."""
        return self._undecodable.placeholders

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
            if b"\n" in start:  # a first line shorter than the prefix: no header, cut there
                line = start[: start.index(b"\n") + 1]
            else:
                line = start + f.readline(MAX_HEADER_LINE + 1 - len(start))
            if len(line) > MAX_HEADER_LINE:
                raise LogFormatError(
                    f"{self.path}: first line is not an event-log header (longer than "
                    f"{MAX_HEADER_LINE} bytes)"
                )
            if not line.endswith(b"\n"):
                raise LogFormatError(f"{self.path}: truncated log header (no end of line)")
            return "jsonl", decode_jsonl_header(self.path, line), len(line)
        raise LogFormatError(
            f"{self.path}: not an event log (starts with {start[:8]!r}, expected "
            f"{LOG_MAGIC!r} or a JSON Lines header)"
        )

    def __iter__(self) -> Iterator[Event]:
        """The events; the file closes when they end. Version 2's generator is handed
        out bare: a second generator frame per event costs a tenth of a record."""
        if self._iterated:
            raise RuntimeError(f"{self.path}: a LogReader is iterated once; open a new one")
        self._iterated = True
        if self.format == "jsonl":
            return self._closing(self._jsonl_events())
        if self.header.format_version == 1:
            return self._closing(self._msgpack_v1_events())
        return self._msgpack_v2_events()

    def _closing(self, events: Iterator[Event]) -> Iterator[Event]:
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

    # --- msgpack, format version 2 ------------------------------------------------------

    def _msgpack_v2_events(self) -> Iterator[Event]:
        try:  # closes the file itself (not through ``_closing``): one generator frame
            read = self._file.read
            unpack = RECORD_HEADER.unpack_from
            hsize = RECORD_HEADER.size
            mark = RECORD_MARK_VALUE
            marker = RECORD_MARK
            crc32 = zlib.crc32
            decode = decoder_for("msgpack").decode
            undecodable = (msgspec.DecodeError, RecursionError)
            data = b""
            pos = 0
            base = self.data_offset  # file offset of data[0]
            index = 0
            want = hsize  # bytes needed from pos before reading can go on
            damaged = False  # True: searching for the next intact record from pos
            eof = False
            wasted = 0  # bytes checksummed for records that turned out damaged
            careful = False  # wasted too much: check lengths first, skip failed records whole
            while True:
                have = len(data) - pos
                if have < want and not eof:
                    # Never more than the file still holds (a stream: than a record may
                    # be): a damaged length must not allocate what it claims.
                    size = min(max(self.chunk_size, want - have), self._remaining(base + len(data)))
                    chunk = read(size) if size > 0 else b""
                    if chunk:
                        data = data[pos:] + chunk
                        base += pos
                        pos = 0
                        if len(data) < want:
                            continue
                    else:
                        eof = True
                end = len(data)
                if not damaged:
                    # Per record: a header, a payload copy (a bytes slice is cheaper to make,
                    # checksum and decode than a memoryview slice, which the garbage
                    # collector tracks), its CRC, its decoding. The length check is left to
                    # the slow path: a wrong length that fits in this chunk fails the CRC
                    # anyway (and counts as waste), until the waste says the file is
                    # hostile (``careful``).
                    last = end - hsize  # the last offset a whole header can start at
                    while pos <= last:
                        m, check, size, crc = unpack(data, pos)
                        start = pos + hsize
                        stop = start + size
                        if (
                            m != mark
                            or stop > end
                            or (careful and check != (size ^ size >> 16) & 0xFFFF)
                        ):
                            break
                        payload = data[start:stop]
                        if crc32(payload) != crc:
                            break
                        try:
                            event = decode(payload)
                        except undecodable as exc:
                            found = self._undecodable("msgpack", payload, exc, placeholders=True)
                            assert not isinstance(found, str)
                            event = found
                            decode = decoder_for("msgpack").decode  # a class may be new since
                        yield event
                        pos = stop
                        index += 1
                    self.count = index - self.skipped
                    if pos + hsize > end:
                        if not eof:
                            want = hsize
                            continue
                        if pos == end:
                            break
                        if marker.startswith(data[pos : pos + 2]):  # the start of a header
                            self.truncated = TruncatedTail(
                                offset=base + pos, index=index, size=end - pos
                            )
                            break
                        reason = "damaged record header (no record marker)"
                    else:
                        m, check, size, crc = unpack(data, pos)
                        if m == mark and pos + hsize + size <= end:
                            wasted += size  # its CRC was computed, and failed
                            careful = careful or wasted > self._allowance(base + pos)
                        if m != mark:
                            reason = "damaged record header (no record marker)"
                        elif check != (size ^ size >> 16) & 0xFFFF or size > MAX_RECORD:
                            reason = f"damaged record header (length {size} fails its check)"
                        elif pos + hsize + size > end:
                            if not eof:
                                want = hsize + size
                                continue
                            if not intact_record_in(data, pos + 1, end):
                                # A whole header, part of its payload: cut short mid-write.
                                self.truncated = TruncatedTail(
                                    offset=base + pos, index=index, size=end - pos
                                )
                                break
                            reason = (
                                f"damaged record (its length {size} runs past the end of the file, "
                                "but an intact record follows)"
                            )
                        else:
                            reason = f"checksum mismatch (a damaged record of {size} bytes)"
                    self._corrupt(base + pos, index, reason)
                    index += 1
                    self.count = index - self.skipped
                    damaged = True
                    pos += 1
                    want = hsize
                    continue
                # Damaged: find the next marker whose header checks, then its payload's CRC.
                q = data.find(marker, pos)
                if q < 0:
                    if eof:
                        break
                    pos = max(pos, end - 1)  # a marker may straddle two chunks
                    want = end - pos + 1
                    continue
                if q + hsize > end:
                    if eof:  # a marker and part of a header at the very end: cut short
                        self.truncated = TruncatedTail(offset=base + q, index=index, size=end - q)
                        break
                    pos = q
                    want = hsize
                    continue
                m, check, size, crc = unpack(data, q)
                if check != (size ^ size >> 16) & 0xFFFF or size > MAX_RECORD:
                    pos = q + 1
                    continue
                stop = q + hsize + size
                if stop > end:
                    if not eof:
                        pos = q
                        want = hsize + size
                        continue
                    if not intact_record_in(data, q + 1, end):
                        self.truncated = TruncatedTail(offset=base + q, index=index, size=end - q)
                        break
                    pos = q + 1  # not a torn tail: an intact record lies within its length
                    continue
                with memoryview(data) as view:
                    intact = crc32(view[q + hsize : stop]) == crc
                if not intact:  # a record whose header holds and whose payload does not
                    wasted += size
                    careful = careful or wasted > self._allowance(base + q)
                    self._corrupt(
                        base + q, index, f"checksum mismatch (a damaged record of {size} bytes)"
                    )
                    index += 1
                    pos = stop if careful else q + 1
                    continue
                damaged = False  # back in step: the next record starts at q
                pos = q
                want = hsize
            self.count = index - self.skipped
        finally:
            self.close()

    def _allowance(self, offset: int) -> int:
        """How many checksummed bytes damaged records may cost by ``offset``."""
        return WASTE_ALLOWANCE + WASTE_FACTOR * (offset - self.data_offset)

    # --- msgpack, format version 1 (a bare length prefix) ------------------------------

    def _msgpack_v1_events(self) -> Iterator[Event]:
        read = self._file.read
        decode = decoder_for("msgpack").decode
        unpack = RECORD_LENGTH.unpack_from
        undecodable = (msgspec.DecodeError, RecursionError)
        data = b""
        pos = 0
        base = self.data_offset  # file offset of data[0]
        index = 0
        need = 0
        size = 0
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
                except undecodable as exc:
                    found = self._undecodable("msgpack", view[pos + 4 : stop], exc)
                    if isinstance(found, str):
                        self._corrupt(base + pos, index, found)
                    else:
                        yield found
                else:
                    yield event
                pos = stop
                index += 1
            self.count = index - self.skipped
            view.release()
            if not chunk:
                break
            # A record longer than a chunk: read it whole, but never more than the
            # file still holds or a record may be (a damaged length must not allocate
            # what it claims).
            need = min(size + 4, self._remaining(base + end)) if pos + 4 <= end else 0
        self.count = index - self.skipped
        if pos < len(data):
            self.truncated = TruncatedTail(offset=base + pos, index=index, size=len(data) - pos)

    # --- JSON Lines --------------------------------------------------------------------

    def _jsonl_events(self) -> Iterator[Event]:
        max_line = _format.MAX_LINE  # looked up here, so a test can lower it
        readline = self._file.readline
        limit = max_line + 1  # the longest line and its newline
        quick = min(limit, max(self.chunk_size, 1 << 16))  # one read holds most lines
        decode = decoder_for("json").decode
        undecodable = (msgspec.DecodeError, RecursionError)
        placeholders = self.header.format_version >= 2
        offset = self.data_offset
        index = 0
        line: bytes | bytearray
        while line := readline(quick):
            size = len(line)
            if size == quick and line[-1] != 10:
                if size < limit:
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
                found = self._undecodable("json", line, exc, placeholders=placeholders)
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

    # --- the file ------------------------------------------------------------------------

    def _remaining(self, offset: int) -> int:
        """The most a read at ``offset`` may ask for: what the file still holds (it may
        grow while read), or, for a stream, what one record may be."""
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


def _rest_of_line(file: IO[bytes], start: bytes, limit: int, chunk: int) -> bytes | bytearray:
    """A line longer than one read, gathered up to ``limit`` bytes (in one buffer:
    ``readline(limit)`` would hold it twice)."""
    line = bytearray(start)
    piece = start
    while len(line) < limit and piece[-1] != 10:
        piece = file.readline(min(limit - len(line), max(chunk, 1 << 16)))
        if not piece:
            break
        line += piece
    return line


def _skip_line(file: IO[bytes], chunk: int) -> int:
    """Read past the rest of a line, a chunk at a time; the bytes it held."""
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
