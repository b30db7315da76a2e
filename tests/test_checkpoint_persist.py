"""persist_checkpoint: a checkpoint outside the state dir is copied in, safely; one inside
is left alone."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from handlers._persist import CheckpointCopyError, persist_checkpoint


def snapshot(top: Path) -> dict[str, tuple[int, int]]:
    """Every path below ``top`` (and ``top``), with its mode and mtime, links not followed."""
    paths = [top, *top.rglob("*")]
    return {
        str(path.relative_to(top)): (path.lstat().st_mode, path.lstat().st_mtime_ns)
        for path in paths
    }


def contents(top: Path) -> dict[str, bytes | str | None]:
    """Every path below ``top``: a file's bytes, a link's target, None for a directory."""
    found: dict[str, bytes | str | None] = {}
    for path in sorted(top.rglob("*")):
        name = str(path.relative_to(top))
        if path.is_symlink():
            found[name] = os.readlink(path)
        elif path.is_dir():
            found[name] = None
        else:
            found[name] = path.read_bytes()
    return found


@pytest.fixture
def root(tmp_path: Path) -> Path:
    state = tmp_path / "state"
    state.mkdir()
    return state.resolve()


@pytest.fixture
def source(tmp_path: Path) -> Path:
    """A checkpoint outside the state dir, with nested directories."""
    checkpoint = tmp_path / "scratch" / "ckpt"
    (checkpoint / "model" / "shards").mkdir(parents=True)
    (checkpoint / "model" / "shards" / "0.bin").write_bytes(b"\x00\x01shard")
    (checkpoint / "model" / "config.json").write_text('{"layers": 2}')
    (checkpoint / "optimizer.pt").write_bytes(b"adam")
    (checkpoint / "empty").mkdir()
    return checkpoint


def test_inside_root_is_returned_unchanged_and_nothing_is_created(root: Path) -> None:
    (root / "ckpt").mkdir()
    (root / "ckpt" / "weights").write_bytes(b"w")
    before = snapshot(root)
    for location in (str(root / "ckpt"), str(root), str(root / "ckpt" / "weights")):
        assert persist_checkpoint(root, location, 1) is location
    assert snapshot(root) == before


def test_relative_location_inside_root_from_the_cwd_is_returned_as_given(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (root / "ckpt").mkdir()
    monkeypatch.chdir(root.parent)
    location = os.path.join("state", "ckpt")
    before = snapshot(root)
    assert persist_checkpoint(root, location, 1) is location
    monkeypatch.chdir(root / "ckpt")
    assert persist_checkpoint(root, ".", 2) == "."
    assert snapshot(root) == before


def test_missing_location_inside_root_is_returned_unchanged(root: Path) -> None:
    location = str(root / "not" / "yet")
    assert persist_checkpoint(root, location, 3) is location
    assert list(root.iterdir()) == []


def test_directory_outside_is_copied_and_left_untouched(root: Path, source: Path) -> None:
    before, expected = snapshot(source), contents(source)
    copied = persist_checkpoint(root, str(source), 7)
    assert copied == str(root / "checkpoint_000007")
    assert os.path.isabs(copied)
    assert contents(Path(copied)) == expected
    assert snapshot(source) == before
    assert os.listdir(root) == ["checkpoint_000007"]  # no temporary directory is left


def test_relative_location_outside_is_copied(
    root: Path, source: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(source.parent)
    copied = persist_checkpoint(root, "ckpt", 1)
    assert copied == str(root / "checkpoint_000001")
    assert contents(Path(copied)) == contents(source)


def test_file_outside_is_copied_under_its_own_name(root: Path, tmp_path: Path) -> None:
    weights = tmp_path / "weights.safetensors"
    weights.write_bytes(b"tensor data")
    mtime = weights.stat().st_mtime_ns
    copied = persist_checkpoint(root, str(weights), 12)
    assert copied == str(root / "checkpoint_000012")
    assert contents(Path(copied)) == {"weights.safetensors": b"tensor data"}
    assert (Path(copied) / "weights.safetensors").stat().st_mtime_ns == mtime  # copy2
    assert weights.read_bytes() == b"tensor data"
    assert weights.stat().st_mtime_ns == mtime


def test_root_is_created_if_missing(tmp_path: Path, source: Path) -> None:
    root = tmp_path / "new" / "state"
    copied = persist_checkpoint(root, str(source), 1)
    assert contents(Path(copied)) == contents(source)


def test_two_ranks_merge_into_one_destination(root: Path, tmp_path: Path) -> None:
    ranks = []
    for rank in (0, 1):
        checkpoint = tmp_path / f"rank{rank}"
        (checkpoint / "shards").mkdir(parents=True)
        (checkpoint / "shards" / f"{rank}.bin").write_bytes(bytes([rank]))
        (checkpoint / "meta.json").write_text(f'{{"rank": {rank}}}')
        ranks.append(checkpoint)
    first = persist_checkpoint(root, str(ranks[0]), 4)
    second = persist_checkpoint(root, str(ranks[1]), 4)
    assert first == second == str(root / "checkpoint_000004")
    assert contents(Path(first)) == {
        "meta.json": b'{"rank": 1}',  # the same name: the last copy wins
        "shards": None,
        "shards/0.bin": b"\x00",
        "shards/1.bin": b"\x01",
    }
    assert os.listdir(root) == ["checkpoint_000004"]


def test_relative_links_inside_are_kept_as_links(root: Path, source: Path) -> None:
    (source / "latest").symlink_to("optimizer.pt")
    (source / "model" / "up").symlink_to(os.path.join("..", "optimizer.pt"))
    (source / "model" / "here").symlink_to("shards", target_is_directory=True)
    copied = Path(persist_checkpoint(root, str(source), 2))
    assert os.readlink(copied / "latest") == "optimizer.pt"
    assert os.readlink(copied / "model" / "up") == os.path.join("..", "optimizer.pt")
    assert os.readlink(copied / "model" / "here") == "shards"
    assert (copied / "model" / "up").read_bytes() == b"adam"  # resolves inside the copy
    assert contents(copied) == contents(source)


@pytest.mark.parametrize(
    ("kind", "target"),
    [
        ("absolute", "ABSOLUTE"),
        ("out of the checkpoint", os.path.join("..", "..", "..", "secret.txt")),
        ("out of the checkpoint", os.path.join("..", "..")),  # a directory outside
        ("dangling", "no-such-file"),
    ],
)
def test_links_that_escape_or_dangle_are_refused(
    root: Path, source: Path, tmp_path: Path, kind: str, target: str
) -> None:
    (tmp_path / "secret.txt").write_text("not for the run")
    if target == "ABSOLUTE":  # even to a file inside the checkpoint
        target = str(source / "optimizer.pt")
    link = source / "model" / "link"
    link.symlink_to(target)
    before = snapshot(source)
    with pytest.raises(CheckpointCopyError, match=kind) as caught:
        persist_checkpoint(root, str(source), 5)
    assert str(link) in str(caught.value)
    assert str(source) in str(caught.value)
    assert list(root.iterdir()) == []  # no temporary directory, no destination
    assert snapshot(source) == before


def test_failed_copy_leaves_what_other_ranks_copied(root: Path, tmp_path: Path) -> None:
    good = tmp_path / "good"
    good.mkdir()
    (good / "0.bin").write_bytes(b"0")
    persist_checkpoint(root, str(good), 6)
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "1.bin").write_bytes(b"1")
    (bad / "escape").symlink_to(os.path.join("..", "good", "0.bin"))
    with pytest.raises(CheckpointCopyError, match="escape"):
        persist_checkpoint(root, str(bad), 6)
    assert os.listdir(root) == ["checkpoint_000006"]
    assert contents(root / "checkpoint_000006") == {"0.bin": b"0"}


def test_location_that_is_a_link_is_refused(root: Path, source: Path, tmp_path: Path) -> None:
    link = tmp_path / "ckpt-link"
    link.symlink_to(source, target_is_directory=True)
    with pytest.raises(CheckpointCopyError, match="symbolic link") as caught:
        persist_checkpoint(root, str(link), 1)
    assert str(link) in str(caught.value)
    assert list(root.iterdir()) == []


def test_link_in_root_to_outside_is_not_inside(root: Path, source: Path) -> None:
    link = root / "ckpt"
    link.symlink_to(source, target_is_directory=True)
    with pytest.raises(CheckpointCopyError, match="symbolic link"):
        persist_checkpoint(root, str(link), 1)
    assert os.listdir(root) == ["ckpt"]


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no fifos on this platform")
@pytest.mark.timeout(20)
def test_fifo_inside_is_refused_without_blocking(root: Path, source: Path) -> None:
    fifo = source / "model" / "pipe"
    os.mkfifo(fifo)
    with pytest.raises(CheckpointCopyError, match="special file") as caught:
        persist_checkpoint(root, str(source), 8)
    assert str(fifo) in str(caught.value)
    assert list(root.iterdir()) == []


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no fifos on this platform")
@pytest.mark.timeout(20)
def test_fifo_location_is_refused_without_blocking(root: Path, tmp_path: Path) -> None:
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    with pytest.raises(CheckpointCopyError, match="neither a directory nor a regular file"):
        persist_checkpoint(root, str(fifo), 8)
    assert list(root.iterdir()) == []


def test_location_containing_root_is_refused(root: Path) -> None:
    with pytest.raises(CheckpointCopyError, match="contains the state dir"):
        persist_checkpoint(root, str(root.parent), 1)
    assert list(root.iterdir()) == []


def test_missing_location_is_refused(root: Path, tmp_path: Path) -> None:
    location = str(tmp_path / "gone")
    with pytest.raises(CheckpointCopyError, match="does not exist") as caught:
        persist_checkpoint(root, location, 1)
    assert f"checkpoint {location!r} does not exist" in str(caught.value)
    assert list(root.iterdir()) == []


def test_copy_error_is_a_value_error() -> None:
    assert issubclass(CheckpointCopyError, ValueError)


def test_os_error_is_wrapped_and_the_temporary_directory_removed(
    root: Path, tmp_path: Path
) -> None:
    (root / "checkpoint_000009" / "weights").mkdir(parents=True)  # a directory where ...
    checkpoint = tmp_path / "ckpt"
    checkpoint.mkdir()
    (checkpoint / "weights").write_bytes(b"w")  # ... this file goes
    with pytest.raises(CheckpointCopyError, match="cannot copy checkpoint") as caught:
        persist_checkpoint(root, str(checkpoint), 9)
    assert str(checkpoint) in str(caught.value)
    assert "weights" in str(caught.value)
    assert isinstance(caught.value.__cause__, OSError)
    assert os.listdir(root) == ["checkpoint_000009"]
