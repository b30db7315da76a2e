"""The log's fast paths do what the slow ones did: batches, big chunks, big records, replay.

``write_log`` hands the recorder batches, the reader decodes straight from a
chunk, the recorder takes a shortcut for the length check of records under
64 KiB, and an instant replay of a file unstamps the events it read in
place. Each path is checked against what it replaced; no timings here
(``benchmarks/bench_log.py`` has them).
"""

from __future__ import annotations

import math
import os
import struct
import zlib
from collections.abc import Iterator
from pathlib import Path

import msgspec
import pytest
from _builders import EventCapture, record_spans, sample_event

from eventbus import (
    CheckpointSaved,
    Event,
    EventBus,
    EventPlaceholder,
    HealthCheckTick,
    Report,
    VirtualClock,
)
from eventbus.log import LogReader, LogRecorder, read_log, replay
from eventbus.log._format import CorruptLogError
from eventbus.testing import write_log


def report(i: int, **fields: object) -> Report:
    values: dict[str, object] = {
        "run_id": "r",
        "rank": i % 4,
        "world_size": 4,
        "index": i // 4,
        "metrics": {"loss": 1.0 / (i + 1), "step": i, "lr": 1e-3, "acc": 0.5},
    }
    values.update(fields)
    return Report(**values)  # type: ignore[arg-type]


class NotACheckpoint(Report, frozen=True, kw_only=True, tag="tests.speed.NotACheckpoint"):
    """A report, not a ``CheckpointSaved``: no fsync for it."""


class SubTick(HealthCheckTick, frozen=True, kw_only=True, tag="tests.speed.SubTick"):
    """A subclass of a bus diagnostic: left out of a replay as its base is."""


def stamped(n: int) -> list[Report]:
    return [report(i, seq=i, time=1.0 + i) for i in range(n)]


# --- write_log: batches ------------------------------------------------------------------


@pytest.mark.parametrize("n", [0, 1, 1023, 1024, 1025, 3000])
def test_write_log_stamps_across_batches_as_one_event_at_a_time_did(tmp_path: Path, n: int) -> None:
    given = [report(i) for i in range(n)]
    path = write_log(tmp_path / "log.evlog", given, start=5.0, interval=0.5)
    events = read_log(path).events
    assert [e.seq for e in events] == list(range(n))
    assert [e.time for e in events] == [5.0 + i * 0.5 for i in range(n)]
    assert all(e.seq == -1 and e.time == 0.0 for e in given)  # the caller's, unchanged


def test_write_log_keeps_what_is_stamped_and_stamps_the_rest(tmp_path: Path) -> None:
    """Mixed batches (the slow path) and stamped ones (passed through) in one log."""
    given: list[Event] = [*stamped(1500)]
    given[1200] = report(1200)  # the second batch holds one unstamped event
    given[1300] = report(1300, seq=77)  # a seq but no time
    given[1400] = report(1400, time=-0.0)  # no time (a zero): stamped, as before
    given[1450] = report(1450, time=math.nan)  # truthy, so kept: a damaged record
    events = read_log(write_log(tmp_path / "log.evlog", given, start=2.0)).events
    assert len(events) == 1500
    assert (events[1200].seq, events[1200].time) == (1200, 2.0 + 1200 * 0.1)
    assert (events[1300].seq, events[1300].time) == (77, 2.0 + 1300 * 0.1)
    assert events[1400].time == 2.0 + 1400 * 0.1
    damaged = events[1450]
    assert isinstance(damaged, EventPlaceholder) and damaged.seq == 1450
    assert "$.time" in damaged.reason
    assert all(a == b for a, b in zip(events[:1200], given[:1200], strict=True))


def test_write_log_from_a_generator_that_fails_keeps_what_came_before(tmp_path: Path) -> None:
    def events() -> Iterator[Report]:
        yield from stamped(1500)
        raise RuntimeError("source broke")

    path = tmp_path / "log.evlog"
    with pytest.raises(RuntimeError, match="source broke"):
        write_log(path, events())
    assert [e.seq for e in read_log(path).events] == list(range(1500))


