"""Cost of a state snapshot of 100 stateful callbacks, atomic write included.

Times ``StateStore.snapshot`` (take every state, check it as strict JSON,
encode, write a temporary file, fsync, rename, fsync the directory) against
floors measured in the same run, interleaved: a plain loop calling each
``state()`` and ``json.dumps`` of the result (the in-memory floor), and that
plus the same durable write done by hand (the I/O floor). Target: median
under 10 ms on this machine. Ratios matter, not absolutes; fsync cost depends
on the disk under ``--dir``.

    python benchmarks/bench_state.py [--callbacks 100] [--repeat 200] [--dir DIR] [--quick] [--json]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _harness import target

from eventbus.state import StateStore
from eventbus.state._model import CallbackState

TARGET_MS = 10.0


class Tracker:
    """A realistic state: early stopping plus a short top-k list of checkpoints."""

    def __init__(self, index: int, patience: int = 5, mode: str = "min") -> None:
        self.index = index
        self.patience = patience
        self.mode = mode
        self.counter = index % patience
        self.best: float | None = 0.125 * index
        self.top_k = [[0.5 + i, f"checkpoint-{index}-{i}"] for i in range(3)]

    @property
    def state_key(self) -> str:
        return str(self.index)

    def state(self) -> CallbackState:
        return {
            "args": {"index": self.index, "patience": self.patience, "mode": self.mode},
            "attributes": {"counter": self.counter, "best": self.best, "top_k": self.top_k},
        }


def in_memory_floor(callbacks: list[Tracker]) -> tuple[float, bytes]:
    start = time.perf_counter()
    data = json.dumps({str(i): cb.state() for i, cb in enumerate(callbacks)}).encode()
    return time.perf_counter() - start, data


def io_floor(callbacks: list[Tracker], directory: Path) -> float:
    start = time.perf_counter()
    data = json.dumps({str(i): cb.state() for i, cb in enumerate(callbacks)}).encode()
    temporary, target = directory / "floor.tmp", directory / "floor.json"
    with open(temporary, "wb") as file:
        file.write(data)
        file.flush()
        os.fsync(file.fileno())
    os.replace(temporary, target)
    fd = os.open(directory, os.O_RDONLY)
    os.fsync(fd)
    os.close(fd)
    return time.perf_counter() - start


def run(n: int, repeat: int, root: Path) -> dict[str, Any]:
    callbacks = [Tracker(i) for i in range(n)]
    store = StateStore(root)
    store.register(callbacks)
    (root / "floor").mkdir(exist_ok=True)
    times: dict[str, list[float]] = {"snapshot": [], "in_memory_floor": [], "io_floor": []}
    store.snapshot(str(root / "warmup"))  # locations are taken from the cwd: spell them out
    gc.collect()
    for i in range(repeat):
        times["in_memory_floor"].append(in_memory_floor(callbacks)[0])
        times["io_floor"].append(io_floor(callbacks, root / "floor"))
        start = time.perf_counter()
        event = store.snapshot(str(root / f"checkpoint-{i % 4}"))  # rewrites: replace, not append
        times["snapshot"].append(time.perf_counter() - start)
        assert not event.errors and len(event.keys) == n
    ms = {name: statistics.median(values) * 1e3 for name, values in times.items()}
    p90 = sorted(times["snapshot"])[int(0.9 * repeat)] * 1e3
    size = store.path_of(str(root / "checkpoint-0")).stat().st_size
    return {
        "python": sys.version.split()[0],
        "callbacks": n,
        "repeat": repeat,
        "file_bytes": size,
        "median_ms": {name: round(v, 3) for name, v in ms.items()},
        "snapshot_p90_ms": round(p90, 3),
        "ratio_to_io_floor": round(ms["snapshot"] / ms["io_floor"], 2),
        "overhead_over_io_floor_ms": round(ms["snapshot"] - ms["io_floor"], 3),
        "target_ms": TARGET_MS,
        "meets_target": ms["snapshot"] < TARGET_MS,
    }


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--callbacks", type=int, default=100)
    parser.add_argument("--repeat", type=int, default=200)
    parser.add_argument("--dir", type=Path, default=None, help="where to write (default: temp)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of text")
    parser.add_argument("--quick", action="store_true", help="40 repeats instead of 200")
    args = parser.parse_args()
    if args.quick:
        args.repeat = 40

    with tempfile.TemporaryDirectory(dir=args.dir) as root:
        result = run(args.callbacks, args.repeat, Path(root))
    result["targets"] = [
        target(
            f"snapshot of {args.callbacks} stateful callbacks, atomic write (ms)",
            result["median_ms"]["snapshot"],
            TARGET_MS,
            "ms",
        )
    ]
    if args.json:
        json.dump(result, sys.stdout, indent=2)
        print()
        return 0
    ms = result["median_ms"]
    print(
        f"Python {result['python']}: snapshot of {result['callbacks']} stateful callbacks "
        f"({result['file_bytes']} bytes), median of {result['repeat']}"
    )
    print(f"  in-memory floor (state() loop + json.dumps): {ms['in_memory_floor']:.3f} ms")
    print(f"  I/O floor (+ write, fsync, rename, fsync dir): {ms['io_floor']:.3f} ms")
    print(
        f"  StateStore.snapshot:                         {ms['snapshot']:.3f} ms "
        f"(p90 {result['snapshot_p90_ms']:.3f} ms, "
        f"{result['ratio_to_io_floor']:.2f}x the I/O floor, "
        f"+{result['overhead_over_io_floor_ms']:.3f} ms)"
    )
    verdict = "meets" if result["meets_target"] else "MISSES"
    print(f"  target < {TARGET_MS:.0f} ms median: {verdict}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
