"""Event logs against hostile values and hostile files.

Nothing a metric value can hold stops the recorder (it records a placeholder
and goes on); nothing the recorder wrote is unreadable (an intact record
that does not decode as its type is a placeholder); NaN and ±inf survive
every format; damage costs only the records it hit; no file makes a reader
recurse, allocate or work without bound; a log names (or, for this
library's own packages, imports) the modules its event types come from.
"""

from __future__ import annotations

import json
import math
import struct
import subprocess
import sys
import textwrap
import threading
import tracemalloc
import zlib
from pathlib import Path
from typing import Any

import msgspec
import pytest
from _builders import EventCapture, nested_dict, record_spans
from msgspec.structs import replace

import eventbus.log._format
import eventbus.log._reader
import eventbus.log._recorder
from eventbus import (
    Event,
    EventBus,
    EventPlaceholder,
    HealthCheckTick,
    Report,
    RunFinished,
    VirtualClock,
)
from eventbus._codec import decode_json, decode_msgpack, encode_json, encode_msgpack
from eventbus._events import SCHEMA_VERSION
from eventbus.log import LogReader, LogRecorder, read_log
from eventbus.log._format import LOG_MAGIC, CorruptLogError, LogFormatError
from eventbus.testing import replay_log, write_log

FORMATS = ["log.evlog", "log.jsonl"]


DEFAULT: Any = object()


def report(seq: int, metrics: Any = DEFAULT, **fields: Any) -> Report:
    """Report ``seq`` (at time ``10 + seq``); ``metrics`` may be anything, ``None`` too."""
    values: dict[str, Any] = {
        "run_id": "r",
        "rank": 0,
        "world_size": 1,
        "index": seq,
        "metrics": {"loss": 1.0 / (seq + 1)} if metrics is DEFAULT else metrics,
        "seq": seq,
        "time": 10.0 + seq,
    }
    values.update(fields)
    return Report(**values)


def depth_of(value: Any) -> int:
    """How deep ``nested_dict(n)`` nests (counted without recursing)."""
    n = 0
    while isinstance(value, dict) and "a" in value:
        value, n = value["a"], n + 1
    return n


def same(a: Event, b: Event) -> bool:
    """Equal, NaN included (msgpack keeps every float bit for bit; JSON for big ints)."""
    try:
        return encode_msgpack(a) == encode_msgpack(b)
    except OverflowError:
        return encode_json(a) == encode_json(b)


def frame(payload: bytes) -> bytes:
    """A format-version-2 record: marker, length check, length, CRC-32, payload."""
    size = len(payload)
    check = (size ^ size >> 16) & 0xFFFF
    return struct.pack("<2sHII", b"\xc1\xeb", check, size, zlib.crc32(payload)) + payload


def records(path: Path) -> list[tuple[int, int]]:
    """(start, end) of each record of a version-2 msgpack log."""
    return record_spans(path.read_bytes())


def v1_log(path: Path, payloads: list[bytes]) -> Path:
    """A log of format version 1 (a bare length before each record), never released."""
    meta = msgspec.msgpack.encode({"run_id": "v1", "created": 1.0, "writer": "train-eventbus"})
    data = struct.pack("<8sHHI", LOG_MAGIC, 1, SCHEMA_VERSION, len(meta)) + meta
    for payload in payloads:
        data += struct.pack("<I", len(payload)) + payload
    path.write_bytes(data)
    return path


class Opaque:
    """A value no encoder takes."""


class BadRepr:
    """A value no encoder takes, whose ``repr`` fails too."""

    def __repr__(self) -> str:
        raise RuntimeError("no repr for you")


# --- (7) the recorder never dies on a value -------------------------------------------------

UNENCODABLE: dict[str, Any] = {
    "path": Path("/tmp/x"),
    "object": Opaque(),
    "bad repr": BadRepr(),
    "deep": nested_dict(5000),
    "lone surrogate": "\udc80",
}


@pytest.mark.parametrize("name", FORMATS)
@pytest.mark.parametrize("kind", sorted(UNENCODABLE))
def test_an_unencodable_value_is_recorded_as_a_placeholder_and_the_log_goes_on(
    tmp_path: Path, name: str, kind: str
) -> None:
    path = tmp_path / name
    with LogRecorder(path) as recorder:
        recorder.write(report(0))
        recorder.write(report(1, {"value": UNENCODABLE[kind], "loss": 0.5}))
        recorder.write(report(2))
    assert recorder.placeholders == 1
    with LogReader(path) as reader:
        events = list(reader)
    assert [e.seq for e in events] == [0, 1, 2]
    assert same(events[0], report(0)) and same(events[2], report(2))
    placeholder = events[1]
    assert isinstance(placeholder, EventPlaceholder)
    assert (placeholder.event_type, placeholder.time) == ("Report", 11.0)
    assert placeholder.reason.startswith("not encodable: ")
    assert "Report(seq=1" in placeholder.text and len(placeholder.text) <= 4097
    # The recorder's placeholders are records like any other: none made while reading.
    assert reader.placeholders == 0 and reader.skipped == 0 and reader.truncated is None


