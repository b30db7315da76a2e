"""Snapshot files: where they go, what a planted file can do to a reader, atomic under SIGKILL.

Worker-reported locations must lie inside the root (relative ones are taken
from the cwd, like every other path: issue 20); the checkpoint an operator
resumes from may be anywhere, but the snapshot file inside it is confined
and must be a regular file of bounded size (issue 15); deep or unresolvable
locations are ``StatePathError`` (issue 19); a writer never deletes another
writer's temporary file (issue 17).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import stat
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from adapters._hf_state import read_hf_trainer_state
from eventbus.state import StateStore
from eventbus.state._files import LEFTOVER_AGE, STATE_FILENAME, StatePathError, atomic_write
from eventbus.state._model import CallbackState, StateFormatError


class Counter:
    def __init__(self, start: int = 0) -> None:
        self.start = start
        self.count = start

    def state(self) -> CallbackState:
        return {"args": {"start": self.start}, "attributes": {"count": self.count}}


class Blob:
    """A state of ``size`` characters, to push a snapshot over its size limit."""

    def __init__(self, size: int = 0) -> None:
        self.size = size
        self.data = "x" * size

    def state(self) -> CallbackState:
        return {"args": {"size": self.size}, "attributes": {"data": self.data}}


def saved_store(root: Path, checkpoint: Path, count: int = 5) -> StateStore:
    store = StateStore(root)
    store.register([Counter(count)])
    store.snapshot(str(checkpoint))
    return store


# --- where snapshots go (issues 19, 20) ----------------------------------------------


@pytest.mark.parametrize(
    "checkpoint", ["../../etc", "..", "a/../../b", "/etc", "/tmp/elsewhere", "", "."]
)
def test_path_traversal_outside_the_root_is_rejected(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, checkpoint: str
) -> None:
    root = tmp_path / "root"
    root.mkdir()
    monkeypatch.chdir(root)  # relative locations are taken from here: still not outside
    store = StateStore(root)
    store.register([Counter()])
    with pytest.raises(StatePathError, match=r"outside the state root|invalid checkpoint"):
        store.snapshot(checkpoint)
    with pytest.raises(StatePathError, match=r"outside the state root|invalid checkpoint"):
        store.path_of(checkpoint)
    assert list(tmp_path.rglob(STATE_FILENAME)) == []


def test_symlink_pointing_outside_the_root_is_rejected(tmp_path: Path) -> None:
    root, outside = tmp_path / "root", tmp_path / "outside"
    root.mkdir()
    outside.mkdir()
    (root / "link").symlink_to(outside)
    store = StateStore(root)
    store.register([Counter()])
    with pytest.raises(StatePathError, match="outside the state root"):
        store.snapshot(str(root / "link" / "ckpt"))
    assert list(outside.iterdir()) == []


def test_locations_inside_the_root_are_accepted_relative_to_the_cwd_or_absolute(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    store = StateStore(tmp_path)
    store.register([Counter(5)])
    event = store.snapshot(str(tmp_path / "run" / "ckpt-1"))
    assert event.path == str(tmp_path / "run" / "ckpt-1" / STATE_FILENAME)
    assert store.load("run/ckpt-1").states == store.load(str(tmp_path / "run/./x/../ckpt-1")).states
    # A symlink that stays inside the root is fine.
    (tmp_path / "latest").symlink_to(tmp_path / "run" / "ckpt-1")
    assert store.load("latest").states


def test_relative_location_is_taken_from_the_cwd_not_from_the_root_a_second_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 20: ``eventbus demo --out runs/a`` reports ``runs/a/checkpoint_000010`` with
    the root ``runs/a``; the snapshot went to ``runs/a/runs/a/checkpoint_000010``."""
    monkeypatch.chdir(tmp_path)
    store = StateStore("runs/a")
    store.register([Counter(3)])
    event = store.snapshot("runs/a/checkpoint_000010")
    expected = tmp_path / "runs" / "a" / "checkpoint_000010" / STATE_FILENAME
    assert event.path == str(expected) and expected.is_file()
    assert not (tmp_path / "runs" / "a" / "runs").exists()
    assert store.load("runs/a/checkpoint_000010").states
    # A bare name is relative to the cwd too, so here it is outside the root.
    with pytest.raises(StatePathError, match="outside the state root"):
        store.snapshot("checkpoint_000020")


