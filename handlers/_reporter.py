"""A rank's handle on its run: what a worker reports through, and meets the others at."""

from __future__ import annotations

import collections
import inspect
import os
import time
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio
import anyio.lowlevel
import msgspec

from eventbus import Report
from eventbus._logging import get_logger
from eventbus._subscription import Subscription
from eventbus.state._model import state_key_of

from ._errors import ReportError
from ._metric_values import MetricsError, freeze_metrics
from ._persist import in_state_dir, persist_checkpoint

_log = get_logger("handlers.reporter")

#: How long the run's workers may compute, awaiting nothing else, before a report gives
#: the loop a turn, seconds (docs/guides/async-trainer.md: why not at every report).
CALLBACKS_TURN_S = 0.01
_json = msgspec.json.Decoder()
_json_encoder = msgspec.json.Encoder()

if TYPE_CHECKING:
    from ._attach import CallbackAttachment
    from ._run import Run

__all__ = ["Reporter", "stopping_lanes", "values_for_workers"]


class Reporter:
    """One rank's handle on its run: ``await reporter.report(metrics, checkpoint=None)``.

    ``latest_checkpoint`` is where a restarted worker resumes; ``should_stop`` turns true
    when a callback or the trainer asked the run to stop. A run makes one per ``rank``.
    """

    def __init__(self, run: Run, rank: int) -> None:
        self.run = run
        self.rank = rank
        self.world_size = run.world_size
        self.attempt = 0
        #: Whether this rank's worker ended: its next report will not come.
        self.ended = False
        self._index = run.first_index(rank)
        #: The run's workers' suspensions at this rank's latest report.
        self._suspensions = -1

    async def report(
        self, metrics: dict[str, Any], checkpoint: str | os.PathLike[str] | None = None
    ) -> None:
        """Report this rank's ``metrics`` for its next round, and the ``checkpoint`` it
        saved, if any (one rank naming it is enough).

        The metrics are copied at once: the worker may reuse its dict. ``ReportError`` (a
        ``ValueError``, nothing reported) if they hold something a log cannot (a tensor),
        or ``checkpoint`` is no path or cannot be copied into the ``state_dir``. The loop
        then may give the callbacks a turn (``CALLBACKS_TURN_S``), where a cancellation may
        end the worker, the report already made.
        """
        try:
            frozen = freeze_metrics(metrics)
        except MetricsError as exc:
            raise ReportError(self.rank, exc.field, exc.reason) from None
        location = None if checkpoint is None else self._checkpoint_location(checkpoint)
        run = self.run
        index = self._index
        if location is not None and run.state_dir is not None:
            location = await persisted(self.rank, run.state_dir, location, index)
        self._index += 1
        await run.bus.publish(
            Report(
                run_id=run.run_id,
                rank=self.rank,
                world_size=self.world_size,
                index=index,
                metrics=frozen,
                checkpoint=location,
            )
        )
        # A worker that computes and awaits nothing else would hold the callbacks off: if
        # this one gave the loop no turn since its last report, it gives one (at most every
        # CALLBACKS_TURN_S for the run). Workers that await between steps give turns
        # themselves, and an extra one would leave the rank taking it a step behind.
        holds = run.bus.loop_holds
        now = time.monotonic()
        if now >= run.turn_due:
            run.turn_due = now + CALLBACKS_TURN_S
            if holds.suspensions == self._suspensions:
                await anyio.lowlevel.checkpoint()
        self._suspensions = holds.suspensions

    def _checkpoint_location(self, checkpoint: object) -> str:
        """``checkpoint`` as the path string events carry; ``ReportError`` if the OS refuses it."""
        return checkpoint_location(self.rank, checkpoint)

    async def sync(self) -> None:
        """Wait until every report this rank made was gathered into a round (or discarded
        by a restart) and the callbacks that can stop the run have handled that round, so
        that ``should_stop`` reads as of that round (``Run.wait_gathered``)."""
        await self.run.wait_gathered(self.rank)

    @property
    def reports(self) -> int:
        """The index of this rank's next report (reports made, in a run not resumed)."""
        return self._index

    @property
    def latest_checkpoint(self) -> str | None:
        return self.run.latest_checkpoint

    @property
    def should_stop(self) -> bool:
        return self.run.should_stop

    @property
    def should_checkpoint(self) -> bool:
        """Whether to save and report a checkpoint at the next step: the run was told to
        stop (SIGTERM). ``should_stop`` follows one round later, so the checkpoint comes first."""
        return self.run.should_checkpoint

    @property
    def from_callbacks(self) -> dict[str, Any]:
        """What the callbacks hand the workers (``for_workers``), by callback class name:
        ``reporter.from_callbacks["PlateauLR"]["lr"]``."""
        return self.run.for_workers