def test_a_key_json_cannot_hold_is_a_placeholder_either_way(tmp_path: Path) -> None:
    """msgpack holds a tuple key (the reader makes the placeholder), JSON does not
    (the recorder does): the same event, readable to the end in both."""
    for name in FORMATS:
        with LogRecorder(tmp_path / name) as recorder:
            recorder.write_many([report(0, {(1, 2): 3}), report(1)])
        assert recorder.placeholders == (1 if name.endswith(".jsonl") else 0)
        with LogReader(tmp_path / name) as reader:
            events = list(reader)
        assert isinstance(events[0], EventPlaceholder) and isinstance(events[1], Report)
        assert reader.placeholders == (0 if name.endswith(".jsonl") else 1)
        assert "(1, 2): 3" in events[0].text


def test_an_int_beyond_64_bits_is_a_placeholder_in_msgpack_and_kept_in_json(
    tmp_path: Path,
) -> None:
    big = {"big": 2**70, "small": -(2**65)}
    for name in FORMATS:
        with LogRecorder(tmp_path / name) as recorder:
            recorder.write_many([report(0, big), report(1)])
    packed = read_log(tmp_path / "log.evlog").events
    assert isinstance(packed[0], EventPlaceholder) and "OverflowError" in packed[0].reason
    assert "1180591620717411303424" in packed[0].text
    lines = read_log(tmp_path / "log.jsonl").events
    assert isinstance(lines[0], Report) and lines[0].metrics == big
    assert [e.seq for e in packed] == [e.seq for e in lines] == [0, 1]


