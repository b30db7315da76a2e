"""Stalled ranks (issue 42, item 5): a rank with no report for ``stall_periods``
health-check periods while another rank is at a later step is said once (one console
line, a ``RankStalled`` in the log, ``after_exception`` with ``{rank:
RankStalledError}``), and said to have recovered when it reports again.

Driven on a ``VirtualClock``: each period ends when the test moves the clock, so the
stall falls at a known tick, on asyncio and trio alike."""

from __future__ import annotations

import math
from collections.abc import MutableMapping
from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel
import pytest
from structlog.testing import capture_logs

from eventbus import RankRecovered, RankStalled, TrainRunContext, VirtualClock
from eventbus._options import OptionTypeError
from eventbus.log import read_log
from eventbus.options import OptionError
from eventbus.testing import replay_log
from handlers import RankStalledError, Reporter, Run, UserCallback, open_run

pytestmark = pytest.mark.anyio


class Heard(UserCallback):
    """Keeps what ``after_exception`` was given."""

    def __init__(self) -> None:
        self.exceptions: list[dict[int, Exception]] = []

    def after_exception(
        self, run_context: TrainRunContext, exceptions: dict[int, Exception]
    ) -> None:
        self.exceptions.append(dict(exceptions))


async def period(run: Run, clock: VirtualClock, ranks: tuple[int, ...]) -> None:
    """One period of 1 s: each of ``ranks`` reports once, then the period ends."""
    for rank in ranks:
        await run.reporter(rank).report({"loss": 1.0})
    await run.bus.wait_idle()
    clock.advance(1.0)
    await run.bus.wait_idle()


def said(logs: list[MutableMapping[str, Any]], start: str) -> list[str]:
    return [entry["event"] for entry in logs if entry["event"].startswith(start)]


async def test_a_silent_rank_is_said_stalled_once_and_recovered(tmp_path: Path) -> None:
    clock, heard, log = VirtualClock(), Heard(), tmp_path / "run.evlog"
    with capture_logs() as logs:
        async with open_run(
            world_size=2, callbacks=[heard], clock=clock, period=1.0, stall_periods=3, log=log
        ) as run:
            await period(run, clock, (0, 1))  # both at step 0 (time 0)
            await period(run, clock, (0,))  # 2 s silent at this tick: not yet
            assert heard.exceptions == []
            for _ in range(4):  # silent 3 s at the next tick, then 4, 5, 6: said once
                await period(run, clock, (0,))
            await period(run, clock, (0, 1))  # it reports again
            await period(run, clock, (0, 1))
    stalls = said(logs, "rank 1 stalled")
    assert stalls == [
        "rank 1 stalled: no report for 3.0 s (3 periods of 1 s), last at step 0; "
        "the other ranks are at step 2"
    ]
    assert said(logs, "rank 1 recovered") == ["rank 1 recovered after 6.0 s: reported step 1"]
    assert len(heard.exceptions) == 1
    (error,) = heard.exceptions[0].values()
    assert list(heard.exceptions[0]) == [1] and isinstance(error, RankStalledError)
    assert (error.rank, error.silent_s, error.last_index) == (1, 3.0, 0)
    assert str(error) == stalls[0]
    events = read_log(log).events
    (stall,) = [e for e in events if isinstance(e, RankStalled)]
    assert (stall.rank, stall.last_index, stall.others_at, stall.periods) == (1, 0, 2, 3)
    (recovered,) = [e for e in events if isinstance(e, RankRecovered)]
    assert (recovered.rank, recovered.index, recovered.silent_s) == (1, 1, 6.0)
    assert run.result.status == "finished"

    # A replay delivers the recorded stall once, judging nothing again.
    again = Heard()
    await replay_log(log, again)
    assert [list(d) for d in again.exceptions] == [[1]]
    assert isinstance(again.exceptions[0][1], RankStalledError)


async def test_a_rank_that_stalls_twice_is_said_twice() -> None:
    clock, heard = VirtualClock(), Heard()
    with capture_logs() as logs:
        async with open_run(
            world_size=2, callbacks=[heard], clock=clock, period=1.0, stall_periods=2
        ) as run:
            for _ in range(2):
                await period(run, clock, (0, 1))
                for _ in range(3):
                    await period(run, clock, (0,))
            await period(run, clock, (0, 1))
    assert len(said(logs, "rank 1 stalled")) == 2 == len(heard.exceptions)
    assert len(said(logs, "rank 1 recovered")) == 2


