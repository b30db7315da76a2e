"""Crash-test writer: runs as ``python _crash_writer.py WORKDIR TRIALS SEED``.

It imports the library once, then for each trial forks a writer that
appends events to a log and snapshots a callback state, reporting its
progress on a pipe, and kills that writer with SIGKILL after a random
delay. One JSON line per trial goes to stdout: where the writer wrote, how
far it said it got, and how it was configured. A third of the logs are
``hostile``: NaN and ±inf in every event and now and then a value the
encoder cannot take (a placeholder in the log). Forking from this small
single-threaded process (not from pytest) makes each kill cheap, so the
test can afford many random kill points.

The writer reports a count only after the call that made it durable
against a process crash returned: ``flush`` (the bytes are in the kernel)
for the log, ``snapshot`` (renamed into place) for the state.
"""

from __future__ import annotations

import json
import math
import os
import random
import select
import signal
import sys
import time
from pathlib import Path
from typing import Any

import msgspec

from eventbus import Report, configure_logging
from eventbus.log import LogRecorder
from eventbus.state import StateStore

#: A writer that was not killed stops by itself after this long (it never should be).
WRITER_LIMIT = 5.0
#: The checkpoint the writer snapshots, inside the state store's root.
CHECKPOINT = "ckpt"


def expected_event(i: int) -> Report:
    """The ``i``-th event of every log: deterministic, of varied size."""
    return Report(
        run_id="crash",
        rank=i % 4,
        world_size=4,
        index=i // 4,
        metrics={"loss": 1.0 / (i + 1), "step": i, "note": "n" * (i * 37 % 300)},
        checkpoint=f"ckpt-{i}" if i % 50 == 0 else None,
    )


#: In a ``hostile`` log, every event whose number leaves this remainder by 7 holds
#: a value no encoder takes (recorded as a placeholder); the others a NaN or an inf.
UNENCODABLE_EVERY = (7, 3)


def hostile_event(i: int) -> Report:
    """The ``i``-th event of a ``hostile`` log: NaN and ±inf, and now and then a Path."""
    event = expected_event(i)
    strange: dict[str, Any] = {"loss": (math.nan, math.inf, -math.inf)[i % 3]}
    if i % UNENCODABLE_EVERY[0] == UNENCODABLE_EVERY[1]:
        strange["path"] = Path(f"/ckpt/{i}")
    return msgspec.structs.replace(event, metrics=event.metrics | strange)


class Counter:
    """A stateful callback whose state grows with the run (so a snapshot takes a while)."""

    def __init__(self, n: int = 0) -> None:
        self.n = n
        self.history: list[int] = []

    def state(self) -> dict[str, Any]:
        return {"args": {"n": self.n}, "attributes": {"history": self.history}}


def write_forever(directory: Path, config: dict[str, Any], progress: int) -> None:
    """The writer: events and snapshots, progress to the ``progress`` pipe, until killed."""

    def say(line: str) -> None:
        os.write(progress, f"{line}\n".encode())

    log = directory / ("events.jsonl" if config["format"] == "jsonl" else "events.evlog")
    make = hostile_event if config["values"] == "hostile" else expected_event
    recorder = LogRecorder(
        log, run_id="crash", fsync=config["fsync"], batch_bytes=config["batch_bytes"]
    )
    store = StateStore(directory / "state")
    counter = Counter()
    store.register([counter])
    say("ready")
    deadline = time.monotonic() + WRITER_LIMIT
    i = 0
    while time.monotonic() < deadline:
        recorder.write(make(i))
        i += 1
        if i % config["flush_every"] == 0:
            recorder.flush()
            say(f"L {i}")
        if i % config["snapshot_every"] == 0:
            counter.n = i
            counter.history = list(range(i % 2000))
            store.snapshot(str(store.root / CHECKPOINT), run_id="crash")
            say(f"S {i}")


def drain_until(fd: int, deadline: float) -> bytes:
    """What the writer reports until ``deadline`` (read as it comes: a full pipe would stall it)."""
    data = b""
    while (left := deadline - time.monotonic()) > 0:
        ready, _, _ = select.select([fd], [], [], left)
        if ready:
            chunk = os.read(fd, 65536)
            if not chunk:
                break
            data += chunk
    return data


def parse_progress(data: bytes) -> tuple[int, int, bool]:
    """Last flushed record count and last snapshot count the writer reported."""
    flushed = snapped = 0
    ready = False
    for line in data.decode().splitlines():
        if line == "ready":
            ready = True
        elif line.startswith("L "):
            flushed = int(line[2:])
        elif line.startswith("S "):
            snapped = int(line[2:])
    return flushed, snapped, ready


def trial(directory: Path, rng: random.Random) -> dict[str, Any]:
    config = {
        "format": rng.choice(("msgpack", "msgpack", "jsonl")),
        "fsync": rng.choice(("never", "never", "batch")),
        "batch_bytes": rng.choice((64, 512, 4096, 65536)),
        "flush_every": rng.randint(1, 40),
        "snapshot_every": rng.randint(20, 400),
        "values": rng.choice(("plain", "plain", "hostile")),
    }
    directory.mkdir(parents=True)
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the writer
        os.close(read_end)
        try:
            write_forever(directory, config, write_end)
        finally:
            os._exit(3)
    os.close(write_end)
    # Wait until the writer is writing, then kill it at a random point.
    data = os.read(read_end, 6)
    delay = rng.uniform(0.0, 0.12)
    data += drain_until(read_end, time.monotonic() + delay)
    os.kill(pid, signal.SIGKILL)
    _, status = os.waitpid(pid, 0)
    while chunk := os.read(read_end, 65536):
        data += chunk
    os.close(read_end)
    flushed, snapped, ready = parse_progress(data)
    return {
        "dir": str(directory),
        "config": config,
        "ready": ready,
        "killed": os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL,
        "flushed": flushed,
        "snapped": snapped,
        "delay": delay,
    }


def main(argv: list[str]) -> int:
    workdir, trials, seed = Path(argv[0]), int(argv[1]), int(argv[2])
    configure_logging("ERROR")  # stdout is for the results: the recorder's warnings go away
    rng = random.Random(seed)
    for t in range(trials):
        result = trial(workdir / f"trial-{seed}-{t}", rng)
        sys.stdout.write(json.dumps(result) + "\n")
        sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
