"""Snapshot files: confined to the root, atomic under SIGKILL, versioned."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from eventbus import STATE_FILENAME, StatePathError, StateStore
from eventbus._state_files import atomic_write


class Counter:
    def __init__(self, start: int = 0) -> None:
        self.start = start
        self.count = start

    def state(self) -> dict[str, dict[str, int]]:
        return {"args": {"start": self.start}, "attributes": {"count": self.count}}


@pytest.mark.parametrize(
    "checkpoint", ["../../etc", "..", "a/../../b", "/etc", "/tmp/elsewhere", "", "."]
)
def test_path_traversal_outside_the_root_is_rejected(tmp_path: Path, checkpoint: str) -> None:
    root = tmp_path / "root"
    root.mkdir()
    store = StateStore(root)
    store.register([Counter()])
    with pytest.raises(StatePathError, match=r"outside the state root|invalid checkpoint"):
        store.snapshot(checkpoint)
    with pytest.raises(StatePathError):
        store.load(checkpoint)
    assert list(tmp_path.rglob(STATE_FILENAME)) == []


def test_symlink_pointing_outside_the_root_is_rejected(tmp_path: Path) -> None:
    root, outside = tmp_path / "root", tmp_path / "outside"
    root.mkdir()
    outside.mkdir()
    (root / "link").symlink_to(outside)
    store = StateStore(root)
    store.register([Counter()])
    with pytest.raises(StatePathError, match="outside the state root"):
        store.snapshot("link/ckpt")
    assert list(outside.iterdir()) == []


def test_locations_inside_the_root_are_accepted_relative_or_absolute(tmp_path: Path) -> None:
    store = StateStore(tmp_path)
    store.register([Counter(5)])
    event = store.snapshot(str(tmp_path / "run" / "ckpt-1"))
    assert event.path == str(tmp_path / "run" / "ckpt-1" / STATE_FILENAME)
    assert store.load("run/ckpt-1").states == store.load(str(tmp_path / "run/./x/../ckpt-1")).states
    # A symlink that stays inside the root is fine.
    (tmp_path / "latest").symlink_to(tmp_path / "run" / "ckpt-1")
    assert store.load("latest").states


def test_checkpoint_that_is_a_file_gets_its_snapshot_beside_it(tmp_path: Path) -> None:
    (tmp_path / "model.pt").write_bytes(b"weights")
    store = StateStore(tmp_path)
    store.register([Counter(1)])
    event = store.snapshot("model.pt")
    assert event.path == str(tmp_path / f"model.pt.{STATE_FILENAME}")
    assert (tmp_path / "model.pt").read_bytes() == b"weights"
    assert store.load("model.pt").states


def test_atomic_write_leaves_no_temporary_file_and_keeps_the_replaced_files_mode(
    tmp_path: Path,
) -> None:
    target = tmp_path / "trainer_state.json"
    target.write_text("old")
    target.chmod(0o640)
    atomic_write(target, b"new")
    assert target.read_bytes() == b"new"
    assert target.stat().st_mode & 0o777 == 0o640
    assert [p.name for p in tmp_path.iterdir()] == ["trainer_state.json"]


def test_atomic_write_failure_leaves_the_old_file_and_no_temporary(tmp_path: Path) -> None:
    target = tmp_path / "state.json"
    target.write_text("old")

    with pytest.raises(TypeError):
        atomic_write(target, "not bytes")  # type: ignore[arg-type]
    assert target.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["state.json"]


_REWRITER = textwrap.dedent(
    """
    import sys
    from eventbus import StateStore

    class Padded:
        # Big enough that a rewrite takes a while, so kills land mid-write.
        def __init__(self, index):
            self.index = index
            self.generation = 0

        @property
        def state_key(self):
            return str(self.index)

        def state(self):
            return {
                "args": {"index": self.index},
                "attributes": {"generation": self.generation, "pad": [self.generation] * 400},
            }

    callbacks = [Padded(i) for i in range(25)]
    store = StateStore(sys.argv[1])
    store.register(callbacks)
    generation = int(sys.argv[2])
    while True:
        generation += 1
        for callback in callbacks:
            callback.generation = generation
        store.snapshot("ckpt")
        if generation == int(sys.argv[2]) + 1:
            print("ready", flush=True)
    """
)


def test_crash_during_rewrite_always_leaves_a_whole_snapshot(tmp_path: Path) -> None:
    """SIGKILL a process that keeps rewriting one snapshot, at many points: the
    file left behind always loads, with every state from one and the same rewrite."""
    store = StateStore(tmp_path)
    last = 0
    for attempt in range(10):
        child = subprocess.Popen(
            [sys.executable, "-c", _REWRITER, str(tmp_path), str(last)],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert child.stdout is not None
        assert child.stdout.readline() == "ready\n"
        time.sleep(0.002 * attempt)  # a different point of the rewrite loop each time
        child.send_signal(signal.SIGKILL)
        child.wait()
        child.stdout.close()
        assert child.returncode == -signal.SIGKILL

        snapshot = store.load("ckpt")
        generations = {s["attributes"]["generation"] for s in snapshot.states.values()}
        assert len(snapshot.states) == 25 and len(generations) == 1
        generation = generations.pop()
        assert generation > last  # the rewrite before the kill, or a later one, never an older
        assert all(s["attributes"]["pad"] == [generation] * 400 for s in snapshot.states.values())
        last = generation
    # Killed writers may leave their temporary files, never a damaged snapshot.
    leftovers = [p for p in (tmp_path / "ckpt").iterdir() if p.name != STATE_FILENAME]
    assert all(p.name.startswith(f".{STATE_FILENAME}.") and p.suffix == ".tmp" for p in leftovers)


def test_leftovers_of_dead_writers_are_removed_on_the_next_write(tmp_path: Path) -> None:
    target = tmp_path / "callback_state.json"
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        capture_output=True,
        text=True,
        check=True,
    )
    stale = tmp_path / f".callback_state.json.{dead.stdout.strip()}.abcd1234.tmp"
    stale.write_bytes(b"half a snap")
    live = tmp_path / f".callback_state.json.{os.getppid()}.abcd1234.tmp"
    live.write_bytes(b"someone is writing")
    atomic_write(target, b"{}")
    assert not stale.exists()
    assert live.exists()  # its writer may still rename it
    assert target.read_bytes() == b"{}"
