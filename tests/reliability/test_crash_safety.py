"""Crash safety: a process writing a log and state snapshots, killed with SIGKILL at random points.

``_crash_writer.py`` forks writers and kills each at a random moment. For
every kill: the log reads back as exactly a prefix of the sequence written,
at least as long as what the writer last reported flushed; a torn last
record is reported as ``truncated`` and is the only thing after that prefix;
and the state snapshot the writer last reported is loadable (or a newer
one, never a damaged one). In ``hostile`` logs NaN and ±inf come back bit
for bit and unencodable events as placeholders, in both encodings.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from eventbus import EventPlaceholder
from eventbus._codec import encode_msgpack
from eventbus.log import LogReader
from eventbus.state import StateStore

from ._crash_writer import CHECKPOINT, UNENCODABLE_EVERY, expected_event, hostile_event
from ._figures import FIGURES

WRITER = Path(__file__).with_name("_crash_writer.py")
#: Kills per helper process; two helpers run side by side.
TRIALS = 90
HELPERS = 2


def run_writers(workdir: Path) -> list[dict[str, Any]]:
    helpers = [
        subprocess.Popen(
            [sys.executable, str(WRITER), str(workdir), str(TRIALS), str(seed)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        for seed in range(HELPERS)
    ]
    results = []
    for helper in helpers:
        out, err = helper.communicate(timeout=120)
        assert helper.returncode == 0, err.decode()
        results += [json.loads(line) for line in out.decode().splitlines()]
    return results


def check_log(directory: Path, flushed: int, hostile: bool) -> tuple[int, bool]:
    """The records read back and whether a torn tail was reported."""
    [log] = [p for p in directory.iterdir() if p.name.startswith("events.")]
    size = log.stat().st_size
    with LogReader(log) as reader:
        events = list(reader)
    assert reader.skipped == 0 and reader.placeholders == 0
    # Exactly a prefix of what was written, and at least what was reported flushed.
    assert len(events) >= flushed, (directory, len(events), flushed)
    for i, event in enumerate(events):
        if not hostile:
            assert event == expected_event(i), (directory, i)
        elif i % UNENCODABLE_EVERY[0] == UNENCODABLE_EVERY[1]:
            assert isinstance(event, EventPlaceholder), (directory, i)
            assert f"PosixPath('/ckpt/{i}')" in event.text, (directory, i)
        else:  # NaN included, bit for bit
            assert encode_msgpack(event) == encode_msgpack(hostile_event(i)), (directory, i)
    tail = reader.truncated
    if tail is not None:  # the torn record is the last thing in the file
        assert tail.index == len(events), (directory, tail)
        assert tail.offset + tail.size == size, (directory, tail, size)
        assert tail.size > 0
    return len(events), tail is not None


def check_state(directory: Path, snapped: int, snapshot_every: int) -> bool:
    """The last reported snapshot (or the one after it) loads; True if there was one."""
    store = StateStore(directory / "state")
    try:
        snapshot = store.load(str(store.root / CHECKPOINT))
    except FileNotFoundError:
        assert snapped == 0, directory  # nothing was reported written
        return False
    state = snapshot.states[next(iter(snapshot.states))]
    n = state["args"]["n"]
    assert n in (snapped, snapped + snapshot_every), (directory, n, snapped)
    assert state["attributes"]["history"] == list(range(n % 2000))
    return True


def test_sigkill_at_random_points_keeps_log_prefix_and_last_snapshot(tmp_path: Path) -> None:
    results = run_writers(tmp_path)
    assert len(results) == TRIALS * HELPERS
    records = torn = snapshots = leftovers = hostile_logs = 0
    for result in results:
        directory = Path(result["dir"])
        assert result["ready"] and result["killed"], result
        hostile = result["config"]["values"] == "hostile"
        count, was_torn = check_log(directory, result["flushed"], hostile)
        hostile_logs += hostile
        records += count
        torn += was_torn
        snapshots += check_state(directory, result["snapped"], result["config"]["snapshot_every"])
        leftovers += len(list((directory / "state").rglob("*.tmp")))
    # The kills must land after snapshots were written, not all before. (A torn record
    # is rare: the recorder writes whole records, so only a write the kernel splits
    # tears one; tests/test_log.py cuts logs at every byte for that case.)
    assert snapshots > len(results) // 2
    assert hostile_logs > len(results) // 10  # NaN and placeholders are crash-safe too
    FIGURES.add(
        "crash_safety",
        kills=len(results),
        records_checked=records,
        torn_tails_reported=torn,
        snapshots_loaded=snapshots,
        temp_files_left=leftovers,
        hostile_logs=hostile_logs,
        lost=0,
    )
