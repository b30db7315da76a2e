"""Event logs: format round trip, torn tails, corruption, versions, the recorder."""

from __future__ import annotations

import os
import struct
from pathlib import Path

import msgspec
import pytest
from _builders import sample_event
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from eventbus import (
    CheckpointSaved,
    Event,
    EventBus,
    EventFilter,
    HandlerFailed,
    Report,
    RunStarted,
    VirtualClock,
    WorkerFailure,
)
from eventbus._events import SCHEMA_VERSION, event_types
from eventbus.log import LogError, LogReader, LogRecorder, read_log
from eventbus.log._format import LOG_MAGIC, CorruptLogError, LogFormatError
from eventbus.testing import report_rounds, write_log

FORMATS = ["log.evlog", "log.jsonl"]


def every_event() -> list[Event]:
    return [
        msgspec.structs.replace(sample_event(cls), seq=i, time=10.0 + i / 8)
        for i, cls in enumerate(event_types())
    ]


def record_boundaries(path: Path) -> tuple[int, list[int]]:
    """Header size and the byte offset where each record starts (and the end).

    Format version 2: a 12-byte record header whose payload length is at byte 4.
    """
    data = path.read_bytes()
    if path.suffix == ".jsonl":
        offsets = [i + 1 for i, b in enumerate(data) if b == ord("\n")]
        return offsets[0], offsets
    header = 16 + struct.unpack_from("<I", data, 12)[0]
    offsets = [header]
    while offsets[-1] < len(data):
        offsets.append(offsets[-1] + 12 + struct.unpack_from("<I", data, offsets[-1] + 4)[0])
    return header, offsets


@pytest.mark.parametrize("name", FORMATS)
def test_every_event_type_round_trips(tmp_path: Path, name: str) -> None:
    events = every_event()
    assert {type(e) for e in events} >= {Report, WorkerFailure, HandlerFailed, RunStarted}
    path = write_log(tmp_path / name, events, run_id="run-7")
    contents = read_log(path)
    assert contents.events == events
    assert contents.truncated is None
    assert contents.header.run_id == "run-7"
    assert contents.header.schema_version == SCHEMA_VERSION
    assert contents.header.created > 0


def test_format_follows_extension_or_argument(tmp_path: Path) -> None:
    events = report_rounds(2)
    assert write_log(tmp_path / "a.evlog", events).read_bytes().startswith(LOG_MAGIC)
    assert write_log(tmp_path / "b.jsonl", events).read_bytes().startswith(b'{"eventbus_log":2')
    forced = write_log(tmp_path / "c.log", events, format="jsonl")
    with LogReader(forced) as reader:
        assert reader.format == "jsonl"
        assert len(list(reader)) == 4


@pytest.mark.parametrize("name", FORMATS)
def test_truncation_at_every_byte_keeps_every_complete_record(tmp_path: Path, name: str) -> None:
    events = [*report_rounds(2), sample_event(CheckpointSaved), sample_event(WorkerFailure)]
    path = write_log(tmp_path / name, events)
    data = path.read_bytes()
    header, boundaries = record_boundaries(path)
    cut = tmp_path / ("cut" + path.suffix)
    # A JSON line is whole without its newline (a hand-edited file may lack the last one).
    ends = [b - 1 for b in boundaries[1:]] if name.endswith(".jsonl") else boundaries[1:]
    for size in range(len(data)):
        cut.write_bytes(data[:size])
        if size < header:
            with pytest.raises(LogFormatError):
                read_log(cut)
            continue
        contents = read_log(cut)
        complete = sum(1 for end in ends if end <= size)
        assert len(contents.events) == complete, size
        assert [e.seq for e in contents.events] == list(range(complete))
        start = boundaries[complete]
        if size in (start, ends[complete - 1]):
            assert contents.truncated is None
        else:
            assert contents.truncated is not None, size
            assert contents.truncated.offset == start
            assert contents.truncated.index == complete
            assert contents.truncated.size == size - start


def test_corrupt_record_names_offset_and_index_or_is_skipped(tmp_path: Path) -> None:
    path = write_log(tmp_path / "log.evlog", report_rounds(3))
    _, boundaries = record_boundaries(path)
    data = bytearray(path.read_bytes())
    data[boundaries[2] + 12 : boundaries[3]] = b"\xc1" * (boundaries[3] - boundaries[2] - 12)
    path.write_bytes(bytes(data))
    with pytest.raises(CorruptLogError) as caught:
        read_log(path)
    assert (caught.value.offset, caught.value.index) == (boundaries[2], 2)
    assert f"record 2 at byte {boundaries[2]}" in str(caught.value)
    with LogReader(path, skip_corrupt=True) as reader:
        seqs = [e.seq for e in reader]
    assert seqs == [0, 1, 3, 4, 5]
    assert reader.skipped == 1 and reader.errors[0].index == 2


