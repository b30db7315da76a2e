"""Costs of the event log, each against msgspec itself measured in the same run.

The events are N ``Report``s with 4 metrics each, built and stamped (``seq``,
``time``) before anything is timed; floors and ours run over the same list,
interleaved (floor, ours, floor, ours, ...), and each figure is the median of
the repeats with their min-max spread. Ratios are paired: each repeat's run of
ours against the floor run beside it.

- *bare encode* (the floor of recording): ``msgspec.msgpack.Encoder().encode_into``
  of each event into one reused ``bytearray``, the fastest bare way (``encode``,
  which allocates a ``bytes`` per event, is shown too).
- *tap*: ``LogRecorder.record_many`` over the events in batches of 1024 (what
  a bus hands its taps), to the file, closed (target <= 1.5x bare encode).
- *write_log*: ``eventbus.testing.write_log`` over the same events (target <= 1.5x).
- *bare decode* (the floor of reading): msgspec's decoder of the event union
  over each record's payload, already split out of the log (``bytes``), nothing kept.
- *read*: ``LogReader`` streaming the same log, nothing kept (target >= 0.75x
  the bare decode rate).
- *replay*: a log of 1 million events replayed from its file, instantly on a
  ``VirtualClock``, into a bus with one trivial callback (target <= 2.5 s;
  ``--quick`` scales from fewer events and says so).
- *memory*: peak RSS of a fresh process streaming a log (target < 100 MB).
- *info* (no targets): JSON Lines recording and reading, recording from a bus
  (publishing with and without a recorder attached), ``write_log`` of events
  without ``seq``/``time`` (each copied once to stamp it).

    python benchmarks/bench_log.py [--events 200000] [--repeat 5]
        [--replay-events 1000000] [--memory-events 1000000] [--full] [--quick] [--json]
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import anyio
import msgspec
from _harness import figure, peak_rss_mb, print_targets, spread, target

from eventbus import Event, EventBus, Report, VirtualClock
from eventbus._codec import decoder_for
from eventbus.log import LogReader, LogRecorder, replay
from eventbus.log._format import LOG_FORMAT_VERSION, RECORD_HEADER
from eventbus.testing import write_log

#: What a bus hands its taps at a time when publishing outpaces dispatch.
TAP_BATCH = 1024
RECORD_TARGET = 1.5
READ_TARGET = 0.75
REPLAY_TARGET_S = 2.5
MEMORY_TARGET_MB = 100.0


def make_events(n: int, loss: float = 0.5, *, stamped: bool = True, first: int = 0) -> list[Report]:
    """Reports ``first`` to ``first + n - 1``, of 4 metrics each; ``stamped``: with the
    ``seq`` and ``time`` a bus gives them."""
    return [
        Report(
            run_id="bench",
            rank=i % 4,
            world_size=4,
            index=i // 4,
            metrics={"loss": loss, "lr": 1e-3, "step": i, "accuracy": 0.75},
            seq=i if stamped else -1,
            time=1.0 + i * 1e-3 if stamped else 0.0,
        )
        for i in range(first, first + n)
    ]


# --- the timed runs: each returns seconds -------------------------------------------------


def bare_encode_into(events: list[Report]) -> float:
    encode_into = msgspec.msgpack.Encoder().encode_into
    buffer = bytearray()
    start = time.perf_counter()
    for event in events:
        encode_into(event, buffer)
    return time.perf_counter() - start


def bare_encode(events: list[Report]) -> float:
    encode = msgspec.msgpack.Encoder().encode
    start = time.perf_counter()
    for event in events:
        encode(event)
    return time.perf_counter() - start


def tap(events: list[Report], path: Path) -> float:
    path.unlink(missing_ok=True)  # truncating the last run's file would cost milliseconds
    recorder = LogRecorder(path, fsync="never")
    record_many = recorder.record_many
    start = time.perf_counter()
    for i in range(0, len(events), TAP_BATCH):
        record_many(events[i : i + TAP_BATCH])
    recorder.close()  # the last write is part of the cost
    return time.perf_counter() - start


def write_log_run(events: list[Report], path: Path) -> float:
    path.unlink(missing_ok=True)
    start = time.perf_counter()
    write_log(path, events)
    return time.perf_counter() - start


def split_payloads(path: Path) -> list[bytes]:
    """Each record's payload, as the reader checksums and decodes it (format version 2)."""
    assert LOG_FORMAT_VERSION == 2, "this script splits format-2 records"
    data = path.read_bytes()
    with LogReader(path) as reader:
        pos = reader.data_offset
    payloads = []
    while pos < len(data):
        size = RECORD_HEADER.unpack_from(data, pos)[2]
        start = pos + RECORD_HEADER.size
        payloads.append(data[start : start + size])
        pos = start + size
    return payloads


