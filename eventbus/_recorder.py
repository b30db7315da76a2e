"""Recording events to a log file, from a bus or written directly.

Cheap on the bus's hot path: one reused msgspec encoder writes each record
straight into a ``bytearray`` (``encode_into``), and the buffer goes to the
file in batches. Durability is a policy: ``fsync="checkpoint"`` (the default)
makes the log durable at every ``CheckpointSaved``, so after a crash the log
reaches at least as far as the checkpoint a resumed run starts from.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from types import TracebackType
from typing import Literal, Self

import msgspec

from ._bus import EventBus
from ._events import CheckpointSaved, Event, HealthCheckTick
from ._logformat import RECORD_LENGTH, LogFormat, LogHeader, encode_header, format_for_path

__all__ = ["FsyncPolicy", "LogRecorder"]

FsyncPolicy = Literal["never", "checkpoint", "batch"]

#: The recorder's own handlers (fsync at checkpoints, flush each period) run
#: before every other handler of their event.
RECORDER_ORDER = -sys.maxsize


class LogRecorder:
    """Writes events to ``path`` (msgpack, or JSON Lines for a ``.jsonl`` name).

    ``attach(bus)`` records everything the bus carries, diagnostics included,
    in sequence order; ``write(event)`` records directly. The buffer goes to
    the file when it holds ``batch_bytes``, when ``flush_interval`` seconds
    passed since the last flush (checked on direct writes, and at every
    health-check period of an attached bus), and on ``close``. ``fsync``:
    ``never``, ``checkpoint`` (at every ``CheckpointSaved``) or ``batch``
    (every flush). The file is replaced if it exists. ``run_id`` and
    ``created`` (wall time; now by default) go to the header.
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
    ) -> None:
        if fsync not in ("never", "checkpoint", "batch"):
            raise ValueError(f"fsync must be 'never', 'checkpoint' or 'batch', got {fsync!r}")
        if batch_bytes < 1 or flush_interval < 0:
            raise ValueError("batch_bytes must be positive and flush_interval not negative")
        self.path = Path(path)
        self.format: LogFormat = format or format_for_path(self.path)
        if self.format not in ("msgpack", "jsonl"):
            raise ValueError(f"format must be 'msgpack' or 'jsonl', got {self.format!r}")
        self.fsync: FsyncPolicy = fsync
        self.batch_bytes = batch_bytes
        self.flush_interval = flush_interval
        self.header = LogHeader(run_id=run_id, created=time.time() if created is None else created)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = open(self.path, "wb")  # noqa: SIM115 (closed by close())
        self._buffer = bytearray(encode_header(self.header, self.format))
        self._last_flush = time.monotonic()
        self._detach: list[Callable[[], None]] = []
        #: Framed records into the buffer: what an attached bus's tap calls per batch.
        self.record_many: Callable[[Iterable[Event]], None] = (
            self._msgpack_recorder() if self.format == "msgpack" else self._jsonl_recorder()
        )
        self._flush_file()

    # --- recording ------------------------------------------------------------

    # Closures over locals: on the hot path each attribute lookup saved is ~5% of a record.
    # A batch at a time: the bus hands the recorder whole batches (it is a tap).

    def _msgpack_recorder(self) -> Callable[[Iterable[Event]], None]:
        buffer = self._buffer
        encode_into = msgspec.msgpack.Encoder().encode_into
        pack_into = RECORD_LENGTH.pack_into
        limit = self.batch_bytes
        flush = self.flush

        def record_many(events: Iterable[Event]) -> None:
            for event in events:
                # Encoding past the end leaves room for the length prefix; cheaper than
                # extending first (msgspec trims the buffer after every encode_into).
                start = len(buffer)
                encode_into(event, buffer, start + 4)
                pack_into(buffer, start, len(buffer) - start - 4)
            if len(buffer) >= limit:
                flush()

        return record_many

    def _jsonl_recorder(self) -> Callable[[Iterable[Event]], None]:
        buffer = self._buffer
        extend = buffer.extend
        encode_into = msgspec.json.Encoder().encode_into
        limit = self.batch_bytes
        flush = self.flush

        def record_many(events: Iterable[Event]) -> None:
            for event in events:
                encode_into(event, buffer, -1)
                extend(b"\n")
            if len(buffer) >= limit:
                flush()

        return record_many

    def record(self, event: Event) -> None:
        """One framed record into the buffer (no flush or fsync policy: see ``write``)."""
        self.record_many((event,))

    def write(self, event: Event) -> None:
        """Record one event directly (not through a bus); honours every policy."""
        if self._file.closed:
            raise ValueError(f"{self.path}: the recorder is closed")
        self.record(event)
        if self.fsync == "checkpoint" and isinstance(event, CheckpointSaved):
            self.flush(fsync=True)
        elif time.monotonic() - self._last_flush >= self.flush_interval:
            self.flush()

    def write_many(self, events: Iterable[Event]) -> None:
        for event in events:
            self.write(event)

    # --- a bus -------------------------------------------------------------------

    def attach(self, bus: EventBus) -> Self:
        """Record every event ``bus`` carries from now on, in sequence order.

        The recorder is a tap of the bus: it gets each batch before any
        handler does, so every event is in the log before a handler acts on
        it (the event that made a handler fail the run is recorded), and it
        costs one call per batch, with no per-event timing. Attach before the
        bus starts to record from its first event.
        """
        if self._file.closed:
            raise ValueError(f"{self.path}: the recorder is closed")
        self._detach.append(bus.add_tap(self.record_many))
        if self.fsync == "checkpoint":
            sub = bus.subscribe(
                CheckpointSaved,
                self._on_checkpoint,
                name="eventbus.recorder.fsync",
                order=RECORDER_ORDER,
            )
            self._detach.append(sub.cancel)
        sub = bus.subscribe(
            HealthCheckTick, self._on_period, name="eventbus.recorder.flush", order=RECORDER_ORDER
        )
        self._detach.append(sub.cancel)
        return self

    def detach(self) -> None:
        for undo in self._detach:
            undo()
        self._detach.clear()

    def _on_checkpoint(self, event: CheckpointSaved) -> None:
        self.flush(fsync=True)

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

    def _flush_file(self) -> None:
        self._file.write(self._buffer)
        self._buffer.clear()
        self._file.flush()

    def close(self) -> None:
        """Stop recording, write what is buffered and fsync (unless policy ``never``)."""
        if self._file.closed:
            return
        self.detach()
        self.flush(fsync=self.fsync != "never")
        self._file.close()

    @property
    def closed(self) -> bool:
        return self._file.closed

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
        return f"<LogRecorder {str(self.path)!r} {self.format} fsync={self.fsync}>"