def test_resume_from_a_checkpoint_outside_the_root(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 20: ``--resume runs/a/checkpoint_000040 --out runs/b``: the operator's own
    checkpoint may be anywhere; only worker-reported locations are confined."""
    monkeypatch.chdir(tmp_path)
    saved_store(tmp_path / "runs" / "a", tmp_path / "runs" / "a" / "checkpoint_000040", 7)
    store = StateStore("runs/b")
    restored, report = store.restore([Counter()], "runs/a/checkpoint_000040")
    assert isinstance(restored[0], Counter) and restored[0].count == 7
    assert report.warnings == ()
    assert store.load(tmp_path / "runs" / "a" / "checkpoint_000040").states
    assert store.resume_path_of("runs/a/checkpoint_000040") == (
        tmp_path / "runs" / "a" / "checkpoint_000040" / STATE_FILENAME
    )
    # Later snapshots (worker-reported) still go under the new root only.
    with pytest.raises(StatePathError, match="outside the state root"):
        store.snapshot("runs/a/checkpoint_000050")
    # An operator path with no snapshot: every callback starts fresh, as for an old checkpoint.
    _, report = store.restore([Counter()], tmp_path / "nowhere")
    assert report.warnings[0].startswith("no callback state snapshot at")


def test_checkpoint_that_is_a_file_gets_its_snapshot_beside_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "model.pt").write_bytes(b"weights")
    store = StateStore(tmp_path)
    store.register([Counter(1)])
    event = store.snapshot("model.pt")
    assert event.path == str(tmp_path / f"model.pt.{STATE_FILENAME}")
    assert (tmp_path / "model.pt").read_bytes() == b"weights"
    assert store.load("model.pt").states


@pytest.mark.parametrize(
    "checkpoint",
    [
        "a/" * 3000,  # thousands of components, past PATH_MAX
        "a/" * 1000,  # thousands of characters: RecursionError in pathlib's mkdir
        "/".join(["x" * 300] * 3),  # a component longer than NAME_MAX
        "x" * 5000,
    ],
    ids=["3000-deep", "1000-deep", "long-component", "5000-chars"],
)
def test_very_deep_or_long_location_is_a_path_error_not_recursion(
    tmp_path: Path, checkpoint: str
) -> None:
    """Issue 19: a deep location raised ``RecursionError`` from ``snapshot``."""
    store = StateStore(tmp_path)
    store.register([Counter()])
    for location in (checkpoint, str(tmp_path / checkpoint)):
        with pytest.raises(StatePathError):
            store.snapshot(location)
        with pytest.raises(StatePathError):
            store.load(location)
        with pytest.raises(StatePathError):
            store.restore([Counter()], location)
    assert list(tmp_path.iterdir()) == []


def test_symlink_loop_nul_and_undecodable_names_are_path_errors(tmp_path: Path) -> None:
    (tmp_path / "loop").symlink_to(tmp_path / "loop")
    store = StateStore(tmp_path)
    store.register([Counter()])
    for location in (
        str(tmp_path / "loop" / "ckpt"),
        "ckpt\x00",
        str(tmp_path) + "/\x00",
        str(tmp_path / "undecodable\udcff"),  # not UTF-8: no snapshot could record it
    ):
        with pytest.raises(StatePathError):
            store.snapshot(location)
        with pytest.raises(StatePathError):
            store.load(location)


def test_a_directory_swapped_for_a_symlink_after_the_check_is_not_followed(
    tmp_path: Path,
) -> None:
    """Directories are opened one by one with O_NOFOLLOW from the root: a component that
    became a symlink since the location was resolved is refused, not written through."""
    root, outside = tmp_path / "root", tmp_path / "outside"
    root.mkdir()
    outside.mkdir()
    (root / "ckpt").symlink_to(outside)  # as if swapped in after state_path resolved it
    with pytest.raises(StatePathError, match="symbolic link"):
        atomic_write(root / "ckpt" / STATE_FILENAME, b"{}", within=root)
    assert list(outside.iterdir()) == []


# --- what a planted snapshot file can do to the reader (issue 15) -----------------


def test_snapshot_file_that_is_a_symlink_out_of_the_root_is_refused(tmp_path: Path) -> None:
    root, outside = tmp_path / "root", tmp_path / "outside"
    secret = saved_store(outside, outside / "ckpt", 99).path_of(str(outside / "ckpt"))
    store = saved_store(root, root / "ckpt")
    planted = store.path_of(str(root / "ckpt"))
    planted.unlink()
    planted.symlink_to(secret)  # a valid snapshot: only the link gives it away
    for call in (
        lambda: store.load(str(root / "ckpt")),
        lambda: store.restore([Counter()], str(root / "ckpt")),
    ):
        with pytest.raises(StatePathError, match=r"callback_state\.json.*link out of"):
            call()
    # A link to another snapshot inside the root is fine.
    saved_store(root, root / "other", 11)
    planted.unlink()
    planted.symlink_to(root / "other" / STATE_FILENAME)
    assert store.load(str(root / "ckpt")).states


def test_resumed_checkpoint_outside_the_root_confines_its_snapshot_to_its_directory(
    tmp_path: Path,
) -> None:
    elsewhere = tmp_path / "elsewhere"
    saved_store(elsewhere, elsewhere / "ckpt-1", 1)
    saved_store(elsewhere, elsewhere / "ckpt-2", 2)
    planted = elsewhere / "ckpt-2" / STATE_FILENAME
    planted.unlink()
    planted.symlink_to(elsewhere / "ckpt-1" / STATE_FILENAME)  # out of ckpt-2
    store = StateStore(tmp_path / "root")
    with pytest.raises(StatePathError, match="link out of"):
        store.load(elsewhere / "ckpt-2")
    # Inside its own directory, a link is fine.
    (elsewhere / "ckpt-2" / "real.json").write_bytes(
        (elsewhere / "ckpt-1" / STATE_FILENAME).read_bytes()
    )
    planted.unlink()
    planted.symlink_to("real.json")
    assert store.load(elsewhere / "ckpt-2").states


_READ_IN_A_CHILD = textwrap.dedent(
    """
    import resource, sys
    # Bounded, so that a reader which reads without limit fails here instead of the host.
    resource.setrlimit(resource.RLIMIT_AS, (2 * 2**30, 2 * 2**30))
    from adapters._hf_state import read_hf_trainer_state
    from eventbus.state import StateStore
    try:
        if sys.argv[1] == "hf":
            read_hf_trainer_state(sys.argv[2])
        else:
            StateStore(sys.argv[1]).load(sys.argv[2])
    except Exception as exc:
        print(type(exc).__name__, exc)
    else:
        print("loaded")
    """
)


def read_in_a_child(root: str, target: str) -> str:
    """Load in a child process: a reader that hangs on a FIFO or reads /dev/zero forever
    fails the test through ``timeout`` instead of hanging the suite (nothing is timed)."""
    child = subprocess.run(
        [sys.executable, "-c", _READ_IN_A_CHILD, root, target],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert child.returncode == 0, child.stderr
    return child.stdout.strip()


def test_fifo_or_dev_zero_in_place_of_a_snapshot_is_refused_without_reading(
    tmp_path: Path,
) -> None:
    root = tmp_path / "root"
    (root / "fifo").mkdir(parents=True)
    os.mkfifo(root / "fifo" / STATE_FILENAME)
    (root / "zero").mkdir()
    (root / "zero" / STATE_FILENAME).symlink_to("/dev/zero")
    fifo = read_in_a_child(str(root), str(root / "fifo"))
    assert fifo.startswith("StateFormatError") and "a FIFO" in fifo and STATE_FILENAME in fifo
    zero = read_in_a_child(str(root), str(root / "zero"))
    assert zero.startswith("StatePathError") and "link out of" in zero
    # An HF trainer_state.json is the operator's file: links are followed (Hub caches
    # are symlinks), but what they lead to must still be a regular file.
    hf = tmp_path / "hf"
    hf.mkdir()
    os.mkfifo(hf / "fifo.json")
    (hf / "zero.json").symlink_to("/dev/zero")
    for name in ("fifo.json", "zero.json"):
        out = read_in_a_child("hf", str(hf / name))
        assert out.startswith("StateFormatError") and "not a regular file" in out, out


def test_device_node_inside_the_root_is_refused(tmp_path: Path) -> None:
    target = tmp_path / "ckpt" / STATE_FILENAME
    target.parent.mkdir()
    try:
        os.mknod(target, stat.S_IFCHR | 0o666, os.makedev(1, 5))  # /dev/zero's numbers
    except PermissionError:
        pytest.skip("creating a device node needs privileges")
    out = read_in_a_child(str(tmp_path), str(tmp_path / "ckpt"))
    assert out.startswith("StateFormatError") and "a device" in out


def test_directory_or_socket_in_place_of_a_snapshot_is_a_format_error(tmp_path: Path) -> None:
    store = StateStore(tmp_path)
    (tmp_path / "dir" / STATE_FILENAME).mkdir(parents=True)
    with pytest.raises(StateFormatError, match=r"callback_state\.json: a directory"):
        store.load(str(tmp_path / "dir"))
    (tmp_path / "sock").mkdir()
    with socket.socket(socket.AF_UNIX) as server:
        server.bind(str(tmp_path / "sock" / STATE_FILENAME))
        with pytest.raises(StateFormatError, match=r"callback_state\.json: not a regular file"):
            store.load(str(tmp_path / "sock"))


def test_snapshot_over_the_size_limit_is_refused_before_reading(tmp_path: Path) -> None:
    store = StateStore(tmp_path)
    assert store.max_bytes == 64 * 2**20
    target = tmp_path / "ckpt" / STATE_FILENAME
    target.parent.mkdir()
    with open(target, "wb") as file:
        file.truncate(10**12)  # sparse: a terabyte that costs nothing on disk
    with pytest.raises(StateFormatError, match=r"callback_state\.json: 1000000000000 bytes, over"):
        store.load(str(tmp_path / "ckpt"))
    small = StateStore(tmp_path, max_bytes=100)
    target.write_bytes(b'{"format": 1, "states": {}, "run_id": "' + b"r" * 100 + b'"}')
    with pytest.raises(StateFormatError, match="over the limit of 100 bytes"):
        small.load(str(tmp_path / "ckpt"))
    with pytest.raises(ValueError, match="max_bytes"):
        StateStore(tmp_path, max_bytes=0)


def test_a_state_too_big_for_the_limit_is_left_out_at_save_naming_its_callback(
    tmp_path: Path,
) -> None:
    """Each state that makes the file too big is reported by name, the rest is written
    (and fits, so it can be read back with the same limit)."""
    store = StateStore(tmp_path, max_bytes=20_000)
    big, bigger = Blob(8_000), Blob(30_000)
    bigger.state_key = "bigger"  # type: ignore[attr-defined]
    store.register([Counter(4), big, bigger])
    event = store.snapshot(str(tmp_path / "ckpt"))
    bigger_key = f"{__name__}.Blob[bigger]"
    assert list(event.errors) == [bigger_key]
    assert "its state is 30" in event.errors[bigger_key]
    assert "over the limit of 20000" in event.errors[bigger_key]
    assert event.keys == (f"{__name__}.Counter", f"{__name__}.Blob")
    assert Path(event.path).stat().st_size <= 20_000
    assert store.load(str(tmp_path / "ckpt")).states[f"{__name__}.Blob"]["attributes"]["data"]
    # Two big ones: both named, the small one still written.
    store = StateStore(tmp_path, max_bytes=5_000)
    store.register([Counter(4), big, bigger])
    event = store.snapshot(str(tmp_path / "ckpt-2"))
    assert set(event.errors) == {bigger_key, f"{__name__}.Blob"}
    assert event.keys == (f"{__name__}.Counter",)
    # A limit too small for even an empty snapshot is an error, and nothing is written.
    with pytest.raises(StateFormatError, match="even without any state"):
        StateStore(tmp_path, max_bytes=10).snapshot(str(tmp_path / "ckpt-3"))
    assert not (tmp_path / "ckpt-3").exists()


def test_hf_trainer_state_over_the_limit_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "trainer_state.json"
    path.write_text(json.dumps({"log_history": [0] * 100, "stateful_callbacks": {}}))
    with pytest.raises(StateFormatError, match="over the limit of 50 bytes"):
        read_hf_trainer_state(path, max_bytes=50)
    assert read_hf_trainer_state(path).states == {}


def test_missing_snapshot_is_file_not_found_naming_the_file(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError) as info:
        StateStore(tmp_path).load(str(tmp_path / "ckpt"))
    assert info.value.filename == str(tmp_path / "ckpt" / STATE_FILENAME)


# --- atomic writes -----------------------------------------------------------------


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


def test_atomic_write_syncs_file_and_directory_unless_told_it_need_not(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    synced: list[int] = []
    fsync = os.fsync

    def counted(fd: int) -> None:
        synced.append(fd)
        fsync(fd)

    monkeypatch.setattr(os, "fsync", counted)
    target = tmp_path / "state.json"
    atomic_write(target, b"durable")
    assert len(synced) == 2  # the file, then the directory holding its new name
    atomic_write(target, b"whole, not durable", durable=False)
    assert len(synced) == 2 and target.read_bytes() == b"whole, not durable"
    assert [p.name for p in tmp_path.iterdir()] == ["state.json"]


def test_atomic_write_replaces_a_symlink_never_writes_through_it(tmp_path: Path) -> None:
    outside = tmp_path / "outside.json"
    outside.write_text("keep")
    outside.chmod(0o600)
    target = tmp_path / "root" / "state.json"
    target.parent.mkdir()
    target.symlink_to(outside)
    atomic_write(target, b"new", within=tmp_path / "root")
    assert outside.read_text() == "keep" and not target.is_symlink()
    assert target.read_bytes() == b"new"


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
    from eventbus.state import StateStore

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
        store.snapshot(sys.argv[1] + "/ckpt")
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

        snapshot = store.load(str(tmp_path / "ckpt"))
        generations = {s["attributes"]["generation"] for s in snapshot.states.values()}
        assert len(snapshot.states) == 25 and len(generations) == 1
        generation = generations.pop()
        assert generation > last  # the rewrite before the kill, or a later one, never an older
        assert all(s["attributes"]["pad"] == [generation] * 400 for s in snapshot.states.values())
        last = generation
    # Killed writers may leave their temporary files, never a damaged snapshot.
    leftovers = [p for p in (tmp_path / "ckpt").iterdir() if p.name != STATE_FILENAME]
    assert all(p.name.startswith(f".{STATE_FILENAME}.") and p.suffix == ".tmp" for p in leftovers)


# --- leftovers of dead writers (issue 17) -------------------------------------------


def dead_pid() -> int:
    child = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        capture_output=True,
        text=True,
        check=True,
    )
    return int(child.stdout)


def test_only_leftovers_much_older_than_any_write_are_removed(tmp_path: Path) -> None:
    """By age on the file system's clock, never by pid: a fresh temporary file of a
    writer whose pid is not alive here (another host, another container) is kept."""
    target = tmp_path / STATE_FILENAME
    pid = dead_pid()
    old = tmp_path / f".{STATE_FILENAME}.{pid}.0123456789abcdef.tmp"
    old.write_bytes(b"half a snap")
    an_hour_and_more = time.time() - LEFTOVER_AGE - 600
    os.utime(old, (an_hour_and_more, an_hour_and_more))
    fresh = tmp_path / f".{STATE_FILENAME}.{pid}.fedcba9876543210.tmp"
    fresh.write_bytes(b"another host is writing")
    not_ours = tmp_path / ".other.json.1.abcd.tmp"
    not_ours.write_bytes(b"")
    os.utime(not_ours, (an_hour_and_more, an_hour_and_more))
    old_dir = tmp_path / f".{STATE_FILENAME}.{pid}.dddddddddddddddd.tmp"
    old_dir.mkdir()
    os.utime(old_dir, (an_hour_and_more, an_hour_and_more))
    atomic_write(target, b"{}")
    assert not old.exists()
    assert fresh.exists()  # its writer may still rename it
    assert not_ours.exists() and old_dir.is_dir()  # only our snapshot's regular files
    assert target.read_bytes() == b"{}"


_WRITER = textwrap.dedent(
    """
    import os, sys

    # As in two containers or on two hosts sharing a file system: the other writer's
    # pid cannot be looked up from here (in a pid namespace of its own it is not ours).
    real_kill = os.kill

    def kill(pid, sig):
        if pid != os.getpid():
            raise ProcessLookupError(pid)
        return real_kill(pid, sig)

    os.kill = kill

    from eventbus.state import StateStore

    class Padded:
        def __init__(self):
            self.n = 0

        def state(self):
            return {"args": {}, "attributes": {"n": self.n, "pad": [os.getpid()] * 3000}}

    root, writes = sys.argv[1], int(sys.argv[2])
    callback = Padded()
    store = StateStore(root)
    store.register([callback])
    print("ready", flush=True)
    sys.stdin.readline()
    failures = []
    for n in range(writes):
        callback.n = n
        try:
            store.snapshot(root + "/ckpt")
        except Exception as exc:
            failures.append(f"{type(exc).__name__}: {exc}")
    print(len(failures), failures[:3], flush=True)
    """
)


def test_two_writers_of_one_snapshot_never_delete_each_others_temporary_files(
    tmp_path: Path,
) -> None:
    """Issue 17: two processes rewrite the same snapshot at once, each unable to see the
    other's pid; deciding by pid, each deleted the other's in-flight file (62 of 200
    writes failed). Now every write succeeds and the file left is whole."""
    writes = 200
    children = [
        subprocess.Popen(
            [sys.executable, "-c", _WRITER, str(tmp_path), str(writes)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    results: list[Any] = []
    try:
        for child in children:
            assert child.stdout is not None
            assert child.stdout.readline() == "ready\n"
        for child in children:  # both start together
            assert child.stdin is not None
            child.stdin.write("go\n")
            child.stdin.flush()
        for child in children:
            out, err = child.communicate(timeout=300)
            assert child.returncode == 0, err
            results.append(out.strip())
    finally:
        for child in children:
            if child.poll() is None:
                child.kill()
                child.wait()
    assert results == ["0 []", "0 []"]
    snapshot = StateStore(tmp_path).load(str(tmp_path / "ckpt"))
    (state,) = snapshot.states.values()
    assert state["attributes"]["n"] == writes - 1
    assert len(set(state["attributes"]["pad"])) == 1
