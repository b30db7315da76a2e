"""Snapshot files: confined to a root, written atomically, versioned.

A checkpoint location comes from a worker, so it is untrusted: it is
resolved (symlinks included) and must land strictly inside the configured
root. Writing goes to a temporary file in the same directory, which is
fsynced, renamed over the target and followed by an fsync of the directory:
a crash at any point leaves either the previous file or the new one, whole.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import stat
from pathlib import Path

import msgspec

from ._state import STATE_FORMAT_VERSION, Snapshot, StateError, StateFormatError

__all__ = [
    "STATE_FILENAME",
    "StatePathError",
    "atomic_write",
    "read_snapshot",
    "state_path",
    "write_snapshot",
]

#: Name of the snapshot file inside a checkpoint directory.
STATE_FILENAME = "callback_state.json"


class StatePathError(StateError, ValueError):
    """A checkpoint location is empty or resolves outside the state root."""


class _Header(msgspec.Struct):
    format: int


_header_decoder = msgspec.json.Decoder(_Header)
_snapshot_decoder = msgspec.json.Decoder(Snapshot)
_encoder = msgspec.json.Encoder()


def state_path(root: Path, checkpoint: str) -> Path:
    """Where the snapshot of ``checkpoint`` lives: inside it, or beside it if it is a file.

    ``root`` must already be resolved. Relative locations are taken from the
    root; anything resolving outside it (``..``, an absolute path elsewhere, a
    symlink pointing out) is a ``StatePathError``.
    """
    if not checkpoint or "\x00" in checkpoint:
        raise StatePathError(f"invalid checkpoint location {checkpoint!r}")
    location = (root / checkpoint).resolve()
    if location == root or not location.is_relative_to(root):
        raise StatePathError(
            f"checkpoint {checkpoint!r} resolves to {location}, outside the state root {root}"
        )
    if location.is_file():
        return location.with_name(f"{location.name}.{STATE_FILENAME}")
    return location / STATE_FILENAME


def atomic_write(path: Path, data: bytes) -> None:
    """Replace ``path`` with ``data`` so that a crash leaves the old or the new file, whole."""
    directory = path.parent
    directory.mkdir(parents=True, exist_ok=True)
    _remove_leftovers(path)
    temporary = directory / f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp"
    # Created like any new file (the umask applies), or with the mode of the file it replaces.
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        with os.fdopen(fd, "wb") as file:
            with contextlib.suppress(FileNotFoundError):
                os.fchmod(fd, stat.S_IMODE(path.stat().st_mode))
            file.write(data)
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, path)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise
    # The rename is durable only once the directory entry is.
    dir_fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def _remove_leftovers(path: Path) -> None:
    """Delete temporary files of ``path`` left by writers that died mid-write.

    A temporary file names its writer's pid: one whose process is gone can
    never be renamed into place. Those of live processes are left alone.
    """
    for leftover in path.parent.glob(f".{path.name}.*.tmp"):
        pid = leftover.name[len(path.name) + 2 :].split(".", 1)[0]
        if not pid.isdigit() or int(pid) == os.getpid() or _alive(int(pid)):
            continue
        leftover.unlink(missing_ok=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    return True


def write_snapshot(path: Path, snapshot: Snapshot) -> None:
    """Write ``snapshot`` as indented JSON (people read these when a resume goes wrong)."""
    atomic_write(path, msgspec.json.format(_encoder.encode(snapshot), indent=2) + b"\n")


def read_snapshot(path: Path) -> Snapshot:
    """Read a snapshot file; a malformed or newer-format file is a ``StateFormatError``
    naming the file and, from msgspec, the path inside it."""
    data = path.read_bytes()
    try:
        header = _header_decoder.decode(data)
    except msgspec.DecodeError as exc:
        raise StateFormatError(f"{path}: not a callback state snapshot: {exc}") from None
    if header.format != STATE_FORMAT_VERSION:
        raise StateFormatError(
            f"{path}: snapshot format {header.format}, this version reads format "
            f"{STATE_FORMAT_VERSION}"
        )
    try:
        return _snapshot_decoder.decode(data)
    except msgspec.DecodeError as exc:
        raise StateFormatError(f"{path}: {exc}") from None