def test_corrupt_jsonl_line_and_blank_lines(tmp_path: Path) -> None:
    path = write_log(tmp_path / "log.jsonl", report_rounds(2))
    lines = path.read_bytes().splitlines(keepends=True)
    lines.insert(2, b"\n")
    lines[3] = b'{"type":"Report","seq":"oops"\n'  # not JSON (a well-formed object would be
    path.write_bytes(b"".join(lines))  # an intact record: a placeholder, in format version 2)
    offset = sum(len(line) for line in lines[:3])
    with pytest.raises(CorruptLogError) as caught:
        read_log(path)
    assert (caught.value.offset, caught.value.index) == (offset, 1)
    contents = read_log(path, skip_corrupt=True)
    assert [e.seq for e in contents.events] == [0, 2, 3]
    assert contents.skipped == 1


def test_last_jsonl_line_without_newline_is_kept_when_complete(tmp_path: Path) -> None:
    path = write_log(tmp_path / "log.jsonl", report_rounds(1))
    path.write_bytes(path.read_bytes().rstrip(b"\n"))
    contents = read_log(path)
    assert len(contents.events) == 2 and contents.truncated is None


def test_implausible_length_is_corruption_that_skipping_gets_past(tmp_path: Path) -> None:
    path = write_log(tmp_path / "log.evlog", report_rounds(2))
    _, boundaries = record_boundaries(path)
    data = bytearray(path.read_bytes())
    struct.pack_into("<I", data, boundaries[1] + 4, 0xFFFFFFFF)
    path.write_bytes(bytes(data))
    with pytest.raises(CorruptLogError, match="length 4294967295 fails its check") as caught:
        read_log(path)
    assert (caught.value.offset, caught.value.index) == (boundaries[1], 1)
    contents = read_log(path, skip_corrupt=True)
    assert [e.seq for e in contents.events] == [0, 2, 3]
    assert contents.skipped == 1 and contents.truncated is None


def test_newer_schema_is_refused_older_is_read(tmp_path: Path) -> None:
    path = write_log(tmp_path / "log.evlog", report_rounds(1))
    data = bytearray(path.read_bytes())
    struct.pack_into("<H", data, 10, SCHEMA_VERSION + 1)
    path.write_bytes(bytes(data))
    with pytest.raises(LogFormatError, match="newer than this eventbus"):
        LogReader(path)
    struct.pack_into("<H", data, 10, SCHEMA_VERSION - 1)
    path.write_bytes(bytes(data))
    contents = read_log(path)
    assert contents.header.schema_version == SCHEMA_VERSION - 1
    assert len(contents.events) == 2

    jsonl = write_log(tmp_path / "log.jsonl", report_rounds(1))
    text = jsonl.read_text().replace(
        f'"schema_version":{SCHEMA_VERSION}', f'"schema_version":{SCHEMA_VERSION + 1}'
    )
    jsonl.write_text(text)
    with pytest.raises(LogFormatError, match="newer"):
        LogReader(jsonl)


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"", "empty file"),
        (b"hello world\n", "not an event log"),
        (b'{"no_marker": 1}\n', "not an event-log header"),
        (LOG_MAGIC[:5], "truncated log header"),
    ],
)
def test_not_a_log(tmp_path: Path, content: bytes, message: str) -> None:
    path = tmp_path / "x.evlog"
    path.write_bytes(content)
    with pytest.raises(LogFormatError, match=message):
        LogReader(path)


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    name=st.sampled_from(FORMATS),
    edits=st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 255)), min_size=1, max_size=6),
    cut=st.one_of(st.none(), st.integers(0, 10_000)),
)
def test_random_corruption_only_raises_documented_errors(
    tmp_path: Path, name: str, edits: list[tuple[int, int]], cut: int | None
) -> None:
    path = tmp_path / name
    write_log(path, [*report_rounds(3), sample_event(WorkerFailure)])
    data = bytearray(path.read_bytes())
    for position, value in edits:
        data[position % len(data)] = value
    if cut is not None:
        data = data[: cut % (len(data) + 1)]
    path.write_bytes(bytes(data))
    for skip in (False, True):
        try:
            contents = read_log(path, skip_corrupt=skip)
        except LogError:
            continue
        assert all(isinstance(e, Event) for e in contents.events)