_MISSING = object()


def values_for_workers(callbacks: Iterable[object], unsendable: set[str]) -> dict[str, Any]:
    """Each callback's ``for_workers`` under its class name (or state key), copied through
    JSON; one that is not JSON is left out, said once (its key joins ``unsendable``)."""
    giving = [cb for cb in callbacks if getattr(cb, "for_workers", None) is not None]
    if not giving:  # most runs: asked every round (torchrun's rank 0), so said at once
        return {}
    names = collections.Counter(type(cb).__name__ for cb in giving)
    values: dict[str, Any] = {}
    for callback in giving:
        key = type(callback).__name__
        if names[key] > 1:
            key = state_key_of(callback)
        try:
            values[key] = _json.decode(_json_encoder.encode(callback.for_workers))  # type: ignore[attr-defined]
        except (TypeError, ValueError, msgspec.EncodeError) as exc:
            if key not in unsendable:
                unsendable.add(key)
                _log.warning(
                    f"{key}.for_workers is not a JSON value, so workers do not get it: {exc}"
                )
    return values


def stopping_lanes(attachment: CallbackAttachment) -> tuple[Subscription, ...]:
    """The lanes ``Reporter.sync`` waits for: those of callbacks with a ``should_stop``."""
    user = attachment.user
    return tuple(
        sub
        for callback, subs in zip(user.callbacks, user.subscriptions_by_callback, strict=True)
        if inspect.getattr_static(callback, "should_stop", _MISSING) is not _MISSING
        for sub in subs
        if sub.delivery == "lane"
    )


def checkpoint_location(rank: int, checkpoint: object) -> str:
    """A reported checkpoint as the path string events carry, refused as the OS would."""
    try:
        location = os.fsdecode(os.fspath(checkpoint))  # type: ignore[call-overload]
    except TypeError:
        location = None
    if not location:
        raise ReportError(rank, "checkpoint", f"{checkpoint!r} is not a checkpoint location")
    if problem := _refused_path(location):
        raise ReportError(rank, "checkpoint", f"{_shown(location)} {problem}")
    return location


try:  # POSIX's NAME_MAX and PATH_MAX (bytes), asked once of "/"
    _NAME_MAX, _PATH_MAX = os.pathconf("/", "PC_NAME_MAX"), os.pathconf("/", "PC_PATH_MAX")
except (AttributeError, OSError, ValueError):  # no pathconf (Windows): Linux's
    _NAME_MAX, _PATH_MAX = 255, 4096


def _refused_path(location: str) -> str | None:
    """Why no system call would take ``location`` as a path (``None``: it would), checked
    at the report rather than failing later, far from it."""
    if "\0" in location:
        return "holds a NUL byte, which no file system path can"
    try:
        raw = os.fsencode(location)
    except UnicodeEncodeError as exc:
        return f"cannot be encoded as a file name ({exc.reason} at character {exc.start})"
    if len(raw) >= _PATH_MAX:
        return f"is {len(raw)} bytes long, over the limit of {_PATH_MAX - 1} bytes"
    if os.altsep:
        raw = raw.replace(os.altsep.encode(), os.sep.encode())
    longest = max(raw.split(os.sep.encode()), key=len)
    if len(longest) <= _NAME_MAX:
        return None
    which = "" if longest == raw else f" ({_shown(os.fsdecode(longest))})"
    return f"holds a name of {len(longest)} bytes{which}, over the limit of {_NAME_MAX} bytes"


def _shown(text: str, most: int = 60) -> str:
    if len(text) <= most:
        return repr(text)
    return f"{text[: most // 2]!r}…{text[-most // 2 :]!r} ({len(text)} characters)"


async def persisted(rank: int, state_dir: Path, location: str, index: int) -> str:
    """``location`` kept in the run's state dir: as given if inside it, else copied in, in
    a thread. Inside is checked here: a few ``lstat``s of a path the worker just wrote,
    where a thread waits for the GIL at each beside computing workers (docs/performance.md)."""
    try:
        if in_state_dir(state_dir, location):
            return location
        return await anyio.to_thread.run_sync(persist_checkpoint, state_dir, location, index)
    except ValueError as exc:  # CheckpointCopyError, or whatever else os.path refuses
        raise ReportError(rank, "checkpoint", str(exc)) from None
