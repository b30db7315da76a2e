"""Snapshot files: confined, written atomically, read defensively, versioned (the rules
are docs/state.md's: a worker's checkpoint lies inside the root, the operator's anywhere,
and no snapshot file is a link out of its confinement)."""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import stat
from collections.abc import Sequence
from pathlib import Path
from typing import Literal

import msgspec

from .._events import RunPosition
from ._model import (
    MALFORMED,
    STATE_FORMAT_VERSION,
    CallbackState,
    Snapshot,
    StateError,
    StateFormatError,
    check_state,
    current_state_key,
)

#: Name of the snapshot file inside a checkpoint directory.
STATE_FILENAME = "callback_state.json"

#: Largest snapshot read or written by default (``StateStore(max_bytes=...)``).
DEFAULT_MAX_BYTES = 64 * 2**20

#: Longest checkpoint location accepted, before and after resolution (Linux's PATH_MAX).
MAX_LOCATION_CHARS = 4096

#: Most components a checkpoint location may have once resolved (a worker must not make
#: the store create thousands of directories).
MAX_LOCATION_DEPTH = 256

#: A snapshot's temporary file is removed by later writers once this much older (seconds,
#: by the file system's clock) than their own: no write takes that long.
LEFTOVER_AGE = 3600.0

_DIRECTORY_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC
#: Opens a directory as a handle for lookups only (Linux); elsewhere it is read.
_PATH_FLAG: int = getattr(os, "O_PATH", os.O_RDONLY)
_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_CREATE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


_KINDS = {
    stat.S_IFIFO: "a FIFO",
    stat.S_IFDIR: "a directory",
    stat.S_IFCHR: "a device",
    stat.S_IFBLK: "a device",
}


class StatePathError(StateError, ValueError):
    """A checkpoint location is empty, too long, unresolvable or outside where it must
    be, or a snapshot file is a link out of its confinement."""


class _Header(msgspec.Struct):
    format: int


class _RawSnapshot(msgspec.Struct):
    """The file as written, with each state left raw so one bad state is not the file's fault."""

    format: int
    checkpoint: str = ""
    run_id: str = ""
    keyed_by: Literal["qualname", "class_name"] = "qualname"
    states: dict[str, msgspec.Raw] = msgspec.field(default_factory=dict)
    errors: dict[str, str] = msgspec.field(default_factory=dict)
    run: RunPosition | None = None


_header_decoder = msgspec.json.Decoder(_Header)
_raw_decoder = msgspec.json.Decoder(_RawSnapshot)
_value_decoder = msgspec.json.Decoder()
_encoder = msgspec.json.Encoder()


def _shown(location: str) -> str:
    """``repr`` of a location, shortened: an error message must not carry megabytes."""
    text = repr(location)
    if len(text) <= 240:
        return text
    return f"{text[:160]}...{text[-60:]} ({len(location)} chars)"


# --- resolving locations -----------------------------------------------------------


def resolve_location(checkpoint: str | os.PathLike[str]) -> Path:
    """``checkpoint`` made absolute against the cwd with symlinks resolved; anything
    that cannot be is a ``StatePathError`` naming it, never a bare ``OSError``."""
    try:
        text = os.fspath(checkpoint)
    except TypeError:
        raise StatePathError(f"invalid checkpoint location {checkpoint!r}") from None
    if not isinstance(text, str) or not text or "\x00" in text:
        raise StatePathError(f"invalid checkpoint location {_shown(str(text))}")
    if len(text) > MAX_LOCATION_CHARS:
        raise StatePathError(
            f"checkpoint location {_shown(text)} is longer than {MAX_LOCATION_CHARS} characters"
        )
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        # Lone surrogates (undecodable bytes): no JSON snapshot or event could record it.
        raise StatePathError(f"checkpoint location {_shown(text)} is not valid UTF-8") from None
    try:
        location = Path(text).resolve()
    except (OSError, RuntimeError, ValueError) as exc:  # RuntimeError: loops, RecursionError
        raise StatePathError(
            f"checkpoint location {_shown(text)} cannot be resolved ({type(exc).__name__}: {exc})"
        ) from None
    if len(str(location)) > MAX_LOCATION_CHARS or len(location.parts) > MAX_LOCATION_DEPTH:
        raise StatePathError(
            f"checkpoint location {_shown(text)} resolves to a path longer than "
            f"{MAX_LOCATION_CHARS} characters or deeper than {MAX_LOCATION_DEPTH} components"
        )
    return location


def _snapshot_file(location: Path, shown: str) -> Path:
    """The snapshot of a resolved location: inside it, or beside it if it is a file."""
    try:
        is_file = location.is_file()
    except (OSError, ValueError) as exc:
        raise StatePathError(f"checkpoint {shown}: {type(exc).__name__}: {exc}") from None
    if is_file:
        return location.with_name(f"{location.name}.{STATE_FILENAME}")
    return location / STATE_FILENAME