def bare_decode(payloads: list[bytes]) -> float:
    decode = decoder_for("msgpack").decode
    start = time.perf_counter()
    for payload in payloads:
        decode(payload)
    return time.perf_counter() - start


def read(path: Path, n: int) -> float:
    count = 0
    start = time.perf_counter()
    with LogReader(path) as reader:
        for _ in reader:
            count += 1
    elapsed = time.perf_counter() - start
    assert count == n, (count, n)
    return elapsed


def trivial() -> Callable[[Any], None]:
    sink = [0]

    def callback(event: Any) -> None:
        sink[0] += 1

    return callback


async def replay_log(path: Path) -> float:
    async with EventBus(clock=VirtualClock(1.0), budget=1.0) as bus:
        bus.subscribe(Report, trivial())
        start = time.perf_counter()
        await replay(bus, path)
        elapsed = time.perf_counter() - start
    return elapsed


async def replay_events(events: list[Event]) -> float:
    async with EventBus(clock=VirtualClock(1.0), budget=1.0) as bus:
        bus.subscribe(Report, trivial())
        start = time.perf_counter()
        await replay(bus, events)
        elapsed = time.perf_counter() - start
    return elapsed


async def publish_all(events: list[Report], path: Path | None) -> float:
    """Publishing through a bus with one callback, with a recorder attached or not."""
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
            recorder.close()
        elapsed = time.perf_counter() - start
    return elapsed


# --- figures --------------------------------------------------------------------------------


def timed(runs: dict[str, list[float]], name: str, run: Callable[[], float]) -> None:
    gc.collect()
    runs.setdefault(name, []).append(run())


def measure(n: int, repeat: int, tmp: Path) -> dict[str, Any]:
    events = make_events(n)
    unstamped = make_events(n, stamped=False)
    nan_events = make_events(n, loss=math.nan)
    log, jsonl = tmp / "read.evlog", tmp / "read.jsonl"
    write_log(log, events)
    write_log(jsonl, events)
    payloads = split_payloads(log)
    runs: dict[str, list[float]] = {}
    for _ in range(repeat):
        # Interleaved: each floor beside the runs it is the floor of.
        timed(runs, "encode_into", lambda: bare_encode_into(events))
        timed(runs, "tap", lambda: tap(events, tmp / "tap.evlog"))
        timed(runs, "encode_into_2", lambda: bare_encode_into(events))
        timed(runs, "write_log", lambda: write_log_run(events, tmp / "write.evlog"))
        timed(runs, "encode", lambda: bare_encode(events))
        timed(runs, "write_log_unstamped", lambda: write_log_run(unstamped, tmp / "u.evlog"))
        timed(runs, "decode", lambda: bare_decode(payloads))
        timed(runs, "read", lambda: read(log, n))
        timed(runs, "jsonl_tap", lambda: tap(events, tmp / "tap.jsonl"))
        timed(runs, "jsonl_tap_nan", lambda: tap(nan_events, tmp / "nan.jsonl"))
        timed(runs, "jsonl_read", lambda: read(jsonl, n))
    bus_n = n // 4
    for _ in range(repeat):
        # Fresh events for each run (built untimed): a bus stamps what it is given in place.
        plain, recorded = make_events(bus_n, stamped=False), make_events(bus_n, stamped=False)
        timed(runs, "bus", partial(anyio.run, publish_all, plain, None))
        timed(runs, "bus_recorded", partial(anyio.run, publish_all, recorded, tmp / "b.evlog"))
    per = 1e9 / n
    r = runs

    def ratios(ours: str, floor: str, *, rate: bool = False) -> dict[str, float]:
        pairs = [f / o if rate else o / f for o, f in zip(r[ours], r[floor], strict=True)]
        return spread(pairs, digits=2)

    bus_per = 1e9 / bus_n
    added = [b - a for a, b in zip(r["bus"], r["bus_recorded"], strict=True)]
    return {
        "events": n,
        "repeat": repeat,
        "bytes_per_event": round(log.stat().st_size / n, 1),
        "record": {
            "bare_encode_into_ns": spread(r["encode_into"] + r["encode_into_2"], per),
            "bare_encode_ns": spread(r["encode"], per),
            "tap_ns": spread(r["tap"], per),
            "write_log_ns": spread(r["write_log"], per),
            "write_log_unstamped_ns": spread(r["write_log_unstamped"], per),
            "tap_x_bare_encode": ratios("tap", "encode_into"),
            "write_log_x_bare_encode": ratios("write_log", "encode_into_2"),
            "write_log_x_bare_encode_bytes": ratios("write_log", "encode"),
            "write_log_unstamped_x_bare_encode": ratios("write_log_unstamped", "encode_into_2"),
        },
        "read": {
            "bare_decode_ns": spread(r["decode"], per),
            "read_ns": spread(r["read"], per),
            "events_per_s": round(n / statistics.median(r["read"])),
            "bare_decode_per_s": round(n / statistics.median(r["decode"])),
            "x_bare_decode_rate": ratios("read", "decode", rate=True),
        },
        "jsonl": {
            "tap_ns": spread(r["jsonl_tap"], per),
            "tap_nan_ns": spread(r["jsonl_tap_nan"], per),
            "read_ns": spread(r["jsonl_read"], per),
            "bytes_per_event": round(jsonl.stat().st_size / n, 1),
        },
        "bus": {
            "events": bus_n,
            "publish_ns": spread(r["bus"], bus_per),
            "publish_recorded_ns": spread(r["bus_recorded"], bus_per),
            "added_ns": spread(added, bus_per),
        },
    }


