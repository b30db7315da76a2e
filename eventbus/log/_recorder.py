"""Recording a run's events to a log file: on the bus's hot path, so per event only an
encoding, a CRC and a buffer append; an event it cannot encode becomes a placeholder."""

from __future__ import annotations

import errno
import functools
import os
import stat
import time
import zlib
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import BinaryIO, Literal, Self

try:
    import fcntl
except ImportError:  # pragma: no cover - not POSIX
    fcntl = None  # type: ignore[assignment]

import msgspec

from .._bus import EventBus, blocking_io
from .._codec import encode_json, encode_json_nonfinite, event_modules, has_nonfinite
from .._events import SCHEMA_VERSION, CheckpointSaved, Event, EventPlaceholder, HealthCheckTick
from .._logging import get_logger
from .._options import Count, WaitSeconds
from .._stages import Stage
from ..options import checked
from ._format import (
    LOG_FORMAT_VERSION,
    MAX_LINE,
    MAX_RECORD,
    RECORD_HEADER,
    RECORD_MARK_VALUE,
    LogFormat,
    LogFormatError,
    LogHeader,
    encode_header,
    format_for_path,
)
from ._history import LogTail, scan_tail
from ._placeholders import placeholder_for
from ._reader import LogReader

__all__ = ["FsyncPolicy", "LogInUse", "LogRecorder", "RunIdMismatch"]

FsyncPolicy = Literal["never", "checkpoint", "batch"]

_log = get_logger("eventbus.recorder")


class RecordTooLarge(ValueError):
    """An encoded event longer than a reader accepts (``MAX_RECORD`` / ``MAX_LINE``)."""


class RunIdMismatch(ValueError):
    """A recorder asked to append one run's events to another run's log (whose sequence
    numbers and rollbacks that would make meaningless)."""


class LogInUse(OSError):
    """Another recorder (in this process or another) is writing the log: two writers
    would interleave their records, so the second is refused."""


def _open_locked(path: Path, *, new: bool) -> BinaryIO:
    """``path`` opened for writing, not truncated, locked (``flock``) before anything is read
    or cut. ``new``: create it or raise ``FileExistsError``, in one step (no race)."""
    flags = os.O_RDWR | os.O_CREAT | (os.O_EXCL if new else 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags, 0o666)
    except FileExistsError:
        raise FileExistsError(
            errno.EEXIST,
            f"{path}: a file is already there, and this log is never written over: give "
            "another path, or resume the run it records (whose history it then continues)",
            str(path),
        ) from None
    try:
        if fcntl is not None:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise LogInUse(
            errno.EBUSY, f"{path}: another recorder is writing this log right now", str(path)
        ) from None
    except BaseException:
        os.close(fd)
        raise
    return os.fdopen(fd, "r+b")