async def test_ranks_silent_together_at_one_step_have_not_stalled() -> None:
    """A pause every rank takes (an evaluation, the run's end) is no stall; nor is
    the wait of a rank ahead of one that hangs: only the rank behind is named."""
    clock, heard = VirtualClock(), Heard()
    with capture_logs() as logs:
        async with open_run(
            world_size=3, callbacks=[heard], clock=clock, period=1.0, stall_periods=2
        ) as run:
            await period(run, clock, (0, 1, 2))
            for _ in range(5):
                await period(run, clock, ())  # all silent at step 0
            await period(run, clock, (0, 1))  # rank 2 hangs; 0 and 1 wait for it
            for _ in range(5):
                await period(run, clock, ())
    assert said(logs, "rank 0 stalled") == said(logs, "rank 1 stalled") == []
    assert len(said(logs, "rank 2 stalled")) == 1
    assert [list(d) for d in heard.exceptions] == [[2]]


async def test_by_default_no_rank_is_watched() -> None:
    clock, heard = VirtualClock(), Heard()
    with capture_logs() as logs:
        async with open_run(world_size=2, callbacks=[heard], clock=clock, period=1.0) as run:
            await period(run, clock, (0, 1))
            for _ in range(20):
                await period(run, clock, (0,))
    assert said(logs, "rank 1") == [] and heard.exceptions == []
    assert run.attachment is not None and run.attachment.reports.stalls == 0


async def test_on_stall_restart_restarts_the_group_as_a_failure_of_that_rank() -> None:
    """A worker hung in its step (``on_stall="restart"``): its group is cancelled and
    restarted, and the run goes on to the end; ``after_exception`` heard of it once."""
    clock, heard = VirtualClock(), Heard()
    steps: dict[int, list[int]] = {0: [], 1: []}

    async def train(reporter: Reporter) -> None:
        for step in range(6):
            if reporter.rank == 1 and reporter.attempt == 0 and step == 2:
                await anyio.sleep_forever()  # a dead data loader
            await reporter.report({"step": float(step)})
            steps[reporter.rank].append(step)
            if reporter.rank == 0:
                await run.bus.wait_idle()
                clock.advance(1.0)
            await anyio.lowlevel.checkpoint()

    with capture_logs() as logs, anyio.fail_after(10):
        async with open_run(
            world_size=2,
            callbacks=[heard],
            clock=clock,
            period=1.0,
            stall_periods=2,
            on_stall="restart",
        ) as run:
            await run.workers(train, max_restarts=1)
    assert run.restarts == 1 and run.result.status == "finished"
    assert [list(d) for d in heard.exceptions] == [[1]]
    assert len(said(logs, "rank 1 stalled")) == 1
    assert len(said(logs, "restarting the worker group after rank(s) 1")) == 1
    assert steps[1][-1] == 5


@pytest.mark.parametrize("value", [0, -1, 2.0, math.nan, True, 10**30, "3", 10**6 + 1])
async def test_stall_periods_refuses_a_hostile_number_naming_it(value: Any) -> None:
    with pytest.raises((OptionError, OptionTypeError)) as info:
        open_run(world_size=2, stall_periods=value)
    assert info.value.option == "stall_periods" and str(info.value).startswith("stall_periods")


async def test_on_stall_is_checked() -> None:
    with pytest.raises(OptionError, match="on_stall must be one of 'restart', 'warn', got 'stop'"):
        open_run(world_size=2, stall_periods=2, on_stall="stop")  # type: ignore[arg-type]
    with pytest.raises(OptionError, match="on_stall='restart' needs stall_periods"):
        open_run(world_size=2, on_stall="restart")


async def tick(run: Run, clock: VirtualClock, seconds: float = 1.0) -> None:
    await run.bus.wait_idle()
    clock.advance(seconds)
    await run.bus.wait_idle()