def measure_replay(n: int, repeat: int, tmp: Path) -> dict[str, Any]:
    """Replay from the log file (reading included) and, for comparison, from decoded events."""
    log = tmp / "replay.evlog"
    write_log(log, make_events(n))
    with LogReader(log) as reader:
        decoded = list(reader)
    files, lists = [], []
    for _ in range(repeat):
        gc.collect()
        files.append(anyio.run(replay_log, log))
        gc.collect()
        lists.append(anyio.run(replay_events, decoded))
    del decoded
    log.unlink()
    per_million = 1e6 / n
    return {
        "events": n,
        "from_file_s_per_million": spread(files, per_million, 3),
        "from_events_s_per_million": spread(lists, per_million, 3),
    }


def memory(m: int, tmp: Path) -> dict[str, Any]:
    log = tmp / "memory.evlog"
    # Written a million at a time: the events of a big log must not all be in this process.
    with LogRecorder(log, fsync="never", batch_bytes=1 << 20) as recorder:
        for first in range(0, m, 1_000_000):
            recorder.write_many(make_events(min(1_000_000, m - first), first=first))
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


def read_rss(path: str) -> None:
    """In a fresh process: stream the log, print peak RSS before and after."""
    before = peak_rss_mb()
    start = time.perf_counter()
    count = 0
    with LogReader(path) as reader:
        for _ in reader:
            count += 1
    elapsed = time.perf_counter() - start
    print(
        json.dumps(
            {
                "events": count,
                "peak_rss_mb_before_read": round(before, 1),
                "peak_rss_mb": round(peak_rss_mb(), 1),
                "seconds": round(elapsed, 2),
            }
        )
    )


def targets_of(results: dict[str, Any]) -> list[dict[str, Any]]:
    rec, rd, rep, mem = results["record"], results["read"], results["replay"], results["memory"]
    floor_ns = rec["bare_encode_into_ns"]["median"]
    encode_peer = f"msgspec encode_into {floor_ns:.0f} ns/event"
    scaled = rep["events"] != 1_000_000
    replay_name = (
        f"replay (s per 1M, from {rep['events'] // 1000}k)" if scaled else "replay 1M events (s)"
    )
    memory_name = f"peak RSS reading a log of {mem['events']:,} events (MB)"
    return [
        target(
            "log recording, tap (x bare encode)",
            rec["tap_x_bare_encode"]["median"],
            RECORD_TARGET,
            "x",
            peer=encode_peer,
        ),
        target(
            "log recording, write_log (x bare encode)",
            rec["write_log_x_bare_encode"]["median"],
            RECORD_TARGET,
            "x",
            peer=encode_peer,
        ),
        target(
            "log streaming read (x bare decode rate)",
            rd["x_bare_decode_rate"]["median"],
            READ_TARGET,
            "x",
            better="higher",
            peer=f"msgspec decode {rd['bare_decode_per_s'] / 1e6:.2f} M events/s",
        ),
        target(replay_name, rep["from_file_s_per_million"]["median"], REPLAY_TARGET_S, "s"),
        target(memory_name, mem["peak_rss_mb"], MEMORY_TARGET_MB, "MB"),
    ]


