"""Resuming a run from a checkpoint: one history, continued where the checkpoint left it
(``RunPosition``), with a ``RunResumed`` marking what the crash rolled back."""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from pathlib import Path

from eventbus import BudgetReport, EventBus, RunResumed
from eventbus._events import RunPosition
from eventbus._logging import get_logger
from eventbus.log import LogInUse
from eventbus.log._history import LogTail
from eventbus.state import StateError, StateStore
from eventbus.state._files import STATE_FILENAME
from eventbus.state._model import StateFormatError

from ._attach import CallbackAttachment
from ._options import MAX_WORLD_SIZE

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows: no lock to respect
    fcntl = None  # type: ignore[assignment]

__all__ = ["Resume", "appends_to_log", "latest_checkpoint", "resume_point"]

_log = get_logger("handlers.resume")


class Resume:
    """What a run resumes from: the ``checkpoint`` as given, where the run stood there
    (``position``, ``None`` if not saved) and the id of the run that saved it (``""``), read
    before the run starts, so a bad position refuses the resume before any callback changed."""

    def __init__(self, checkpoint: str, position: RunPosition | None, run_id: str) -> None:
        self.checkpoint = checkpoint
        self.position = position
        self.run_id = run_id

    @classmethod
    def load(cls, store: StateStore, resume_from: str | os.PathLike[str]) -> Resume:
        """Read the position saved at ``resume_from`` (its states are restored apart)."""
        checkpoint = os.fspath(resume_from)
        try:
            snapshot = store.load(checkpoint)
        except FileNotFoundError:
            return cls(checkpoint, None, "")
        if snapshot.run is not None:
            problem = _implausible(snapshot.run)
            if problem is not None:  # a snapshot is data anyone can edit
                path = store.resume_path_of(checkpoint)
                raise StateFormatError(f"{path}: run.{problem}: not a position to resume from")
        return cls(checkpoint, snapshot.run, snapshot.run_id)

    def first_index(self, rank: int) -> int:
        """The index of ``rank``'s first report in the resumed run."""
        position = self.position
        if position is None or not 0 <= rank < len(position.next_index):
            return 0
        return max(0, position.next_index[rank])

    def continue_bus(self, bus: EventBus, tail: LogTail | None) -> BudgetReport | None:
        """Number the bus's events and periods after the history's; returns the report of
        the period the crash cut, if any."""
        seq = self.position.checkpoint_seq + 1 if self.position is not None else 0
        if tail is None:
            bus.continue_from(seq=seq, period=0)
            return None
        cut = tail.cut_period(period=bus.period, budget=bus.budget)
        period = tail.last_period + (2 if cut is not None else 1)
        bus.continue_from(seq=max(seq, tail.last_seq + 1), period=period)
        return cut

    def apply(self, attachment: CallbackAttachment, world_size: int) -> None:
        """Put the gathering and the run's figures where the checkpoint left them."""
        position = self.position
        if position is not None and position.world_size != world_size:
            _log.warning(
                "resumed with another world size: callbacks restored, rounds start over",
                checkpoint=self.checkpoint,
                saved=position.world_size,
                now=world_size,
            )
            position = None
        attachment.reports.resume_at(self.checkpoint, position)
        if position is not None:
            attachment.failures.resume_at(position)

    def event(self, run_id: str) -> RunResumed | None:
        if self.position is None:
            return None
        return RunResumed(run_id=run_id, checkpoint=self.checkpoint, position=self.position)


def _implausible(position: RunPosition) -> str | None:
    """What makes ``position`` impossible (the gathering would refuse or misread it)."""
    size = position.world_size
    if not 1 <= size <= MAX_WORLD_SIZE:
        return f"world_size is {size}, not from 1 to {MAX_WORLD_SIZE}"
    if len(position.next_index) != size:
        return f"next_index has {len(position.next_index)} entries for world size {size}"
    if any(index < -1 for index in position.next_index):
        return "next_index holds an index below -1"
    if any(not 0 <= rank < size for rank in position.required_ranks):
        return f"required_ranks holds a rank outside 0..{size - 1}"
    figures = ("rounds", "reports", "rejected", "failures", "restarts", "mismatches")
    negative = [name for name in figures if getattr(position, name) < 0]
    return f"{negative[0]} is negative" if negative else None