async def test_where_rounds_come_whole_the_rank_behind_the_others_progress_stalls(
    tmp_path: Path,
) -> None:
    """Ray's way: rounds come whole (``report_round``), never partial, and the engine
    tells each rank's progress (``heard``). Rank 0 waits in its report 1 for rank 1,
    which hangs after its report 0: rank 1 is named, once, with the same line, event
    and ``after_exception`` as where rounds are gathered here; its report 0's round,
    taken after its progress told it, does not restart its silence."""
    clock, heard, log = VirtualClock(), Heard(), tmp_path / "run.evlog"
    with capture_logs() as logs:
        async with open_run(
            world_size=2, callbacks=[heard], clock=clock, period=1.0, stall_periods=2, log=log
        ) as run:
            run.heard(0, 0)
            run.heard(1, 0)  # both made report 0 at time 0
            await tick(run, clock, 0.5)
            run.heard(0, 1, ago=0.25)  # rank 0 entered report 1 at 0.25, and waits there
            await run.report_round([{"loss": 1.0}, {"loss": 1.0}])  # round 0, at 0.5
            await tick(run, clock, 0.5)  # tick at 1: silent 1 s, not yet
            assert heard.exceptions == []
            for _ in range(3):  # silent 2 s at the tick at 2: said once
                await tick(run, clock)
            run.heard(1, 1, ago=0.5)  # at 4: it entered report 1 at 3.5
            await run.report_round([{"loss": 0.5}, {"loss": 0.5}])
            await tick(run, clock)
            for step in (2, 3):  # in step again: nothing more is said
                run.heard(0, step)
                run.heard(1, step)
                await run.report_round([{"loss": 0.1}, {"loss": 0.1}])
                await tick(run, clock)
    assert said(logs, "rank 0") == []
    assert said(logs, "rank 1 stalled") == [
        "rank 1 stalled: no report for 2.0 s (2 periods of 1 s), last at step 0; "
        "the other ranks are at step 1"
    ]
    assert said(logs, "rank 1 recovered") == ["rank 1 recovered after 3.5 s: reported step 1"]
    assert [list(d) for d in heard.exceptions] == [[1]]
    assert isinstance(heard.exceptions[0][1], RankStalledError)
    events = read_log(log).events
    (stall,) = [e for e in events if isinstance(e, RankStalled)]
    assert (stall.rank, stall.silent_s, stall.last_index, stall.others_at) == (1, 2.0, 0, 1)
    (recovered,) = [e for e in events if isinstance(e, RankRecovered)]
    assert (recovered.rank, recovered.index, recovered.silent_s) == (1, 1, 3.5)
    assert run.result.rounds == 4 and run.result.status == "finished"


async def test_whole_rounds_with_no_progress_told_name_no_rank() -> None:
    """Without ``heard`` (Lightning's whole rounds), a silence of every rank is a pause
    they all take, and progress equal at every rank names none either."""
    clock, heard = VirtualClock(), Heard()
    with capture_logs() as logs:
        async with open_run(
            world_size=2, callbacks=[heard], clock=clock, period=1.0, stall_periods=2
        ) as run:
            await run.report_round([{"loss": 1.0}, {"loss": 1.0}])
            for _ in range(5):
                await tick(run, clock)
            run.heard(0, 1)
            run.heard(1, 1)
            for _ in range(5):
                await tick(run, clock)
    assert said(logs, "rank") == [] and heard.exceptions == []


@pytest.mark.parametrize(
    ("rank", "index", "ago", "says"),
    [
        (2, 0, 0.0, "progress of rank 2, which is not a required rank (required: [0, 1])"),
        (True, 0, 0.0, "progress of rank True, which is not a required rank"),
        (0, -1, 0.0, "progress of rank 0: index -1 is no report index"),
        (0, 1.0, 0.0, "progress of rank 0: index 1.0 is no report index"),
        (0, 0, -1.0, "progress of rank 0: ago must be seconds >= 0, got -1.0"),
        (0, 0, math.nan, "progress of rank 0: ago must be seconds >= 0, got nan"),
    ],
)
async def test_progress_that_is_no_progress_is_refused_naming_it(
    rank: Any, index: Any, ago: Any, says: str
) -> None:
    async with open_run(world_size=2, period=1.0, stall_periods=2) as run:
        with pytest.raises(ValueError) as info:
            run.heard(rank, index, ago)
        assert str(info.value).startswith(says)