def print_table(results: dict[str, Any]) -> None:
    rec, rd, jl, bus = results["record"], results["read"], results["jsonl"], results["bus"]
    rep, mem = results["replay"], results["memory"]
    print(
        f"events: {results['events']:,} Reports, 4 metrics, {results['bytes_per_event']} bytes "
        f"per record; median (min-max) of {results['repeat']} interleaved runs  (pid {os.getpid()})"
    )
    print(
        f"bare encode:  encode_into {figure(rec['bare_encode_into_ns'], ' ns')}, "
        f"encode {figure(rec['bare_encode_ns'], ' ns')} per event"
    )
    print(
        f"tap:          {figure(rec['tap_ns'], ' ns')} per event = "
        f"{figure(rec['tap_x_bare_encode'], 'x')} bare encode_into"
    )
    print(
        f"write_log:    {figure(rec['write_log_ns'], ' ns')} per event = "
        f"{figure(rec['write_log_x_bare_encode'], 'x')} bare encode_into "
        f"({figure(rec['write_log_x_bare_encode_bytes'], 'x')} bare encode); unstamped events "
        f"{figure(rec['write_log_unstamped_ns'], ' ns')}"
    )
    print(
        f"read:         {rd['events_per_s']:,} events/s, {figure(rd['read_ns'], ' ns')} per event "
        f"= {figure(rd['x_bare_decode_rate'], 'x')} the bare decode rate "
        f"({rd['bare_decode_per_s']:,}/s, {figure(rd['bare_decode_ns'], ' ns')})"
    )
    print(
        f"replay:       {figure(rep['from_file_s_per_million'], ' s')} per million from the file "
        f"({rep['events']:,} events); {figure(rep['from_events_s_per_million'], ' s')} from "
        "decoded events"
    )
    print(
        f"memory:       streaming {mem['events']:,} events ({mem['log_mb']} MB log): peak RSS "
        f"{mem['peak_rss_mb']} MB (before reading {mem['peak_rss_mb_before_read']} MB)"
    )
    print(
        f"jsonl:        tap {figure(jl['tap_ns'], ' ns')} (NaN metric: "
        f"{figure(jl['tap_nan_ns'], ' ns')}), read {figure(jl['read_ns'], ' ns')} per event; "
        f"{jl['bytes_per_event']} bytes/event"
    )
    print(
        f"bus:          recorder attached adds {figure(bus['added_ns'], ' ns')} per event "
        f"(publishing {figure(bus['publish_ns'], ' ns')}, {bus['events']:,} events)"
    )
    print_targets(targets_of(results))


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--events", type=int, default=200_000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--replay-events", type=int, default=1_000_000)
    parser.add_argument("--memory-events", type=int, default=1_000_000)
    parser.add_argument("--full", action="store_true", help="memory check with 10 million events")
    parser.add_argument(
        "--quick", action="store_true", help="50,000 events, 3 repeats, replay and memory 200,000"
    )
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.add_argument("--read-rss", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.read_rss:
        read_rss(args.read_rss)
        return 0
    if args.quick:
        args.events, args.repeat, args.replay_events, args.memory_events = (
            50_000,
            3,
            200_000,
            200_000,
        )
    with tempfile.TemporaryDirectory(prefix="bench_log") as tmp:
        results = measure(args.events, args.repeat, Path(tmp))
        results["replay"] = measure_replay(args.replay_events, min(args.repeat, 3), Path(tmp))
        results["memory"] = memory(10_000_000 if args.full else args.memory_events, Path(tmp))
    if args.json:
        results["python"] = sys.version.split()[0]
        results["targets"] = targets_of(results)
        json.dump(results, sys.stdout, indent=2)
        print()
        return 0
    print_table(results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
