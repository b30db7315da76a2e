"""Costs of event logs, each against its floor measured in the same run.

- *record*: publishing N events through a bus with one trivial handler, with
  and without a ``LogRecorder`` attached; the difference per event is what
  recording adds (target <= 0.5 µs). Floor: a plain loop calling the handler.
- *read*: ``LogReader`` over a log of N events, read, checksummed and
  validated (target >= 1 million events/s). Floor: the msgspec decoder alone
  over the same records, already split (what framing, checksums and
  streaming add on top).
- *jsonl*: the same two for JSON Lines (recording through a bus, reading),
  and recording events whose metrics hold a NaN (the careful JSON path).
- *replay*: N events replayed instantly on a ``VirtualClock`` into a bus with
  one trivial callback (target: 1 million in under 5 s).
- *memory*: peak resident memory of a fresh process that reads a log of M
  events (target < 100 MB for 10 million: ``--full``).

    python benchmarks/bench_log.py [--events 200000] [--memory-events 1000000] [--full] [--json]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import anyio
import msgspec

from eventbus import Event, EventBus, Report, VirtualClock
from eventbus._codec import decoder_for
from eventbus.log import LOG_FORMAT_VERSION, LogReader, LogRecorder, replay
from eventbus.log._format import RECORD_LENGTH

#: Format version 1 frames a record with its length (4 bytes); version 2 with a
#: marker, a length check, the length and a CRC-32 (12 bytes, the length at byte 4).
#: Knowing both lets this script measure a tree before and after the change.
FRAME, LENGTH_AT = (4, 0) if LOG_FORMAT_VERSION == 1 else (12, 4)


def make_events(n: int, loss: float = 0.5) -> list[Report]:
    return [
        Report(run_id="bench", rank=i % 4, world_size=4, index=i // 4, metrics={"loss": loss})
        for i in range(n)
    ]


def trivial() -> Any:
    sink = [0]

    def callback(event: Any) -> None:
        sink[0] += 1

    return callback


def encode_floor(events: list[Report]) -> float:
    """msgspec encoding alone: the least any recorder has to do per event."""
    encode = msgspec.msgpack.Encoder().encode
    start = time.perf_counter()
    for event in events:
        encode(event)
    return time.perf_counter() - start


def floor_loop(events: list[Report]) -> float:
    fn = trivial()
    start = time.perf_counter()
    for event in events:
        fn(event)
    return time.perf_counter() - start


async def publish_all(events: list[Report], path: Path | None) -> float:
    recorder = LogRecorder(path, fsync="never") if path is not None else None
    async with EventBus(budget=1.0) as bus:
        bus.subscribe(Report, trivial())
        if recorder is not None:
            recorder.attach(bus)
        publish = bus.publish
        start = time.perf_counter()
        for event in events:
            await publish(event)
        await bus.wait_idle()
        if recorder is not None:
            recorder.close()  # the last flush is part of the cost
        elapsed = time.perf_counter() - start
    return elapsed


def write_log(path: Path, n: int, chunk: int = 100_000) -> None:
    """``n`` events in ``path`` (JSON Lines for a ``.jsonl`` name)."""
    with LogRecorder(path, fsync="never", batch_bytes=1 << 20) as recorder:
        for start in range(0, n, chunk):
            recorder.write_many(
                [
                    msgspec.structs.replace(event, seq=start + i, time=1.0 + i * 1e-3)
                    for i, event in enumerate(make_events(min(chunk, n - start)))
                ]
            )


def read_all(path: Path) -> tuple[float, int]:
    start = time.perf_counter()
    count = 0
    with LogReader(path) as reader:
        for _ in reader:
            count += 1
    return time.perf_counter() - start, count


def decode_floor(path: Path) -> float:
    """The decoder alone over records already split out of the file."""
    data = path.read_bytes()
    with LogReader(path) as reader:
        pos = reader.data_offset
    payloads = []
    while pos < len(data):
        size = RECORD_LENGTH.unpack_from(data, pos + LENGTH_AT)[0]
        payloads.append(data[pos + FRAME : pos + FRAME + size])
        pos += FRAME + size
    decode = decoder_for("msgpack").decode
    start = time.perf_counter()
    for payload in payloads:
        decode(payload)
    return time.perf_counter() - start


async def replay_events(events: list[Event]) -> float:
    async with EventBus(clock=VirtualClock(1.0), budget=1.0) as bus:
        bus.subscribe(Report, trivial())
        start = time.perf_counter()
        await replay(bus, events)
        elapsed = time.perf_counter() - start
    return elapsed


def median(values: list[float]) -> float:
    return statistics.median(values)


def measure(n: int, repeat: int, tmp: Path) -> dict[str, Any]:
    floor, encoding, plain, recorded = [], [], [], []
    for i in range(repeat):
        gc.collect()
        floor.append(floor_loop(make_events(n)))
        encoding.append(encode_floor(make_events(n)))
        plain.append(anyio.run(publish_all, make_events(n), None))
        recorded.append(anyio.run(publish_all, make_events(n), tmp / f"rec{i}.evlog"))
    log = tmp / "read.evlog"
    write_log(log, n)
    reads, floors = [], []
    for _ in range(repeat):
        gc.collect()
        elapsed, count = read_all(log)
        assert count == n
        reads.append(elapsed)
        floors.append(decode_floor(log))
    with LogReader(log) as reader:
        logged = list(reader)
    replays = [anyio.run(replay_events, logged) for _ in range(max(1, repeat // 2))]
    jsonl_plain, jsonl_recorded, jsonl_nan, jsonl_reads = [], [], [], []
    jsonl_log = tmp / "read.jsonl"
    write_log(jsonl_log, n)
    for i in range(repeat):
        gc.collect()
        jsonl_plain.append(anyio.run(publish_all, make_events(n), None))
        jsonl_recorded.append(anyio.run(publish_all, make_events(n), tmp / f"rec{i}.jsonl"))
        nan_events = make_events(n, loss=float("nan"))
        jsonl_nan.append(anyio.run(publish_all, nan_events, tmp / f"nan{i}.jsonl"))
        elapsed, count = read_all(jsonl_log)
        assert count == n
        jsonl_reads.append(elapsed)
    per = 1e9 / n
    return {
        "events": n,
        "record": {
            "floor_ns": round(median(floor) * per, 1),
            "bus_ns": round(median(plain) * per, 1),
            "bus_recorded_ns": round(median(recorded) * per, 1),
            "added_ns": round((median(recorded) - median(plain)) * per, 1),
            "added_vs_floor": round((median(recorded) - median(plain)) / median(floor), 2),
            "encode_only_ns": round(median(encoding) * per, 1),
            "added_vs_encode_only": round((median(recorded) - median(plain)) / median(encoding), 2),
        },
        "read": {
            "events_per_s": round(n / median(reads)),
            "ns_per_event": round(median(reads) * per, 1),
            "decode_only_ns": round(median(floors) * per, 1),
            "ratio_to_decode_only": round(median(reads) / median(floors), 2),
            "bytes_per_event": round(log.stat().st_size / n, 1),
        },
        "replay": {
            "seconds": round(median(replays), 3),
            "ns_per_event": round(median(replays) * per, 1),
            "seconds_per_million": round(median(replays) * 1e6 / n, 2),
        },
        "jsonl": {
            "record_added_ns": round((median(jsonl_recorded) - median(jsonl_plain)) * per, 1),
            "record_nan_added_ns": round((median(jsonl_nan) - median(jsonl_plain)) * per, 1),
            "read_ns_per_event": round(median(jsonl_reads) * per, 1),
            "bytes_per_event": round(jsonl_log.stat().st_size / n, 1),
        },
    }


def memory(m: int, tmp: Path) -> dict[str, Any]:
    log = tmp / "memory.evlog"
    write_log(log, m)
    child = subprocess.run(
        [sys.executable, __file__, "--read-rss", str(log)],
        capture_output=True,
        text=True,
        check=True,
    )
    figures: dict[str, Any] = json.loads(child.stdout)
    figures["log_mb"] = round(log.stat().st_size / 2**20, 1)
    log.unlink()
    return figures


def peak_rss_mb() -> float:
    """This process's peak RSS (``VmHWM``: unlike ``ru_maxrss``, not inherited across exec)."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def read_rss(path: str) -> None:
    """In a fresh process: read the log, print peak RSS before and after."""
    before = peak_rss_mb()
    elapsed, count = read_all(Path(path))
    peak = peak_rss_mb()
    print(
        json.dumps(
            {
                "events": count,
                "peak_rss_mb_before_read": round(before, 1),
                "peak_rss_mb": round(peak, 1),
                "seconds": round(elapsed, 2),
            }
        )
    )


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--events", type=int, default=200_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--memory-events", type=int, default=1_000_000)
    parser.add_argument("--full", action="store_true", help="memory check with 10 million events")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--read-rss", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.read_rss:
        read_rss(args.read_rss)
        return 0
    with tempfile.TemporaryDirectory(prefix="bench_log") as tmp:
        results = measure(args.events, args.repeat, Path(tmp))
        results["memory"] = memory(10_000_000 if args.full else args.memory_events, Path(tmp))
    if args.json:
        json.dump(results, sys.stdout, indent=2)
        print()
        return 0
    rec, read, rep, mem = results["record"], results["read"], results["replay"], results["memory"]
    print(f"events: {results['events']}  (pid {os.getpid()})")
    print(
        f"record: bus {rec['bus_ns']:.0f} ns/event, with recorder {rec['bus_recorded_ns']:.0f}: "
        f"+{rec['added_ns']:.0f} ns/event ({rec['added_vs_floor']}x a plain call loop of "
        f"{rec['floor_ns']:.0f} ns; {rec['added_vs_encode_only']}x msgspec encoding alone, "
        f"{rec['encode_only_ns']:.0f} ns)"
    )
    print(
        f"read:   {read['events_per_s']:,} events/s ({read['ns_per_event']:.0f} ns/event; "
        f"decoder alone {read['decode_only_ns']:.0f} ns, ratio {read['ratio_to_decode_only']}; "
        f"{read['bytes_per_event']} bytes/event)"
    )
    print(f"replay: {rep['ns_per_event']:.0f} ns/event, {rep['seconds_per_million']} s per million")
    jl = results["jsonl"]
    print(
        f"jsonl:  record +{jl['record_added_ns']:.0f} ns/event (+{jl['record_nan_added_ns']:.0f} "
        f"with a NaN metric); read {jl['read_ns_per_event']:.0f} ns/event; "
        f"{jl['bytes_per_event']} bytes/event"
    )
    print(
        f"memory: reading {mem['events']:,} events ({mem['log_mb']} MB log): peak RSS "
        f"{mem['peak_rss_mb']} MB (before reading {mem['peak_rss_mb_before_read']} MB)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