def state_path(root: Path, checkpoint: str | os.PathLike[str]) -> Path:
    """Where the snapshot of a worker-reported ``checkpoint`` lives; anything resolving
    to the (resolved) ``root`` itself or outside it is a ``StatePathError``."""
    location = resolve_location(checkpoint)
    shown = _shown(os.fspath(checkpoint))
    if location == root or not location.is_relative_to(root):
        raise StatePathError(
            f"checkpoint {shown} resolves to {location}, outside the state root {root}"
        )
    return _snapshot_file(location, shown)


def resume_state_path(root: Path, checkpoint: str | os.PathLike[str]) -> tuple[Path, Path]:
    """(snapshot file, directory it must stay in) of a checkpoint the operator resumes
    from, anywhere: the root when it is inside, else the checkpoint's own directory."""
    location = resolve_location(checkpoint)
    path = _snapshot_file(location, _shown(os.fspath(checkpoint)))
    within = root if path.is_relative_to(root) else path.parent
    return path, within


# --- walking directories without following links ---------------------------------


def _path_error(path: Path, exc: OSError) -> StateError | OSError:
    """What an ``OSError`` met while opening ``path`` means to the caller."""
    if exc.errno in (errno.ELOOP, errno.ENOTDIR, errno.EMLINK):
        return StatePathError(
            f"{path}: a component is a symbolic link or not a directory "
            f"(changed since it was resolved?): {exc.strerror}"
        )
    if exc.errno == errno.ENAMETOOLONG:
        return StatePathError(f"{path}: name too long")
    if exc.errno == errno.ENXIO:
        return StateFormatError(f"{path}: not a regular file (a socket or device)")
    return exc


def _open_directory(base: Path, parts: Sequence[str], *, create: bool, readable: bool) -> int:
    """An fd of ``base/parts...``, opened a component at a time with ``O_NOFOLLOW`` (a
    component swapped for a link after the check is refused); ``create`` makes missing
    ones, iteratively (pathlib's recursive ``mkdir`` fails on deep paths)."""
    walk = _PATH_FLAG | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
    last = (os.O_RDONLY if readable else _PATH_FLAG) | os.O_DIRECTORY | os.O_NOFOLLOW
    last |= os.O_CLOEXEC
    fd = os.open(base, (last if not parts else walk) & ~os.O_NOFOLLOW)
    try:
        for index, part in enumerate(parts):
            flags = last if index == len(parts) - 1 else walk
            try:
                child = os.open(part, flags, dir_fd=fd)
            except FileNotFoundError:
                if not create:
                    raise
                with contextlib.suppress(FileExistsError):
                    os.mkdir(part, 0o777, dir_fd=fd)
                child = os.open(part, flags, dir_fd=fd)
            os.close(fd)
            fd = child
    except BaseException:
        os.close(fd)
        raise
    return fd


# --- reading -------------------------------------------------------------------------


def read_regular_file(
    path: Path, *, within: Path | None = None, max_bytes: int = DEFAULT_MAX_BYTES
) -> bytes:
    """The bytes of ``path``, refusing whatever a planted file could do to a reader: with
    ``within``, a link out of it (``StatePathError``); a FIFO, device or a size over
    ``max_bytes`` (``StateFormatError``, checked on the open file before a byte is read)."""
    try:
        if within is None:
            # The caller's own path: links are followed, the file itself still checked.
            fd = os.open(path, _READ_FLAGS & ~os.O_NOFOLLOW)
        else:
            try:
                real = path.resolve()
            except (OSError, RuntimeError, ValueError) as exc:
                raise StatePathError(f"{path}: cannot be resolved ({exc})") from None
            if real == within or not real.is_relative_to(within):
                raise StatePathError(f"{path}: resolves to {real}, a link out of {within}; refused")
            parts = real.relative_to(within).parts
            directory = _open_directory(within, parts[:-1], create=False, readable=False)
            try:
                fd = os.open(parts[-1], _READ_FLAGS, dir_fd=directory)
            finally:
                os.close(directory)
    except FileNotFoundError:
        raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), str(path)) from None
    except OSError as exc:
        raise _path_error(path, exc) from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            kind = _KINDS.get(stat.S_IFMT(info.st_mode), "a socket or other special file")
            raise StateFormatError(f"{path}: {kind}, not a regular file; refused")
        limit = f"over the limit of {max_bytes} bytes (max_bytes)"
        if info.st_size > max_bytes:
            raise StateFormatError(f"{path}: {info.st_size} bytes, {limit}; refused unread")
        # Chunks as they come: one read of ``max_bytes + 1`` would allocate all that first.
        chunks: list[bytes] = []
        remaining = max_bytes + 1
        while remaining > 0 and (chunk := os.read(fd, min(remaining, 1 << 20))):
            chunks.append(chunk)
            remaining -= len(chunk)
        if remaining <= 0:
            raise StateFormatError(f"{path}: grew while being read, {limit}; refused")
        return b"".join(chunks)
    finally:
        os.close(fd)