# --- the recorder ------------------------------------------------------------------------


@pytest.mark.anyio
@pytest.mark.parametrize("name", FORMATS)
async def test_recorder_attached_to_a_bus_records_everything_in_order(
    tmp_path: Path, name: str
) -> None:
    clock = VirtualClock(50.0)
    seen: list[Event] = []

    def failing(event: Report) -> None:
        if event.index == 1:
            raise RuntimeError("boom")

    with LogRecorder(tmp_path / name, run_id="r") as recorder:
        async with EventBus(clock=clock, period=1.0) as bus:
            recorder.attach(bus)
            bus.subscribe(Event, seen.append)
            bus.subscribe(Report, failing)
            for event in report_rounds(3, world_size=1):
                await bus.publish(event)
                await bus.wait_idle()
                clock.advance(0.4)
    contents = read_log(tmp_path / name)
    assert contents.events == seen
    assert [e.seq for e in contents.events] == list(range(len(seen)))
    types = [type(e).__name__ for e in contents.events]
    assert "HandlerFailed" in types and "HealthCheckTick" in types and "BudgetReport" in types


@pytest.mark.anyio
async def test_recorder_runs_before_the_other_handlers(tmp_path: Path) -> None:
    sizes: list[int] = []
    path = tmp_path / "log.evlog"
    with LogRecorder(path, batch_bytes=1) as recorder:  # every record goes out at once
        async with EventBus(clock=VirtualClock()) as bus:
            bus.subscribe(Report, lambda e: sizes.append(path.stat().st_size), order=-1000)
            recorder.attach(bus)
            await bus.publish(report_rounds(1, world_size=1)[0])
    _, boundaries = record_boundaries(path)
    assert sizes == [boundaries[1]]


def test_fsync_policies(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    synced: list[int] = []
    real_fsync = os.fsync

    def counting_fsync(fd: int) -> None:
        synced.append(fd)
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", counting_fsync)
    events = [*report_rounds(2), sample_event(CheckpointSaved, seq=9), *report_rounds(1)]

    def run(policy: str) -> int:
        synced.clear()
        with LogRecorder(tmp_path / f"{policy}.evlog", fsync=policy, batch_bytes=200) as rec:  # type: ignore[arg-type]
            rec.write_many(events)
            during = len(synced)
        assert len(read_log(tmp_path / f"{policy}.evlog").events) == len(events)
        return during

    assert run("never") == 0 and synced == []
    assert run("checkpoint") == 1 and len(synced) == 2  # the checkpoint, then close
    assert run("batch") >= 2


def test_batches_reach_the_file_before_close(tmp_path: Path) -> None:
    path = tmp_path / "log.evlog"
    with LogRecorder(path, batch_bytes=10_000, flush_interval=3600) as recorder:
        header_size = path.stat().st_size
        recorder.write_many(report_rounds(2))
        assert path.stat().st_size == header_size  # buffered
        recorder.write_many(report_rounds(200))
        assert path.stat().st_size > 10_000  # flushed by size
        recorder.flush()
        assert len(read_log(path).events) == 404
    assert recorder.closed
    with pytest.raises(ValueError, match="closed"):
        recorder.write(report_rounds(1)[0])


def test_flush_interval_on_direct_writes(tmp_path: Path) -> None:
    path = tmp_path / "log.evlog"
    with LogRecorder(path, flush_interval=0.0) as recorder:
        recorder.write(report_rounds(1)[0])
        assert len(read_log(path).events) == 1


def test_event_filter() -> None:
    events: list[Event] = [
        msgspec.structs.replace(e, seq=i) for i, e in enumerate(report_rounds(2, world_size=2))
    ]
    events.append(sample_event(CheckpointSaved, seq=4))
    keep = EventFilter.of(types=[Report], ranks=[1], from_seq=1, to_seq=2)
    assert [e.seq for e in events if keep(e)] == [1]
    assert [e.seq for e in events if EventFilter(types=("Event",))(e)] == [0, 1, 2, 3, 4]
    assert [e.seq for e in events if EventFilter(ranks=(0,))(e)] == [0, 2]
    with pytest.raises(ValueError, match="unknown event type 'Nope'"):
        EventFilter(types=("Nope",))
