"""Copy a checkpoint a worker reported from outside the run's state dir (a scratch disk
that goes away with the worker) into it. The copy never follows a link out of the
checkpoint nor opens a special file: it must not read the rest of the machine."""

from __future__ import annotations

import os
import shutil
import stat
import tempfile
from pathlib import Path

__all__ = ["CheckpointCopyError", "in_state_dir", "persist_checkpoint"]


class CheckpointCopyError(ValueError):
    """A checkpoint that cannot be copied into the state dir; the message names the
    location and the problem."""


def in_state_dir(root: Path, location: str) -> bool:
    """Whether ``location`` lies in the state dir ``root`` (links resolved)."""
    return _within(os.path.realpath(location), os.path.realpath(root))


def persist_checkpoint(root: Path, location: str, index: int) -> str:
    """Where the checkpoint ``location`` of report number ``index`` lives in the state dir
    ``root`` (resolved): as given if inside it (links resolved), else copied (a directory
    or a regular file, not a link) into ``root / f"checkpoint_{index:06d}"``, merged with
    what other ranks of the same report copied there."""
    if in_state_dir(root, location):
        return location
    source = os.path.abspath(location)
    real_root = os.path.realpath(root)
    real_source = os.path.realpath(source)
    try:
        mode = os.lstat(source).st_mode
    except FileNotFoundError:
        raise CheckpointCopyError(
            f"checkpoint {location!r} does not exist (nothing to copy into {str(root)!r})"
        ) from None
    except OSError as err:
        raise _copy_error(location, err) from err
    if stat.S_ISLNK(mode):
        raise CheckpointCopyError(f"checkpoint {location!r} is a symbolic link: refused")
    if not (stat.S_ISDIR(mode) or stat.S_ISREG(mode)):
        raise CheckpointCopyError(
            f"checkpoint {location!r} is neither a directory nor a regular file"
        )
    if _within(real_root, real_source):
        raise CheckpointCopyError(
            f"checkpoint {location!r} contains the state dir {str(root)!r}: refused"
        )

    destination = root / f"checkpoint_{index:06d}"
    try:
        root.mkdir(parents=True, exist_ok=True)
        temporary = tempfile.mkdtemp(prefix=f".checkpoint_{index:06d}.tmp-", dir=root)
    except OSError as err:
        raise _copy_error(location, err) from err
    try:
        if stat.S_ISDIR(mode):
            _copy_tree(source, temporary, real_source, location)
        else:
            shutil.copy2(source, os.path.join(temporary, os.path.basename(source)))
        destination.mkdir(exist_ok=True)
        _move_into(temporary, str(destination))
    except OSError as err:
        raise _copy_error(location, err) from err
    finally:
        shutil.rmtree(temporary, ignore_errors=True)
    return str(destination)


def _within(path: str, base: str) -> bool:
    """Whether ``path`` is ``base`` or below it (both absolute, normalised)."""
    try:
        return os.path.commonpath([path, base]) == base
    except ValueError:  # different drives (Windows)
        return False


def _copy_error(location: str, err: OSError) -> CheckpointCopyError:
    paths = [str(name) for name in (err.filename, err.filename2) if name is not None]
    where = f"{' -> '.join(paths)}: " if paths else ""
    return CheckpointCopyError(f"cannot copy checkpoint {location!r}: {where}{err.strerror or err}")


def _copy_tree(source: str, target: str, real_source: str, location: str) -> None:
    """Copy the contents of directory ``source`` into the existing directory ``target``,
    checking every entry by ``lstat`` before anything is opened."""
    with os.scandir(source) as entries:
        for entry in entries:
            into = os.path.join(target, entry.name)
            mode = entry.stat(follow_symlinks=False).st_mode
            if stat.S_ISLNK(mode):
                os.symlink(_link_target(entry.path, real_source, location), into)
            elif stat.S_ISDIR(mode):
                os.mkdir(into)
                _copy_tree(entry.path, into, real_source, location)
            elif stat.S_ISREG(mode):
                # follow_symlinks=False: should the file turn into a link after the check,
                # the copy is that link, never what it points to.
                shutil.copy2(entry.path, into, follow_symlinks=False)
            else:
                raise CheckpointCopyError(
                    f"checkpoint {location!r}: {entry.path!r} is a special file"
                    " (fifo, socket or device): refused"
                )


def _link_target(link: str, real_source: str, location: str) -> str:
    """The target of ``link``, if it is relative and resolves inside the checkpoint: only
    then does the copied link mean the same thing as the original."""
    target = os.readlink(link)
    if os.path.isabs(target):
        problem = f"is an absolute link (to {target!r})"
    else:
        try:
            resolved = os.path.realpath(link, strict=True)
        except OSError:
            problem = f"is a dangling link (to {target!r})"
        else:
            if _within(resolved, real_source):
                return target
            problem = f"is a link out of the checkpoint (to {target!r})"
    raise CheckpointCopyError(f"checkpoint {location!r}: {link!r} {problem}: refused")


def _move_into(source: str, target: str) -> None:
    """Move each entry of ``source`` into ``target``, replacing files of the same name and
    merging directories that another rank moved there first."""
    for name in os.listdir(source):
        here, there = os.path.join(source, name), os.path.join(target, name)
        try:
            os.replace(here, there)
        except OSError:
            if not (_is_directory(here) and _is_directory(there)):
                raise
            _move_into(here, there)


def _is_directory(path: str) -> bool:
    try:
        return stat.S_ISDIR(os.lstat(path).st_mode)
    except OSError:
        return False