def read_snapshot(path: Path, *, within: Path, max_bytes: int) -> Snapshot:
    """Read a snapshot file; a malformed or newer-format one is a ``StateFormatError``.
    One malformed state does not cost the others: its key goes to ``errors``."""
    data = read_regular_file(path, within=within, max_bytes=max_bytes)
    try:
        header = _header_decoder.decode(data)
    except (msgspec.DecodeError, RecursionError) as exc:
        raise StateFormatError(f"{path}: not a callback state snapshot: {exc}") from None
    if header.format != STATE_FORMAT_VERSION:
        raise StateFormatError(
            f"{path}: snapshot format {header.format}, this version reads format "
            f"{STATE_FORMAT_VERSION}"
        )
    try:
        raw = _raw_decoder.decode(data)
    except (msgspec.DecodeError, RecursionError) as exc:
        raise StateFormatError(f"{path}: {exc}") from None
    # Keys written under a class's earlier name are read under its current one.
    renamed = current_state_key if raw.keyed_by == "qualname" else str
    states: dict[str, CallbackState] = {}
    errors = {renamed(key): reason for key, reason in raw.errors.items()}
    for saved_key, value in raw.states.items():
        key = renamed(saved_key)
        where = f"states[{_shown(saved_key)}]"
        try:
            states[key] = check_state(_value_decoder.decode(value), where)
        except (msgspec.DecodeError, RecursionError) as exc:
            errors[key] = f"{MALFORMED} {path.name}: {where}: {exc}"
        except ValueError as exc:
            errors[key] = f"{MALFORMED} {path.name}: {exc}"
        else:
            errors.pop(key, None)
    return Snapshot(**(msgspec.structs.asdict(raw) | {"states": states, "errors": errors}))


# --- writing -------------------------------------------------------------------------


def encode_snapshot(snapshot: Snapshot) -> bytes:
    """Indented JSON: people read these when a resume goes wrong."""
    return msgspec.json.format(_encoder.encode(snapshot), indent=2) + b"\n"


def atomic_write(
    path: Path, data: bytes, *, within: Path | None = None, durable: bool = True
) -> None:
    """Replace ``path`` with ``data`` so that a crash leaves the old or the new file, whole;
    with ``within``, never through a link out of it. ``durable=False``: no ``fsync`` (whole
    after a killed process, not a power loss), for Hugging Face's ``trainer_state.json``."""
    try:
        if within is None:
            os.makedirs(path.parent, exist_ok=True)
            directory = os.open(path.parent, _DIRECTORY_FLAGS)
        else:
            within.mkdir(parents=True, exist_ok=True)
            parts = path.parent.relative_to(within).parts
            directory = _open_directory(within, parts, create=True, readable=True)
    except OSError as exc:
        raise _path_error(path, exc) from None
    try:
        _replace_in(directory, path.name, data, durable)
        if durable:  # the rename is durable only once the directory entry is
            os.fsync(directory)
    finally:
        os.close(directory)


def _replace_in(directory: int, name: str, data: bytes, durable: bool) -> None:
    for _ in range(8):
        temporary = f".{name}.{os.getpid()}.{secrets.token_hex(8)}.tmp"
        try:
            # Created like any new file (the umask applies), or with the mode of the file it
            # replaces; never through a link (O_NOFOLLOW, O_EXCL).
            fd = os.open(temporary, _CREATE_FLAGS, 0o666, dir_fd=directory)
        except FileExistsError:  # another host's writer drew the same name
            continue
        break
    else:
        raise FileExistsError(f"no free temporary name for {name}")
    try:
        # The file system's clock, not ours: on a shared file system the hosts' clocks differ.
        now = os.fstat(fd).st_mtime
        with contextlib.suppress(FileNotFoundError):
            old = os.stat(name, dir_fd=directory, follow_symlinks=False)
            if stat.S_ISREG(old.st_mode):
                os.fchmod(fd, stat.S_IMODE(old.st_mode))
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        if durable:
            os.fsync(fd)
        os.close(fd)
        fd = -1
        os.replace(temporary, name, src_dir_fd=directory, dst_dir_fd=directory)
    except BaseException:
        if fd >= 0:
            os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(temporary, dir_fd=directory)
        raise
    _remove_leftovers(directory, name, now)


def _remove_leftovers(directory: int, name: str, now: float) -> None:
    """Delete temporary files of ``name`` more than ``LEFTOVER_AGE`` older than ours:
    their writers died mid-write (pids cannot tell across hosts)."""
    prefix = f".{name}."
    try:
        with os.scandir(directory) as entries:
            stale = []
            for entry in entries:
                if not (entry.name.startswith(prefix) and entry.name.endswith(".tmp")):
                    continue
                try:
                    info = entry.stat(follow_symlinks=False)
                except OSError:
                    continue
                if stat.S_ISREG(info.st_mode) and now - info.st_mtime > LEFTOVER_AGE:
                    stale.append(entry.name)
    except OSError:
        return  # tidying up is best effort: the write itself succeeded
    for leftover in stale:
        with contextlib.suppress(OSError):
            os.unlink(leftover, dir_fd=directory)
