"""A checkpoint location the operating system refuses is refused at the report (issue 40,
item 5): a ``ReportError`` naming the rank and ``checkpoint``, in one line, never a bare
``ValueError: embedded null byte`` or ``OSError: File name too long`` from deep inside the
run. Nothing of the refused report is kept, so the rank's next report fills its turn.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path
from typing import Any

import pytest

from eventbus import Report, RunResult, TrainRunContext
from eventbus.log import read_log
from handlers import Reporter, ReportError, UserCallback, open_run

pytestmark = pytest.mark.anyio

NAME_MAX = os.pathconf("/", "PC_NAME_MAX")
PATH_MAX = os.pathconf("/", "PC_PATH_MAX")

#: Locations no system call takes, by what is wrong with them.
REFUSED: dict[str, str | os.PathLike[str]] = {
    "NUL byte": "ck\x00pt",
    "NUL byte in a Path": Path("ck\x00pt"),
    "name too long": "c" * (NAME_MAX + 1),
    "name too long, deep in the path": "/tmp/" + "c" * (NAME_MAX + 1) + "/ck",
    "path too long": "/tmp/" + "d/" * (PATH_MAX // 2),
    "not encodable": "ck\ud800pt",
}
#: What each refusal says about the location.
SAYS = {
    "NUL byte": "holds a NUL byte",
    "NUL byte in a Path": "holds a NUL byte",
    "name too long": f"holds a name of {NAME_MAX + 1} bytes, over the limit of {NAME_MAX}",
    "name too long, deep in the path": f"holds a name of {NAME_MAX + 1} bytes (",
    "path too long": f"over the limit of {PATH_MAX - 1} bytes",
    "not encodable": "cannot be encoded as a file name",
}


def the_os_refuses(location: str | os.PathLike[str]) -> bool:
    """Whether ``os.stat`` refuses ``location`` as a path (not merely finds nothing)."""
    try:
        os.stat(location)
    except ValueError:  # NUL byte, or not encodable
        return True
    except OSError as exc:
        return exc.errno == errno.ENAMETOOLONG
    return False


class Rounds(UserCallback):
    """Keeps each round's steps and checkpoint, and the run's result."""

    def __init__(self) -> None:
        self.rounds: list[tuple[list[int], str | None]] = []
        self.results: list[RunResult] = []

    def after_report(
        self, run_context: TrainRunContext, metrics: list[dict[str, Any]], checkpoint: str | None
    ) -> None:
        self.rounds.append(([m["step"] for m in metrics], checkpoint))

    def after_run(self, run_context: TrainRunContext, result: RunResult) -> None:
        self.results.append(result)


def test_every_location_here_is_one_the_os_refuses() -> None:
    """The cases are the real thing, not guesses at the limits."""
    assert all(the_os_refuses(location) for location in REFUSED.values())
    assert not the_os_refuses("c" * NAME_MAX)
    assert not the_os_refuses("/" + "d/" * ((PATH_MAX - 2) // 2))


@pytest.mark.parametrize("case", list(REFUSED))
@pytest.mark.parametrize("state", [False, True], ids=["no state_dir", "state_dir"])
async def test_a_location_the_os_refuses_is_a_report_error_and_the_next_report_works(
    tmp_path: Path, anyio_backend: str, case: str, state: bool
) -> None:
    location = REFUSED[case]
    good = tmp_path / "ck"
    good.mkdir()
    (good / "weights").write_bytes(b"w")
    refused: list[ReportError] = []

    async def worker(reporter: Reporter) -> None:
        await reporter.report({"step": 0})
        if reporter.rank == 1:
            try:
                await reporter.report({"step": 1}, checkpoint=location)
            except ReportError as exc:
                refused.append(exc)
        await reporter.report({"step": 1}, checkpoint=good if reporter.rank == 1 else None)

    rounds = Rounds()
    log = tmp_path / "run.evlog"
    state_dir = tmp_path / "state" if state else None
    async with open_run(world_size=2, callbacks=[rounds], log=log, state_dir=state_dir) as run:
        await run.workers(worker)

    (error,) = refused
    assert (error.rank, error.field) == (1, "checkpoint") and isinstance(error, ValueError)
    message = str(error)
    assert message.startswith("rank 1: report refused: checkpoint: "), message
    assert SAYS[case] in message, message
    assert "\n" not in message and len(message) < 300, message
    # Nothing of the refused report was kept: the next one filled rank 1's turn.
    kept = good if state_dir is None else state_dir / "checkpoint_000001"
    assert [steps for steps, _ in rounds.rounds] == [[0, 0], [1, 1]]
    assert rounds.rounds[1][1] == str(kept) and (kept / "weights").read_bytes() == b"w"
    (result,) = rounds.results
    assert (result.status, result.rounds, result.reports) == ("finished", 2, 4)
    reports = [e for e in read_log(log).events if isinstance(e, Report)]
    assert [(r.rank, r.index) for r in reports if r.rank == 1] == [(1, 0), (1, 1)]
    assert all(r.checkpoint in (None, str(kept)) for r in reports)
    if state_dir is not None:
        assert sorted(p.name for p in state_dir.iterdir() if p.name.startswith("checkpoint")) == [
            "checkpoint_000001"
        ]


async def test_the_longest_name_and_path_the_os_takes_are_kept(anyio_backend: str) -> None:
    """The limits are the system's, not stricter: a name of ``NAME_MAX`` bytes and a path
    one byte short of ``PATH_MAX`` are locations (that nothing is there is not the report's
    business without a state dir)."""
    longest_name = "c" * NAME_MAX
    longest_path = "/" + "d/" * ((PATH_MAX - 2) // 2)
    rounds = Rounds()

    async def worker(reporter: Reporter) -> None:
        await reporter.report({"step": 0}, checkpoint=longest_name)
        await reporter.report({"step": 1}, checkpoint=longest_path)

    async with open_run(world_size=1, callbacks=[rounds]) as run:
        await run.workers(worker)
    assert rounds.rounds == [([0], longest_name), ([1], longest_path)]


async def test_the_ray_reporter_refuses_such_a_location_by_the_same_check(
    anyio_backend: str,
) -> None:
    """The Ray engine's worker reporter makes the local reporter's check, before anything
    reaches Ray (outside a Ray Train worker, ``ray.train.report`` would fail otherwise)."""
    pytest.importorskip("ray.train", reason="Ray Train is not installed (pip install '.[ray]')")
    from adapters._ray_engine import RayReporter

    # A worker's reporter as ``report`` needs it (no hub: a refusal asks the driver nothing).
    reporter = RayReporter.__new__(RayReporter)
    reporter.rank, reporter.world_size, reporter.ended, reporter.attempt = 3, 4, False, 0
    reporter._hub, reporter._looking = None, None
    reporter._first_round = reporter._index = reporter._rounds = 0
    for case, location in REFUSED.items():
        with pytest.raises(ReportError) as info:
            await reporter.report({"step": 0}, checkpoint=location)
        assert (info.value.rank, info.value.field) == (3, "checkpoint")
        assert SAYS[case] in str(info.value), str(info.value)
    assert reporter.reports == 0