class LogRecorder:
    """Writes a run's events to a log file, from a bus (``attach``) or directly (``write``).

    An event it cannot encode is recorded as an ``EventPlaceholder`` (counted in
    ``placeholders``).

    Args:
        path: the log; a ``.jsonl`` name makes it JSON Lines, any other msgpack.
        run_id: the run's id, for the header.
        created: the header's creation time (wall clock, Unix seconds); now by
            default.
        format: ``"msgpack"`` or ``"jsonl"``, when not the one the name says.
        fsync: when to make the file durable: ``"checkpoint"`` (at every
            ``CheckpointSaved``), ``"batch"`` (at every write) or ``"never"``.
        batch_bytes: write the buffer out once it holds this many bytes.
        flush_interval: write it out once this many seconds have passed since
            the last write (checked on direct writes and at an attached bus's ticks).
        event_types: more type tags and their modules for the header (those of
            a log being converted, say), beside every event type defined so far.
        append: continue the log at ``path``, as a resumed run does: its header
            stays, a torn last record is cut off with a warning, and ``appended``
            says what the log held (``None`` for a missing or empty file: a new
            log). A log of another run, or one this library cannot continue,
            raises ``ValueError`` or ``LogError`` and is left as it was.
        overwrite: replace a file already at ``path`` (when not appending);
            with ``False``, a file there raises ``FileExistsError``.

    Another recorder writing the log, in this process or another, raises ``LogInUse``.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        run_id: str = "",
        created: float | None = None,
        format: LogFormat | None = None,
        fsync: FsyncPolicy = "checkpoint",
        batch_bytes: int = 256 * 1024,
        flush_interval: float = 1.0,
        event_types: Mapping[str, str] | None = None,
        append: bool = False,
        overwrite: bool = True,
    ) -> None:
        if fsync not in ("never", "checkpoint", "batch"):
            raise ValueError(f"fsync must be 'never', 'checkpoint' or 'batch', got {fsync!r}")
        self.batch_bytes = checked("batch_bytes", batch_bytes, Count)
        self.flush_interval = checked("flush_interval", flush_interval, WaitSeconds)
        self.path = Path(path)
        self.format: LogFormat = format or format_for_path(self.path)
        if self.format not in ("msgpack", "jsonl"):
            raise ValueError(f"format must be 'msgpack' or 'jsonl', got {self.format!r}")
        #: What an appended-to log held (``append=True`` on an existing log), else None.
        self.appended: LogTail | None = None
        self.fsync: FsyncPolicy = fsync
        self.placeholders = 0
        modules = {**(event_types or {}), **event_modules()}
        self.header = LogHeader(
            run_id=run_id,
            created=time.time() if created is None else created,
            event_types=modules,
        )
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file: BinaryIO = _open_locked(self.path, new=not (append or overwrite))
        try:
            start = self._continue(run_id, format) if append else None
            if start is None:
                if stat.S_ISREG(os.fstat(self._file.fileno()).st_mode):
                    self._file.truncate(0)
                start = encode_header(self.header, self.format)
        except BaseException:
            self._file.close()
            raise
        self._buffer = bytearray(start)
        self._last_flush = time.monotonic()
        self._detach: list[Callable[[], None]] = []
        #: Framed records into the buffer: what an attached bus's tap calls per batch.
        self.record_many: Callable[[Iterable[Event]], None] = (
            self._msgpack_recorder() if self.format == "msgpack" else self._jsonl_recorder()
        )
        self.flush()  # the header

    # --- appending ----------------------------------------------------------------

    def _continue(self, run_id: str, format: LogFormat | None) -> bytes | None:
        """Continue the log open (and locked) in ``_file``, checked before anything is
        written; the bytes to write first, or ``None`` for an empty file (no log)."""
        file = self._file
        end = file.seek(0, os.SEEK_END)
        if end == 0:
            return None
        try:
            reader = LogReader(self.path, skip_corrupt=True)
        except LogFormatError as exc:
            raise LogFormatError(f"{exc}; cannot append to it") from None
        with reader:
            found = reader.header
            if found.format_version != LOG_FORMAT_VERSION or found.schema_version != SCHEMA_VERSION:
                raise LogFormatError(
                    f"{self.path}: cannot append to a log of format version "
                    f"{found.format_version}, schema {found.schema_version} (this eventbus "
                    f"writes {LOG_FORMAT_VERSION}, schema {SCHEMA_VERSION}); "
                    "convert it first (eventbus convert)"
                )
            if format is not None and format != reader.format:
                raise ValueError(
                    f"{self.path}: cannot append {format} records to a {reader.format} log"
                )
            if run_id and found.run_id and run_id != found.run_id:
                raise RunIdMismatch(
                    f"{self.path}: the log is run {found.run_id!r}'s, "
                    f"not run {run_id!r}'s: not appending to it"
                )
            tail = scan_tail(reader)
            torn = reader.truncated
        if torn is not None:
            file.truncate(torn.offset)
            tail = msgspec.structs.replace(tail, dropped_bytes=end - torn.offset)
            end = file.seek(torn.offset)
            _log.warning(
                "torn last record cut off before appending to the log",
                path=str(self.path),
                offset=torn.offset,
                dropped_bytes=tail.dropped_bytes,
            )
        start = b""
        if reader.format == "jsonl" and end > reader.data_offset:
            file.seek(end - 1)
            if file.read(1) != b"\n":  # a last line kept without its newline
                start = b"\n"
            file.seek(end)
        self.format = reader.format
        self.header = found
        self.appended = tail
        return start

    # --- recording ------------------------------------------------------------

    # The hot path: closures over locals, a batch at a time, the fewest calls measured
    # (``benchmarks/bench_log.py``).

    def _msgpack_recorder(self) -> Callable[[Iterable[Event]], None]:
        buffer = self._buffer
        extend = buffer.extend
        scratch = bytearray()  # each payload is encoded here, then appended whole
        encode_into = msgspec.msgpack.Encoder().encode_into
        pack = RECORD_HEADER.pack
        crc32 = zlib.crc32
        mark = RECORD_MARK_VALUE
        max_record = MAX_RECORD
        limit = self.batch_bytes
        flush = self.flush
        substitute = self._substitute

        def record_many(events: Iterable[Event]) -> None:
            for event in events:
                try:
                    encode_into(event, scratch)
                    size = len(scratch)
                    if size > max_record:
                        raise RecordTooLarge(f"{size} bytes, more than {max_record}")
                except Exception as exc:  # whatever encode_into left in scratch is replaced
                    encode_into(substitute(event, exc), scratch)
                    size = len(scratch)
                # ``length_check``, inlined: below 64 KiB (every record but a huge one)
                # the length check is the length.
                check = size if size < 0x10000 else (size ^ size >> 16) & 0xFFFF
                # One extend of the whole record: the buffer never holds half of one.
                extend(pack(mark, check, size, crc32(scratch)) + scratch)
            if len(buffer) >= limit:
                flush()

        return record_many

    def _jsonl_recorder(self) -> Callable[[Iterable[Event]], None]:
        buffer = self._buffer
        encode_into = msgspec.json.Encoder().encode_into
        find = buffer.find
        append = buffer.append
        max_line = MAX_LINE
        limit = self.batch_bytes
        flush = self.flush
        substitute = self._substitute

        def record_many(events: Iterable[Event]) -> None:
            for event in events:
                start = len(buffer)
                try:
                    encode_into(event, buffer, -1)
                    # msgspec writes NaN and ±inf as null: only a line with a null (other
                    # than a None last field's, ``"checkpoint":null}``) may have lost one.
                    at = find(b"null", start)
                    if (
                        at >= 0
                        and (
                            at != len(buffer) - 5
                            or getattr(event, event.__struct_fields__[-1]) is not None
                        )
                        and has_nonfinite(event)
                    ):
                        del buffer[start:]
                        buffer.extend(encode_json_nonfinite(event))
                    if len(buffer) - start > max_line:
                        raise RecordTooLarge(f"{len(buffer) - start} bytes, more than {max_line}")
                    append(10)  # the newline
                except Exception as exc:
                    # encode_into may have left part of the event: roll back to its start.
                    del buffer[start:]
                    buffer.extend(encode_json(substitute(event, exc)) + b"\n")
                except BaseException:  # never half a line in the buffer
                    del buffer[start:]
                    raise
            if len(buffer) >= limit:
                flush()

        return record_many

    def _substitute(self, event: Event, exc: Exception) -> EventPlaceholder:
        """The placeholder recorded for an event that cannot be recorded as itself."""
        placeholder = placeholder_for(event, exc)
        self.placeholders += 1
        if self.placeholders == 1:  # once per recorder: never a log call per event
            _log.warning(
                "event recorded as a placeholder",
                path=str(self.path),
                seq=placeholder.seq,
                event_type=placeholder.event_type,
                reason=placeholder.reason,
            )
        return placeholder

    def write(self, event: Event) -> None:
        """Record one event directly (not through a bus); honours every policy."""
        self.write_many((event,))

    def write_many(self, events: Iterable[Event]) -> None:
        """Record events directly (not through a bus); honours every policy."""
        if self._file.closed:
            raise ValueError(f"{self.path}: the recorder is closed")
        events = events if isinstance(events, list | tuple) else list(events)
        self.record_many(events)
        # ``in`` over ``map(type, ...)`` tests each event's exact type at C speed.
        if self.fsync == "checkpoint" and CheckpointSaved in map(type, events):
            self.flush(fsync=True)
        elif time.monotonic() - self._last_flush >= self.flush_interval:
            self.flush()

    # --- a bus -------------------------------------------------------------------

    def attach(self, bus: EventBus) -> Self:
        """Record every event ``bus`` carries from now on, in sequence order: a tap, it
        gets each batch before any handler does (so the event a handler failed on is in
        the log). Attach before the bus starts to record from its first event."""
        if self._file.closed:
            raise ValueError(f"{self.path}: the recorder is closed")
        self._detach.append(bus.add_tap(self.record_many))
        if self.fsync == "checkpoint":

            async def on_checkpoint(event: CheckpointSaved) -> None:
                # Durable before this checkpoint's snapshot is written (a later stage).
                self.flush()
                if not self._file.closed:
                    await blocking_io(bus, functools.partial(os.fsync, self._file.fileno()))

            sub = bus.subscribe(
                CheckpointSaved,
                on_checkpoint,
                name="eventbus.recorder.fsync",
                order=Stage.RECORD,
            )
            self._detach.append(sub.cancel)
        sub = bus.subscribe(
            HealthCheckTick, self._on_period, name="eventbus.recorder.flush", order=Stage.RECORD
        )
        self._detach.append(sub.cancel)
        return self

    def detach(self) -> None:
        for undo in self._detach:
            undo()
        self._detach.clear()

    def _on_period(self, event: HealthCheckTick) -> None:
        if time.monotonic() - self._last_flush >= self.flush_interval:
            self.flush()

    # --- the file ------------------------------------------------------------------

    def flush(self, *, fsync: bool = False) -> None:
        """Write the buffer out; ``fsync=True`` (or policy ``batch``) makes it durable."""
        if self._file.closed:
            return
        if self._buffer:
            self._file.write(self._buffer)
            self._buffer.clear()
        self._last_flush = time.monotonic()
        self._file.flush()
        if fsync or self.fsync == "batch":
            os.fsync(self._file.fileno())

    def close(self) -> None:
        """Stop recording, write what is buffered and fsync (unless policy ``never``)."""
        if self._file.closed:
            return
        self.detach()
        self.flush(fsync=self.fsync != "never")
        self._file.close()
        if self.placeholders:
            _log.warning(
                "events recorded as placeholders", path=str(self.path), count=self.placeholders
            )

    @property
    def closed(self) -> bool:
        return self._file.closed

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<LogRecorder {str(self.path)!r} {self.format} fsync={self.fsync}>"