def appends_to_log(
    log: str | os.PathLike[str],
    *,
    resuming: bool,
    run_dir: str | os.PathLike[str] | None = None,
) -> bool:
    """Whether the run appends to ``log`` (it resumes the run it holds). Another run's log
    is never overwritten: moved aside when nothing could continue it, else
    ``FileExistsError`` (the run was probably meant to resume)."""
    path = Path(log)
    try:
        found = path.stat()
    except FileNotFoundError:
        return False
    if not stat.S_ISREG(found.st_mode):
        return False  # the recorder refuses it, naming it (nothing is moved but a log)
    if resuming:
        return True  # an empty one (a kill before its header) makes a new log
    if run_dir is None or latest_checkpoint(run_dir) is not None:
        where = (
            f"resume_from={_shown(run_dir)}" if run_dir is not None else "resume_from= a checkpoint"
        )
        raise FileExistsError(
            f"{path}: an event log is already there, and a run never overwrites one: give "
            f"log= another path, or resume the run it records ({where} of that run, "
            "whose history the log then continues)"
        )
    kept = _move_aside(path)
    _log.warning(
        f"no complete checkpoint in {_shown(run_dir)} to continue: this run starts a new "
        f"history in {path}; the earlier one is kept as {kept}"
    )
    return False


def _shown(folder: str | os.PathLike[str]) -> str:
    """``folder`` relative to the current directory when inside it."""
    try:
        return str(Path(folder).relative_to(Path.cwd()))
    except ValueError:
        return os.fspath(folder)


def _move_aside(path: Path) -> Path:
    """Move the log at ``path`` to the first free ``<stem>.<n><suffix>``; one a recorder
    is writing is ``LogInUse``, and stays."""
    with open(path, "rb") as held:  # the lock recorders take (flock), held while moving
        if fcntl is not None:
            try:
                fcntl.flock(held.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise LogInUse(
                    errno.EBUSY,
                    f"{path}: another recorder is writing this log right now",
                    str(path),
                ) from None
        for n in range(1, 1_000_000):
            kept = path.with_name(f"{path.stem}.{n}{path.suffix}")
            try:
                os.link(path, kept)  # fails if anything is there: nothing is written over
            except FileExistsError:
                continue
            except OSError:  # a file system without hard links
                if os.path.lexists(kept):
                    continue
                os.rename(path, kept)
                return kept
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
            return kept
    raise FileExistsError(errno.EEXIST, "no free name to keep the earlier log under", str(path))


def latest_checkpoint(run_dir: str | os.PathLike[str]) -> Path | None:
    """The latest complete checkpoint directly inside ``run_dir``, or ``None``.

    Complete: its ``callback_state.json`` reads back whole (written last, so a checkpoint
    a kill cut short has none). ``open_run(resume_from=run_dir)`` does this itself.
    """
    root = Path(run_dir)
    store = StateStore(root)
    found: tuple[tuple[int, int], Path] | None = None
    try:
        children = sorted(root.iterdir())
    except (NotADirectoryError, FileNotFoundError):
        return None
    for child in children:
        if child.is_symlink() or not child.is_dir() or not (child / STATE_FILENAME).exists():
            continue
        try:
            snapshot = store.load(child)
            written = (child / STATE_FILENAME).stat().st_mtime_ns
        except (OSError, StateError):
            continue
        seq = snapshot.run.checkpoint_seq if snapshot.run is not None else -1
        if found is None or (written, seq) > found[0]:
            found = ((written, seq), child)
    return found[1] if found is not None else None


def resume_point(
    resume_from: str | os.PathLike[str],
    *,
    run_dir: str | os.PathLike[str] | None = None,
    log: str | os.PathLike[str] | None = None,
) -> str | os.PathLike[str] | None:
    """The checkpoint ``resume_from`` names (a run directory: its latest complete one).
    ``None``: the run's own folder with none yet, so the run starts fresh.
    ``FileNotFoundError`` for a location that does not exist."""
    given = Path(resume_from)
    if not os.path.lexists(given):
        raise FileNotFoundError(
            f"resume_from={os.fspath(resume_from)}: no such checkpoint or run folder"
        )
    if (given / STATE_FILENAME).exists() or not given.is_dir():
        return resume_from
    latest = latest_checkpoint(given)
    if latest is None:
        try:
            own_folder = run_dir is not None and os.path.samefile(given, run_dir)
        except OSError:
            own_folder = False
        if not own_folder:
            return resume_from  # a checkpoint without states: the resume says what is missing
        if log is None or not os.path.isfile(log):  # else appends_to_log moves it, saying so
            _log.warning(f"no complete checkpoint in {given} yet: the run starts fresh")
        return None
    _log.info(f"resuming from {latest}: the latest complete checkpoint in {given}")
    return latest