@pytest.mark.parametrize("name", FORMATS)
def test_a_record_larger_than_a_reader_accepts_is_a_placeholder(
    tmp_path: Path, name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(eventbus.log._recorder, "MAX_RECORD", 1000)
    monkeypatch.setattr(eventbus.log._recorder, "MAX_LINE", 1000)
    path = tmp_path / name
    with LogRecorder(path) as recorder:
        recorder.write_many([report(0), report(1, {"text": "x" * 5000}), report(2)])
    events = read_log(path).events
    assert [type(e).__name__ for e in events] == ["Report", "EventPlaceholder", "Report"]
    placeholder = events[1]
    assert isinstance(placeholder, EventPlaceholder)
    assert "RecordTooLarge" in placeholder.reason and "more than 1000" in placeholder.reason
    assert len(placeholder.text) <= 4097


def test_a_record_over_the_real_max_record_is_a_placeholder(tmp_path: Path) -> None:
    """The limit the reader enforces (64 MiB), not a lowered one."""
    path = tmp_path / "big.evlog"
    blob = b"\0" * (eventbus.log._format.MAX_RECORD + 1)
    with LogRecorder(path) as recorder:
        recorder.write_many([report(0), report(1, {"blob": blob}), report(2)])
    del blob
    events = read_log(path).events
    assert [e.seq for e in events] == [0, 1, 2]
    assert isinstance(events[1], EventPlaceholder) and "RecordTooLarge" in events[1].reason
    assert path.stat().st_size < 100_000


def test_a_failed_encoding_leaves_nothing_of_the_event_in_the_buffer(tmp_path: Path) -> None:
    """msgspec's ``encode_into`` writes a JSON prefix before it fails: rolled back."""
    path = tmp_path / "log.jsonl"
    with LogRecorder(path) as recorder:
        recorder.write(report(0, {"first": 1, "second": Opaque(), "third": 3}))
        recorder.write(report(1))
    lines = path.read_bytes().splitlines()
    assert len(lines) == 3  # header and two events, nothing half-written
    assert json.loads(lines[1])["type"] == "EventPlaceholder"
    assert b'"first":1,' not in lines[1]


def test_placeholder_text_is_bounded_for_huge_and_cyclic_values(tmp_path: Path) -> None:
    cyclic: dict[str, Any] = {"path": Path("/x")}
    cyclic["self"] = cyclic
    huge = {"text": "y" * 10_000_000, "many": list(range(1_000_000)), "p": Path("/x")}
    with LogRecorder(tmp_path / "log.evlog") as recorder:
        recorder.write_many([report(0, cyclic), report(1, huge), report(2, {"i": 10**5000})])
    events = read_log(tmp_path / "log.evlog").events
    assert all(isinstance(e, EventPlaceholder) for e in events)
    for event in events:
        assert isinstance(event, EventPlaceholder)
        assert len(event.text) <= 4097 and len(event.reason) <= 1024
    first, _, last = events
    assert isinstance(first, EventPlaceholder) and isinstance(last, EventPlaceholder)
    assert "…" in first.text and "<int of 16610 bits>" in last.text


@pytest.mark.anyio
@pytest.mark.parametrize("name", FORMATS)
async def test_a_bus_tap_recorder_survives_bad_events_and_records_to_the_end(
    tmp_path: Path, name: str
) -> None:
    path = tmp_path / name
    clock = VirtualClock(100.0)
    seen: list[Event] = []
    with LogRecorder(path, run_id="r") as recorder:
        async with EventBus(clock=clock, period=1.0) as bus:
            recorder.attach(bus)
            bus.subscribe(Event, seen.append)
            for i in range(12):
                bad = {
                    0: {"p": Path("/p")},
                    1: nested_dict(3000),
                    2: {"big": 2**80},
                    3: {"n": math.nan},
                }
                await bus.publish(report(-1, bad.get(i % 5, {"loss": 1.0}), time=0.0))
                await bus.wait_idle()
                clock.advance(0.3)
            await bus.publish(RunFinished(run_id="r", status="finished"))
    with LogReader(path) as reader:
        logged = list(reader)
    assert [e.seq for e in logged] == [e.seq for e in seen] == list(range(len(seen)))
    assert [e.status for e in logged if isinstance(e, RunFinished)] == ["finished"]
    assert any(isinstance(e, HealthCheckTick) for e in logged)
    expected = 8 if name.endswith(".evlog") else 6  # JSON keeps ints beyond 64 bits
    assert recorder.placeholders == expected and reader.placeholders == 0
    assert sum(isinstance(e, EventPlaceholder) for e in logged) == expected
    for original, back in zip(seen, logged, strict=True):
        if not isinstance(back, EventPlaceholder):
            assert same(original, back)


# --- (8) what the recorder wrote is always readable --------------------------------------------


class Custom(Event, frozen=True, kw_only=True):
    """A user's event type (defined in this test module)."""

    value: int


@pytest.mark.parametrize("name", FORMATS)
def test_events_that_do_not_decode_as_their_type_read_back_as_placeholders(
    tmp_path: Path, name: str
) -> None:
    path = tmp_path / name
    wrong: list[Event] = [
        report(1, None),
        report(2, [1, 2, 3]),
        report(3, {1: 2}),
        Custom(value="not an int", seq=4, time=14.0),  # type: ignore[arg-type]
    ]
    with LogRecorder(path) as recorder:
        recorder.write_many([report(0), *wrong, report(5)])
    assert recorder.placeholders == 0  # msgspec can encode all of them
    with LogReader(path) as reader:
        events = list(reader)
    assert [e.seq for e in events] == [0, 1, 2, 3, 4, 5]
    assert reader.skipped == 0 and reader.truncated is None
    placeholders = [e for e in events if isinstance(e, EventPlaceholder)]
    # JSON has string keys only: {1: 2} is written, and read, as {"1": 2}.
    assert [p.seq for p in placeholders] == ([1, 2, 3, 4] if name.endswith("evlog") else [1, 2, 4])
    assert reader.placeholders == len(placeholders)
    by_seq = {p.seq: p for p in placeholders}
    assert by_seq[1].event_type == "Report" and by_seq[1].time == 11.0
    assert "Expected `object`, got" in by_seq[1].reason and "$.metrics" in by_seq[1].reason
    assert "'metrics': [1, 2, 3]" in by_seq[2].text
    assert by_seq[4].event_type == "Custom" and "Expected `int`, got `str`" in by_seq[4].reason
    assert "'value': 'not an int'" in by_seq[4].text


def test_an_intact_record_too_malformed_to_parse_is_a_placeholder(tmp_path: Path) -> None:
    """Its CRC holds (format 2): what the recorder wrote is never called corrupt."""
    path = write_log(tmp_path / "log.evlog", [report(0)])
    head = msgspec.msgpack.encode({"type": "Report", "seq": 1, "time": 11.0})
    assert head[0] == 0x83  # a map of 3: made a map of 4 whose 4th value is...
    garbage = b"\x84" + head[1:] + b"\xa1x\xc1"  # ...a byte msgpack never uses,
    nested = b"\x84" + head[1:] + b"\xa1x" + b"\x91" * 200_000 + b"\xc0"  # ...200,000 deep
    with path.open("ab") as f:
        f.write(frame(garbage) + frame(nested) + frame(encode_msgpack(report(3))))
    events = read_log(path).events
    assert [type(e).__name__ for e in events] == [
        "Report",
        "EventPlaceholder",
        "EventPlaceholder",
        "Report",
    ]
    for placeholder in events[1:3]:
        assert isinstance(placeholder, EventPlaceholder)
        assert (placeholder.event_type, placeholder.seq, placeholder.time) == ("Report", 1, 11.0)
        assert "bytes:" in placeholder.text
    assert isinstance(events[2], EventPlaceholder) and "too deep" in events[2].reason


@pytest.mark.anyio
async def test_replay_skips_placeholders_and_counts_them(tmp_path: Path) -> None:
    path = tmp_path / "log.evlog"
    with LogRecorder(path) as recorder:
        recorder.write_many([report(0), report(1, {"p": Path("/x")}), report(2, None), report(3)])
    capture = EventCapture()
    result = await replay_log(path, capture)
    assert [e.index for e in capture.of_type(Report)] == [0, 3]
    assert not capture.of_type(EventPlaceholder)
    assert result.summary.placeholders == 2 and result.summary.replayed == 2
    assert (result.summary.first_time, result.summary.last_time) == (10.0, 13.0)


# --- (9) NaN and infinities survive ----------------------------------------------------------

NONFINITE = {
    "loss": math.nan,
    "grad": math.inf,
    "low": -math.inf,
    "nested": [math.nan, {"x": -math.inf}, (1.5, math.inf)],
    "text": "NaN Infinity -Infinity",
}


@pytest.mark.parametrize("name", FORMATS)
def test_nan_and_infinity_round_trip_unchanged(tmp_path: Path, name: str) -> None:
    path = tmp_path / name
    events: list[Event] = [
        report(0, NONFINITE),
        HealthCheckTick(period=1, start=1.0, end=3.0, seq=1, time=3.0),
        report(2, {"fine": 1.0}, checkpoint=None),
    ]
    with LogRecorder(path) as recorder:
        recorder.write_many(events)
    assert recorder.placeholders == 0
    back = read_log(path)
    assert back.placeholders == 0
    first, tick, last = back.events
    assert isinstance(first, Report) and isinstance(tick, HealthCheckTick)
    assert math.isnan(first.metrics["loss"]) and first.metrics["grad"] == math.inf
    assert first.metrics["low"] == -math.inf and first.metrics["text"] == NONFINITE["text"]
    assert math.isnan(first.metrics["nested"][0]) and first.metrics["nested"][1] == {"x": -math.inf}
    assert first.metrics["nested"][2] == [1.5, math.inf]
    assert same(tick, events[1]) and same(last, events[2])
    if name.endswith(".jsonl"):
        line = path.read_bytes().splitlines()[1]
        assert b'"loss":NaN' in line and b'"grad":Infinity' in line and b'"low":-Infinity' in line
        assert line.count(b"null") == 1 and line.endswith(b'"checkpoint":null}')
        assert math.isnan(json.loads(line)["metrics"]["loss"])  # Python's json reads it


@pytest.mark.parametrize("name", FORMATS)
@pytest.mark.parametrize(
    ("field", "value"),
    [("time", math.nan), ("time", math.inf), ("start", -math.inf), ("end", 1e13)],
)
def test_a_record_whose_bus_time_is_not_finite_is_damaged(
    tmp_path: Path, name: str, field: str, value: float
) -> None:
    """A bus time is finite: a NaN or infinite one would stall periods and comparisons."""
    path = tmp_path / name
    tick = HealthCheckTick(period=1, start=1.0, end=3.0, seq=1, time=3.0)
    events: list[Event] = [report(0, {"loss": 1.0}), replace(tick, **{field: value})]
    with LogRecorder(path) as recorder:
        recorder.write_many(events)
    back = read_log(path)
    assert back.placeholders == 1
    damaged = back.events[1]
    assert isinstance(damaged, EventPlaceholder) and damaged.event_type == "HealthCheckTick"
    assert f"$.{field}" in damaged.reason and damaged.time == (3.0 if field != "time" else 0.0)


def test_encode_json_and_decode_json_keep_nan() -> None:
    event = report(0, {"loss": math.nan, "inf": math.inf})
    text = encode_json(event)
    assert b"NaN" in text and b"Infinity" in text
    back = decode_json(text)
    assert same(back, event)
    assert same(decode_json(text.decode()), event)
    assert same(decode_msgpack(encode_msgpack(event)), event)


def test_strings_that_look_like_nan_stay_strings(tmp_path: Path) -> None:
    path = tmp_path / "log.jsonl"
    metrics = {"a": "NaN", "b": "Infinity", "c": "null", "d": None}
    with LogRecorder(path) as recorder:
        recorder.write_many([report(0, metrics), report(1, {"n": math.nan, "s": "NaN"})])
    events = read_log(path).events
    assert isinstance(events[0], Report) and events[0].metrics == metrics
    assert isinstance(events[1], Report) and events[1].metrics["s"] == "NaN"
    assert math.isnan(events[1].metrics["n"])


# --- (12) no recursion error out of a reader -----------------------------------------------------

DEEP_JSON = (
    b'{"type":"Report","seq":1,"time":1.0,"run_id":"r","rank":0,"world_size":1,"index":1,'
    b'"metrics":{"a":' + b"[" * 100_000 + b"]" * 100_000 + b"}}\n"
)
DEEP_MSGPACK = (  # {"type": "Report", "seq": 1, "time": 1.0, "metrics": {"a": [[[...]]]}}
    b"\x84"
    + msgspec.msgpack.encode({"type": "Report", "seq": 1, "time": 1.0})[1:]
    + b"\xa7metrics\x81\xa1a"
    + b"\x91" * 100_000
    + b"\xc0"
)


def deep_logs(tmp_path: Path) -> dict[str, tuple[Path, int]]:
    """A 100,000-deep record between two good ones: (log, offset of the deep record)."""
    jsonl = write_log(tmp_path / "deep.jsonl", [report(0)])
    jsonl_offset = jsonl.stat().st_size
    with jsonl.open("ab") as f:
        f.write(DEEP_JSON + encode_json(report(2)) + b"\n")
    v2 = write_log(tmp_path / "deep-v2.evlog", [report(0)])
    v2_offset = v2.stat().st_size
    damaged = bytearray(frame(DEEP_MSGPACK))
    damaged[-1] ^= 0xFF  # its CRC fails: corrupt (an intact one would be a placeholder)
    with v2.open("ab") as f:
        f.write(bytes(damaged) + frame(encode_msgpack(report(2))))
    return {"jsonl": (jsonl, jsonl_offset), "v2": (v2, v2_offset)}


@pytest.mark.parametrize("which", ["jsonl", "v2"])
def test_a_record_nested_100000_deep_is_a_corrupt_record(tmp_path: Path, which: str) -> None:
    path, offset = deep_logs(tmp_path)[which]
    with pytest.raises(CorruptLogError) as caught:
        read_log(path)
    assert (caught.value.offset, caught.value.index) == (offset, 1)
    assert str(path) in str(caught.value)
    contents = read_log(path, skip_corrupt=True)
    assert [e.seq for e in contents.events] == [0, 2]
    assert contents.skipped == 1


def test_the_codecs_reject_deep_nesting_with_their_own_error() -> None:
    from eventbus._codec import EventDecodeError

    with pytest.raises(EventDecodeError, match="too deep"):
        decode_json(DEEP_JSON)
    with pytest.raises(EventDecodeError, match="too deep"):
        decode_msgpack(DEEP_MSGPACK)


def test_a_record_nested_nearly_to_the_limit_decodes_on_a_deeper_stack(tmp_path: Path) -> None:
    """The recorder wrote it from a shallow stack; a reader deep in its own stack
    (a test, a framework) still decodes it, on a fresh thread's stack."""
    for name in FORMATS:
        path = tmp_path / name
        events = [report(i, nested_dict(d)) for i, d in enumerate((900, 940, 960))]

        def record(path: Path = path, events: list[Report] = events) -> None:
            with LogRecorder(path) as recorder:
                recorder.write_many(events)
            assert recorder.placeholders == 0

        writer = threading.Thread(target=record)  # a shallow stack, like a bus thread's
        writer.start()
        writer.join()

        def read_deep_in_the_stack(frames: int, path: Path = path) -> list[Event]:
            return read_log(path).events if frames == 0 else read_deep_in_the_stack(frames - 1)

        back = read_deep_in_the_stack(200)
        assert [type(e).__name__ for e in back] == ["Report"] * 3
        assert [depth_of(e.metrics) for e in back if isinstance(e, Report)] == [900, 940, 960]


# --- (13) checksums and resynchronisation -------------------------------------------------------


def test_a_bit_flip_in_a_length_costs_only_that_record(tmp_path: Path) -> None:
    events = [report(i, {"loss": 0.1 * i, "note": "n" * (i * 7 % 50)}) for i in range(20)]
    path = write_log(tmp_path / "log.evlog", events)
    original = path.read_bytes()
    start, _ = records(path)[7]
    for bit in range(32):
        data = bytearray(original)
        data[start + 4 + bit // 8] ^= 1 << (bit % 8)
        path.write_bytes(bytes(data))
        with pytest.raises(CorruptLogError) as caught:
            read_log(path)
        assert (caught.value.offset, caught.value.index) == (start, 7)
        assert "damaged record header" in caught.value.reason
        contents = read_log(path, skip_corrupt=True)
        assert [e.seq for e in contents.events] == [i for i in range(20) if i != 7], bit
        assert contents.truncated is None and contents.skipped == 1


@pytest.mark.parametrize("where", ["marker", "length", "crc", "payload"])
def test_damage_in_any_part_of_a_record_is_detected(tmp_path: Path, where: str) -> None:
    path = write_log(tmp_path / "log.evlog", [report(i) for i in range(5)])
    start, _ = records(path)[2]
    data = bytearray(path.read_bytes())
    data[start + {"marker": 0, "length": 5, "crc": 9, "payload": 40}[where]] ^= 0x10
    path.write_bytes(bytes(data))
    with pytest.raises(CorruptLogError) as caught:
        read_log(path)
    assert (caught.value.offset, caught.value.index) == (start, 2)
    assert [e.seq for e in read_log(path, skip_corrupt=True).events] == [0, 1, 3, 4]


def test_a_damaged_length_check_costs_only_that_record(tmp_path: Path) -> None:
    """A record is intact when its marker, its length check and its CRC all hold,
    wherever it lies in the reader's reads."""
    path = write_log(tmp_path / "log.evlog", [report(i) for i in range(3)])
    start, _ = records(path)[1]
    data = bytearray(path.read_bytes())
    data[start + 2] ^= 0x01
    path.write_bytes(bytes(data))
    for chunk in (7, 1 << 20):
        with pytest.raises(CorruptLogError, match="fails its check") as caught:
            list(LogReader(path, chunk_size=chunk))
        assert (caught.value.offset, caught.value.index) == (start, 1)
        with LogReader(path, skip_corrupt=True, chunk_size=chunk) as reader:
            assert [e.seq for e in reader] == [0, 2]


def test_inserted_and_deleted_bytes_cost_only_the_records_they_hit(tmp_path: Path) -> None:
    path = write_log(tmp_path / "log.evlog", [report(i) for i in range(8)])
    spans = records(path)
    original = path.read_bytes()
    (s2, _), (s5, _) = spans[2], spans[5]
    inserted = b"\xc1\xeb\x00junk"  # into record 2's payload, a marker among it
    path.write_bytes(
        original[: s2 + 30] + inserted + original[s2 + 30 : s5 + 3] + original[s5 + 9 :]
    )  # and 6 bytes of record 5's header deleted
    contents = read_log(path, skip_corrupt=True)
    assert [e.seq for e in contents.events] == [0, 1, 3, 4, 6, 7]
    assert contents.skipped == 2 and contents.truncated is None


def test_a_torn_tail_after_damage_is_still_a_torn_tail(tmp_path: Path) -> None:
    path = write_log(tmp_path / "log.evlog", [report(i) for i in range(6)])
    spans = records(path)
    data = bytearray(path.read_bytes())
    data[spans[1][0] + 20] ^= 0xFF
    cut = spans[5][0] + 7
    path.write_bytes(bytes(data[:cut]))
    contents = read_log(path, skip_corrupt=True)
    assert [e.seq for e in contents.events] == [0, 2, 3, 4]
    assert contents.truncated is not None
    assert (contents.truncated.offset, contents.truncated.size) == (spans[5][0], 7)


def test_reading_in_tiny_chunks_finds_the_same_records(tmp_path: Path) -> None:
    path = write_log(tmp_path / "log.evlog", [report(i, {"s": "z" * i}) for i in range(30)])
    spans = records(path)
    data = bytearray(path.read_bytes())
    for victim in (3, 11, 12, 20):
        data[spans[victim][0] + 13] ^= 0x55
    path.write_bytes(bytes(data[:-3]))
    expected = [i for i in range(29) if i not in (3, 11, 12, 20)]
    for chunk in (1, 2, 5, 11, 12, 13, 64, 1 << 20):
        with LogReader(path, skip_corrupt=True, chunk_size=chunk) as reader:
            assert [e.seq for e in reader] == expected, chunk
        assert reader.skipped == 4 and reader.truncated is not None
        assert reader.truncated.offset == spans[29][0]


def hostile_garbage(size: int, *, lengths: str) -> bytes:
    """Bytes full of record markers. ``plausible``: each with a length that passes
    its check and claims the rest of the garbage (an O(n²) trap for a naive
    resync); ``random``: lengths that fail their check."""
    out = bytearray()
    step = 0
    while len(out) < size:
        claim = max(0, size - len(out) - 12) if lengths == "plausible" else 0x10000 + step
        check = (claim ^ claim >> 16) & 0xFFFF if lengths == "plausible" else ~claim & 0xFFFF
        out += struct.pack("<2sHII", b"\xc1\xeb", check, claim, step)
        step += 1
    return bytes(out[:size])


@pytest.mark.parametrize("lengths", ["plausible", "random"])
def test_resynchronising_through_hostile_garbage_costs_linear_work(
    tmp_path: Path, lengths: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Megabytes of markers with plausible lengths between good records: the
    reader checksums a bounded multiple of the file, not its square."""
    monkeypatch.setattr(eventbus.log._reader, "RESYNC_BUDGET", 1 << 20)
    path = write_log(tmp_path / "log.evlog", [report(0), report(1)])
    garbage = hostile_garbage(4 << 20, lengths=lengths)
    with path.open("ab") as f:
        f.write(garbage + frame(encode_msgpack(report(2))) + frame(encode_msgpack(report(3))))
    checksummed = 0
    real_crc32 = zlib.crc32

    def counting_crc32(data: Any, value: int = 0) -> int:
        nonlocal checksummed
        checksummed += len(data)
        return real_crc32(data, value)

    monkeypatch.setattr(zlib, "crc32", counting_crc32)
    contents = read_log(path, skip_corrupt=True)
    assert [e.seq for e in contents.events] == [0, 1, 2, 3]
    assert contents.skipped >= 1
    size = path.stat().st_size
    assert checksummed < 10 * size + (1 << 20), (checksummed, size)


def test_damaged_records_between_intact_ones_cost_linear_work(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Thousands of intact records, each followed by a header whose length passes its
    check and claims 100 kB: each of those claims costs a checksum until the budget
    is spent, then none, so the work stays a bounded multiple of the file."""
    monkeypatch.setattr(eventbus.log._reader, "RESYNC_BUDGET", 1 << 20)
    claim = 100_000
    fake = struct.pack("<2sHII", b"\xc1\xeb", (claim ^ claim >> 16) & 0xFFFF, claim, 0)
    path = write_log(tmp_path / "log.evlog", [report(0), report(1)])
    with path.open("ab") as f:
        for seq in range(100, 4100):
            f.write(frame(encode_msgpack(report(seq, {}))) + fake)
        f.write(b"\0" * claim + frame(encode_msgpack(report(2))) + frame(encode_msgpack(report(3))))
    checksummed = 0
    real_crc32 = zlib.crc32

    def counting_crc32(data: Any, value: int = 0) -> int:
        nonlocal checksummed
        checksummed += len(data)
        return real_crc32(data, value)

    monkeypatch.setattr(zlib, "crc32", counting_crc32)
    seqs = [e.seq for e in read_log(path, skip_corrupt=True).events]
    assert seqs[:3] == [0, 1, 100] and seqs[-2:] == [2, 3]
    size = path.stat().st_size
    assert checksummed < 12 * size + (2 << 20), (checksummed, size)


def test_a_version_1_log_is_refused_naming_the_file(tmp_path: Path) -> None:
    """Format 1 (a bare length before each record) was never released: refused, clearly."""
    msgpack = v1_log(tmp_path / "v1.evlog", [encode_msgpack(report(0))])
    jsonl = tmp_path / "v1.jsonl"
    jsonl.write_bytes(b'{"eventbus_log":1,"run_id":"v1"}\n' + encode_json(report(0)) + b"\n")
    for path in (msgpack, jsonl):
        with pytest.raises(LogFormatError, match="unsupported log format version 1") as caught:
            read_log(path)
        assert str(caught.value).startswith(f"{path}: ")


# --- (14) bounded lines -------------------------------------------------------------------------


def test_an_overlong_jsonl_line_is_a_skippable_corrupt_record(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(eventbus.log._format, "MAX_LINE", 1000)
    path = write_log(tmp_path / "log.jsonl", [report(0)])
    offset = path.stat().st_size
    long_line = encode_json(report(1, {"text": "x" * 5000})) + b"\n"
    with path.open("ab") as f:
        f.write(long_line + encode_json(report(2)) + b"\n" + b'{"type":"oops"\n')
    with pytest.raises(CorruptLogError) as caught:
        read_log(path)
    assert (caught.value.offset, caught.value.index) == (offset, 1)
    assert "line longer than 1000 bytes" in str(caught.value)
    with LogReader(path, skip_corrupt=True) as reader:
        assert [e.seq for e in reader] == [0, 2]
    third = offset + len(long_line) + len(encode_json(report(2))) + 1
    assert [e.offset for e in reader.errors] == [offset, third]
    assert [e.index for e in reader.errors] == [1, 3]


def test_an_overlong_line_is_skipped_in_bounded_memory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(eventbus.log._format, "MAX_LINE", 64 * 1024)
    path = write_log(tmp_path / "log.jsonl", [report(0)])
    with path.open("ab") as f:
        f.write(b'{"type":"Report","metrics":"' + b"x" * (30 << 20) + b'"}\n')
        f.write(encode_json(report(2)) + b"\n")
    tracemalloc.start()
    try:
        with LogReader(path, skip_corrupt=True, chunk_size=64 * 1024) as reader:
            seqs = [e.seq for e in reader]
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert seqs == [0, 2] and reader.skipped == 1
    assert peak < 2 << 20, peak


def test_the_real_line_limit_holds_memory_to_about_the_limit(tmp_path: Path) -> None:
    """A line longer than MAX_LINE (the 100 MB line took `show` to 508 MB)."""
    limit = eventbus.log._format.MAX_LINE
    path = write_log(tmp_path / "log.jsonl", [report(0)])
    with path.open("ab") as f:
        f.write(b'{"type":"Report","metrics":"' + b"x" * (limit + (8 << 20)) + b'"}\n')
        f.write(encode_json(report(2)) + b"\n")
    tracemalloc.start()
    try:
        contents = read_log(path, skip_corrupt=True)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert [e.seq for e in contents.events] == [0, 2] and contents.skipped == 1
    assert peak < limit + (16 << 20), peak


def test_an_overlong_header_line_is_refused_in_bounded_memory(tmp_path: Path) -> None:
    path = tmp_path / "log.jsonl"
    path.write_bytes(b'{"eventbus_log":2,"run_id":"' + b"r" * (8 << 20) + b'"}\n')
    tracemalloc.start()
    try:
        with pytest.raises(LogFormatError, match="longer than"):
            LogReader(path)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 4 << 20, peak


# --- (23) the modules of event types --------------------------------------------------------------


def run_python(code: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        cwd=cwd,
        check=False,
        timeout=120,
    )


def test_a_log_of_gathered_events_reads_without_importing_handlers(tmp_path: Path) -> None:
    log = tmp_path / "run.evlog"
    written = run_python(
        f"""
        from eventbus import AfterRun, BeforeRun, FailuresGathered, RoundGathered
        from eventbus.testing import write_log
        import sys
        sys.path.insert(0, {str(Path(__file__).parent)!r})
        from _builders import sample_event
        events = [sample_event(c) for c in (BeforeRun, RoundGathered, FailuresGathered, AfterRun)]
        write_log({str(log)!r}, events)
        write_log({str(log.with_suffix(".jsonl"))!r}, events)
        """,
        tmp_path,
    )
    assert written.returncode == 0, written.stderr
    for path in (log, log.with_suffix(".jsonl")):
        read = run_python(
            f"""
            import sys
            import eventbus.log
            contents = eventbus.log.read_log({str(path)!r})
            print([type(e).__name__ for e in contents.events], contents.placeholders)
            print("handlers" in sys.modules)
            """,
            tmp_path,
        )
        assert read.returncode == 0, read.stderr
        assert read.stdout.splitlines() == [
            "['BeforeRun', 'RoundGathered', 'FailuresGathered', 'AfterRun'] 0",
            "False",
        ]


USER_EVENTS = """
from eventbus import Event

class Trained(Event, frozen=True, kw_only=True):
    epochs: int
"""


def test_a_users_event_type_is_a_placeholder_naming_its_module(tmp_path: Path) -> None:
    (tmp_path / "my_events.py").write_text(USER_EVENTS)
    log = tmp_path / "user.evlog"
    written = run_python(
        f"""
        from my_events import Trained
        from eventbus.testing import write_log
        write_log({str(log)!r}, [Trained(epochs=3)])
        """,
        tmp_path,
    )
    assert written.returncode == 0, written.stderr
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    read = run_python(
        f"""
        import sys
        import eventbus.log
        contents = eventbus.log.read_log({str(log)!r})
        (event,) = contents.events
        print(type(event).__name__, event.event_type, event.seq)
        print(event.reason)
        print("my_events" in sys.modules)
        """,
        elsewhere,
    )
    assert read.returncode == 0, read.stderr
    assert read.stdout.splitlines() == [
        "EventPlaceholder Trained 0",
        "event type 'Trained' is defined in module 'my_events': import it before reading this log",
        "False",
    ]
    imported = run_python(
        f"""
        import eventbus.log, my_events
        print(eventbus.log.read_log({str(log)!r}).events)
        """,
        tmp_path,
    )
    assert imported.stdout.strip() == "[Trained(seq=0, time=0.0, epochs=3)]", imported.stderr


@pytest.mark.parametrize(
    "module",
    [
        "os",
        "side_effect_module",
        "handlers.__main__",
        "adapters.cli.__main__",
        "eventbus;import os",
        "handlersx",
        "eventbus._events\n",
    ],
)
def test_a_header_cannot_make_the_reader_import_anything_else(
    tmp_path: Path, module: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "side_effect_module.py").write_text("raise SystemExit('imported!')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    path = tmp_path / "evil.evlog"
    with LogRecorder(path, event_types={"Evil": module}) as recorder:
        recorder.write(report(0))
    with path.open("ab") as f:
        f.write(frame(msgspec.msgpack.encode({"type": "Evil", "seq": 1, "time": 2.0})))
    before = set(sys.modules)
    (_, evil) = read_log(path).events
    assert isinstance(evil, EventPlaceholder) and evil.event_type == "Evil"
    assert f"is defined in module {module!r}" in evil.reason
    assert set(sys.modules) - before == set()


def test_the_header_lists_every_event_type_and_its_module(tmp_path: Path) -> None:
    for name in FORMATS:
        header = read_log(write_log(tmp_path / name, [])).header
        assert header.format_version == 2
        assert header.event_types["Report"] == "eventbus"  # its public home
        assert header.event_types["Custom"] == __name__
