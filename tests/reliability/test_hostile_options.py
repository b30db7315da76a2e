"""Hostile options, generated: every numeric option at every way in (issue 23, item 1-3).

Hypothesis draws an option and a value for it: NaN, ±inf, zero and negative zero,
negatives, subnormals, huge numbers, numbers of the wrong type (a float for a count,
a bool, a str, None, a list). Whatever it draws, the call either

- refuses it up front, with an ``OptionError`` (``ValueError``) or an
  ``OptionTypeError`` (``TypeError``) whose ``option`` and message name it; or
- accepts it, and then a real run (reports, a callback, a log) ends in bounded
  time with ``after_run`` exactly once and one ``RunFinished`` in its log, and a
  bare bus carries and closes in bounded time and memory.

On asyncio and trio alike.
"""

from __future__ import annotations

import math
import os
import uuid
from pathlib import Path
from typing import Any

import anyio
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from eventbus import EventBus, Report, RunFinished, RunResult, TrainRunContext
from eventbus._options import OptionTypeError
from eventbus.log import read_log
from eventbus.options import OptionError
from handlers import UserCallback, open_run

from ._figures import FIGURES

pytestmark = pytest.mark.anyio

EXAMPLES = 1500 if os.environ.get("RELIABILITY_SOAK", "") not in ("", "0") else 150

floats = st.one_of(
    st.sampled_from([math.nan, math.inf, -math.inf, 0.0, -0.0, 5e-324, -5e-324, 1e308]),
    st.floats(allow_nan=True, allow_infinity=True, allow_subnormal=True),
    st.floats(min_value=1e-4, max_value=5.0),  # mostly in range: these run
)
counts = st.one_of(
    st.sampled_from([0, -1, 2**63, 10**30, 1 << 20, (1 << 20) + 1, 131_072, 131_073]),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.integers(min_value=1, max_value=8),
)
wrong_types = st.sampled_from(["2", "", None, True, False, [1], {"a": 1}, b"1", 1j])
values = st.one_of(floats, counts, wrong_types)

#: Option -> how big a run it may make when accepted (world sizes run with rank 0 only).
OPTIONS = ("timeout", "period", "budget", "buffer", "drain_timeout", "world_size")


class Ending(UserCallback):
    def __init__(self) -> None:
        self.ends: list[RunResult] = []

    def after_report(self, run_context: TrainRunContext, metrics: Any, checkpoint: Any) -> None:
        pass

    def after_run(self, run_context: TrainRunContext, result: RunResult) -> None:
        self.ends.append(result)


def _named(error: BaseException, option: str) -> None:
    assert isinstance(error, OptionError | OptionTypeError), repr(error)
    assert isinstance(error, ValueError | TypeError)
    assert error.option == option and option in str(error)


async def _open_run_with(tmp_path: Path, option: str, value: Any) -> str:
    keywords: dict[str, Any] = {"world_size": 2, option: value}
    ending = Ending()
    log = tmp_path / f"{uuid.uuid4().hex}.evlog"
    try:
        run = open_run(callbacks=[ending], log=log, **keywords)
    except (ValueError, TypeError) as exc:
        _named(exc, option)
        return "refused"
    with anyio.fail_after(30):
        async with run:
            for rank in (0, 1) if run.world_size >= 2 else (0,):
                reporter = run.reporter(rank)
                for _ in range(3):
                    await reporter.report({"loss": 1.0})
    assert len(ending.ends) == 1
    finished = [e for e in read_log(log).events if isinstance(e, RunFinished)]
    assert len(finished) == 1 and finished[0].status == "finished"
    return "ran"


async def _bus_with(option: str, value: Any) -> str:
    if option == "world_size":
        return "not a bus option"
    seen: list[int] = []
    try:
        bus = EventBus(**{option: value})
    except (ValueError, TypeError) as exc:
        _named(exc, option)
        return "refused"
    with anyio.fail_after(30):
        async with bus:
            bus.subscribe(Report, lambda e: seen.append(e.index))
            for index in range(5):
                await bus.publish(Report(run_id="r", rank=0, world_size=1, index=index, metrics={}))
            await bus.wait_idle()
    assert seen == list(range(5)) and bus.stats().queued == 0
    return "ran"


@settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(option=st.sampled_from(OPTIONS), value=values)
async def test_a_hostile_option_is_refused_naming_it_or_the_run_ends_in_order(
    tmp_path: Path, option: str, value: Any
) -> None:
    outcome = await _open_run_with(tmp_path, option, value)
    bus_outcome = await _bus_with(option, value)
    FIGURES.add(
        "hostile options",
        examples=1,
        refused=int(outcome == "refused"),
        ran=int(outcome == "ran"),
        bus_refused=int(bus_outcome == "refused"),
        bus_ran=int(bus_outcome == "ran"),
    )