def test_write_many_finds_a_checkpoint_in_a_batch_and_only_that_type(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    synced: list[int] = []
    real_fsync = os.fsync

    def counting_fsync(fd: int) -> None:
        synced.append(fd)
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", counting_fsync)

    with LogRecorder(tmp_path / "log.evlog") as recorder:
        recorder.write_many([*stamped(3), NotACheckpoint(**msgspec.structs.asdict(report(3)))])
        assert synced == []
        recorder.write_many([*stamped(3), sample_event(CheckpointSaved, seq=9)])
        assert len(synced) == 1


# --- the recorder: one buffer, big records -----------------------------------------------


def test_records_over_64_kib_get_their_full_length_check(tmp_path: Path) -> None:
    """Below 64 KiB the check is the length itself; above it, the folded length."""
    sizes = [10, 65_000, 70_000, 200_000]
    given = [
        report(i, seq=i, time=1.0, metrics={"blob": "x" * size}) for i, size in enumerate(sizes)
    ]
    path = write_log(tmp_path / "log.evlog", given)
    data = path.read_bytes()
    spans = record_spans(data)
    assert len(spans) == len(sizes)
    for start, end in spans:
        mark, check, size, crc = struct.unpack_from("<2sHII", data, start)
        assert mark == b"\xc1\xeb" and end - start - 12 == size
        assert check == (size ^ size >> 16) & 0xFFFF
        assert zlib.crc32(data[start + 12 : end]) == crc
    assert read_log(path).events == given


def test_a_tap_batch_is_framed_record_by_record(tmp_path: Path) -> None:
    """One batch from a bus: each record framed, checksummed and in order."""
    given = stamped(2000)
    path = tmp_path / "log.evlog"
    with LogRecorder(path, batch_bytes=1 << 30) as recorder:
        recorder.record_many(given[:1024])
        recorder.record_many(given[1024:])
    data = path.read_bytes()
    payloads = [data[start + 12 : end] for start, end in record_spans(data)]
    assert payloads == [msgspec.msgpack.encode(e) for e in given]
    assert read_log(path).events == given


# --- the reader: decoding straight from big chunks ---------------------------------------


@pytest.mark.parametrize("chunk_size", [1, 100, 4096, 1 << 20, 1 << 24])
def test_damage_inside_a_big_chunk_is_found_whatever_the_chunk(
    tmp_path: Path, chunk_size: int
) -> None:
    given = stamped(3000)
    path = write_log(tmp_path / "log.evlog", given)
    data = bytearray(path.read_bytes())
    spans = record_spans(bytes(data))
    start, end = spans[1500]
    data[end - 3] ^= 0xFF  # a payload byte of record 1500
    torn = spans[-1][0] + 20  # and the last record cut short
    path.write_bytes(bytes(data[:torn]))
    reader = LogReader(path, chunk_size=chunk_size)
    with pytest.raises(CorruptLogError, match="corrupt record 1500") as error:
        seen = [e.seq for e in reader]
    assert error.value.offset == start and error.value.index == 1500
    with LogReader(path, skip_corrupt=True, chunk_size=chunk_size) as reader:
        seen = [e.seq for e in reader]
    assert seen == [*range(1500), *range(1501, 2999)]
    assert reader.skipped == 1 and reader.count == 2998
    assert reader.truncated is not None and reader.truncated.offset == spans[-1][0]
    assert reader.truncated.index == 2999


def test_a_record_that_is_intact_but_not_an_event_is_a_placeholder_mid_chunk(
    tmp_path: Path,
) -> None:
    path = write_log(tmp_path / "log.evlog", stamped(10))
    data = path.read_bytes()
    spans = record_spans(data)
    alien = msgspec.msgpack.encode({"type": "nobody.Knows", "seq": 99, "time": 1.0})
    frame = struct.pack("<2sHII", b"\xc1\xeb", len(alien), len(alien), zlib.crc32(alien))
    at = spans[5][0]
    path.write_bytes(data[:at] + frame + alien + data[at:])
    contents = read_log(path)
    assert [type(e).__name__ for e in contents.events][4:7] == [
        "Report",
        "EventPlaceholder",
        "Report",
    ]
    assert contents.placeholders == 1 and len(contents.events) == 11


def test_a_reader_is_iterated_once_and_closes_when_iteration_stops(tmp_path: Path) -> None:
    for name in ("log.evlog", "log.jsonl"):
        path = write_log(tmp_path / name, stamped(50))
        reader = LogReader(path)
        events = iter(reader)
        assert next(events).seq == 0
        with pytest.raises(RuntimeError, match="iterated once"):
            iter(reader)
        del events  # stops iterating: the generator is closed, and so is the file
        assert reader._file.closed
        with LogReader(path) as again:
            assert [e.seq for e in again] == list(range(50))
            assert again.count == 50
        assert again._file.closed


# --- replay: events read from a file are unstamped in place ------------------------------


@pytest.mark.anyio
async def test_a_replay_of_given_events_leaves_them_as_they_were(tmp_path: Path) -> None:
    given = stamped(100)
    capture = EventCapture()
    async with EventBus(clock=VirtualClock(0.0)) as bus:
        bus.subscribe(Report, capture)
        summary = await replay(bus, given)
    assert summary.replayed == 100
    assert [e.seq for e in given] == list(range(100))  # the caller's events: copied
    assert [e.index for e in capture.of_type(Report)] == [e.index for e in given]


@pytest.mark.anyio
async def test_a_replay_of_a_file_delivers_every_event_and_leaves_out_the_rest(
    tmp_path: Path,
) -> None:
    tick = sample_event(HealthCheckTick, seq=3, time=3.5)
    sub_tick = SubTick(**msgspec.structs.asdict(sample_event(HealthCheckTick, seq=5, time=5.5)))
    placeholder = sample_event(EventPlaceholder, seq=6, time=0.0)
    events: list[Event] = [*stamped(3), tick, report(4, seq=4, time=5.0), sub_tick, placeholder]
    events += [report(i, seq=i, time=1.0 + i) for i in range(7, 2000)]
    path = write_log(tmp_path / "log.evlog", events)
    capture = EventCapture()
    async with EventBus(clock=VirtualClock(0.0), period=10_000.0) as bus:
        bus.subscribe(Event, capture)
        summary = await replay(bus, path)
    reports = capture.of_type(Report)
    assert [r.index for r in reports] == [e.index for e in events if type(e) is Report]
    assert summary.replayed == len(reports) and summary.filtered == 2
    assert summary.placeholders == 1
    assert not [e for e in capture.of_type(HealthCheckTick) if e.time in (3.5, 5.5)]
    assert [r.seq for r in reports] == sorted(r.seq for r in reports)  # stamped by the bus
