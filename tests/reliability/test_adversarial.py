"""Adversarial runs: arbitrary metric values and callbacks that do anything, generated.

The other suites inject faults we chose. Here hypothesis chooses: metrics
hold arbitrary Python values (objects, paths, NaN, huge integers, deep
nesting, non-str keys, not even a dict), workers reuse and change the dicts
they reported, and callbacks raise anything (``BaseException`` subclasses,
stray cancellations, interrupts), hang, return coroutines from sync methods,
flood the bus with emitted events, or call back into it. Whatever happens:

- ``after_run`` runs exactly once for every callback, and the run ends with a
  status that says what ended it (an interrupt: ``cancelled``; ``SystemExit``:
  ``failed``), raising that exception as itself;
- the log reads back whole, with exactly one ``RunFinished``, matching the
  run's status, and every event in sequence;
- every report is either refused where it is made (``ReportError``: a log
  cannot hold it), or gathered or rejected, and counted (``reports +
  rejected`` is what the workers sent), and callbacks saw what was reported;
- what the bus held stayed bounded.
"""

from __future__ import annotations

import copy
import math
import os
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel
import pytest
from _builders import nested_dict
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from eventbus import Event, EventPlaceholder, Report, RunFinished, RunResult, TrainRunContext
from eventbus._bus import EMIT_HEADROOM
from eventbus._lanes import MAX_BATCH
from eventbus.log import read_log
from handlers import Reporter, ReportError, UserCallback, open_run
from handlers._metric_values import MetricsError, freeze_metrics

from ._figures import FIGURES

pytestmark = pytest.mark.anyio

#: Runs per backend (each takes a few milliseconds); many more with the soak.
EXAMPLES = 3000 if os.environ.get("RELIABILITY_SOAK", "") not in ("", "0") else 300
#: The callbacks' deadline: hung ones cost this much.
DEADLINE = 0.05


class Custom(BaseException):
    """A ``BaseException`` subclass that is neither an interrupt nor a cancellation."""


class Opaque:
    """An object no encoder knows."""


class Noise(Event, frozen=True, kw_only=True):
    """What a flooding callback emits."""

    i: int


def stray_cancellation() -> BaseException:
    cancelled = anyio.get_cancelled_exc_class()
    create = getattr(cancelled, "_create", None)  # trio.Cancelled has no public constructor
    exc: BaseException = create() if create is not None else cancelled()
    return exc


# --- what workers report ---------------------------------------------------------------------

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**80), max_value=2**80),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=8),
    st.binary(max_size=4),
    st.builds(Opaque),
    st.builds(Path, st.sampled_from(["/tmp", "x/y"])),
)
values = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3),
        st.tuples(inner, inner),
        st.dictionaries(st.one_of(st.text(max_size=4), st.integers(0, 3)), inner, max_size=3),
    ),
    max_leaves=8,
)
flat_metrics = st.dictionaries(
    st.text(max_size=6), st.one_of(st.floats(allow_nan=True), st.integers(0, 100)), max_size=4
)
metrics = st.one_of(
    flat_metrics,
    flat_metrics,  # mostly reports that are fine
    st.dictionaries(st.one_of(st.text(max_size=6), st.integers(0, 3)), values, max_size=4),
    values,  # not even a dict, sometimes
    st.just("deep"),  # stands for a dict nested 10,000 deep (built in the worker)
)


# --- what callbacks do -----------------------------------------------------------------------

BEHAVIOURS = (
    "fine",
    "raise",
    "raise_base",
    "generator_exit",
    "stray_cancel",
    "keyboard_interrupt",
    "system_exit",
    "hang",
    "return_coroutine",
    "emit_flood",
    "wait_idle",
    "publish",
    "aclose",
    "mutate",
    "after_run_raises",
)
FATAL = {"keyboard_interrupt": KeyboardInterrupt, "system_exit": SystemExit}


class Adversary(UserCallback):
    """Behaves well except on round ``at``, where it does ``behaviour`` (sync or async)."""

    timeout = DEADLINE

    def __init__(self, behaviour: str, at: int, key: int) -> None:
        self.behaviour = behaviour
        self.at = at
        self.state_key = str(key)
        self.round = 0
        self.before = 0
        self.after: list[RunResult] = []
        self.seen: list[list[dict[str, Any]]] = []
        self.coroutines_run = 0
        self.bus: Any = None

    def before_run(self, run_context: TrainRunContext) -> None:
        self.before += 1

    def after_run(self, run_context: TrainRunContext, result: RunResult) -> None:
        self.after.append(result)
        if self.behaviour == "after_run_raises":
            raise ValueError("adversary, at the end")

    def act(self, metrics: list[dict[str, Any]]) -> Any:
        self.seen.append([dict(m) for m in metrics])
        self.round += 1
        if self.round != self.at:
            return None
        match self.behaviour:
            case "raise":
                raise ValueError("adversary")
            case "raise_base":
                raise Custom("adversary")
            case "generator_exit":
                raise GeneratorExit
            case "stray_cancel":
                raise stray_cancellation()
            case "keyboard_interrupt" | "system_exit":
                raise FATAL[self.behaviour]()
            case "emit_flood":
                for i in range(EMIT_HEADROOM * 3):  # BusFull before the end: its fault
                    self.bus.emit(Noise(i=i))
            case "mutate":
                metrics[0]["injected"] = True  # read-only: TypeError, the callback's fault
        return self.behaviour


class SyncAdversary(Adversary):
    def after_report(
        self, run_context: TrainRunContext, metrics: list[dict[str, Any]], checkpoint: str | None
    ) -> Any:
        if self.act(metrics) == "return_coroutine":
            return self.later()  # a coroutine from a sync method: awaited, never dropped
        return None

    async def later(self) -> None:
        await anyio.lowlevel.checkpoint()
        self.coroutines_run += 1


class AsyncAdversary(Adversary):
    async def after_report(
        self, run_context: TrainRunContext, metrics: list[dict[str, Any]], checkpoint: str | None
    ) -> None:
        behaviour = self.act(metrics)
        if behaviour == "hang":
            await anyio.sleep_forever()
        elif behaviour == "wait_idle":
            await self.bus.wait_idle()  # waits for itself: refused at once
        elif behaviour == "publish":
            for i in range(self.bus.buffer + 1):  # must wait for room at the end: refused
                await self.bus.publish(Noise(i=i))
        elif behaviour == "aclose":
            await self.bus.aclose()  # refused: it would wait for itself
        await anyio.lowlevel.checkpoint()


adversaries = st.lists(
    st.tuples(st.sampled_from(BEHAVIOURS), st.integers(1, 4), st.booleans()),
    min_size=1,
    max_size=4,
)


async def outcome(body: Callable[[], Awaitable[Any]]) -> BaseException | None:
    """What ``body`` raised, whatever it is (no interrupt may escape into pytest)."""
    try:
        await body()
    except BaseException as exc:
        return exc
    return None


async def adversarial_run(
    tmp: Path, world_size: int, reports: list[Any], plans: list[tuple[str, int, bool]]
) -> dict[str, int]:
    callbacks: list[Adversary] = [
        (AsyncAdversary if use_async else SyncAdversary)(behaviour, at, key)
        for key, (behaviour, at, use_async) in enumerate(plans)
    ]
    log = tmp / "run.evlog"
    log.unlink(missing_ok=True)
    run = open_run(world_size=world_size, callbacks=callbacks, period=0.02, timeout=1.0, log=log)
    for callback in callbacks:
        callback.bus = run.bus
    #: What each rank reported, as it was when reported; what ``report`` refused.
    sent: list[list[Any]] = [[] for _ in range(world_size)]
    refused = [0] * world_size

    async def worker(reporter: Reporter) -> None:
        shared: dict[str, Any] = {}  # reused, and changed after each report
        for planned in reports:
            value = nested_dict(10_000) if planned == "deep" else planned
            if isinstance(value, dict) and len(value) <= 2 and all(type(k) is str for k in value):
                shared.clear()
                shared.update(value)
                value = shared
            kept = "deep" if planned == "deep" else copy.deepcopy(value)
            # Kept before: an interrupt may end the worker inside ``report``, once the
            # report is out (its callbacks run there).
            sent[reporter.rank].append(kept)
            try:
                await reporter.report(value)
            except ReportError:  # what a log cannot hold is refused where it is reported
                assert not _acceptable(kept)
                sent[reporter.rank].pop()
                refused[reporter.rank] += 1
            else:
                assert _acceptable(kept)
            if value is shared:
                shared["changed after the report"] = 1.0
            await anyio.lowlevel.checkpoint()

    async def body() -> None:
        async with run:
            await run.workers(worker)

    with anyio.fail_after(120):  # a hang guard, not a timing assertion
        raised = await outcome(body)

    fatal = [FATAL[b] for b, at, _ in plans if b in FATAL and at <= len(reports)]
    if raised is not None:
        assert fatal, f"the run raised {raised!r} with no interrupt injected"
        assert type(raised) in fatal, raised
        expected = "cancelled" if type(raised) is KeyboardInterrupt else "failed"
    else:
        expected = "finished"
    assert run.status == expected
    for callback in callbacks:
        assert callback.before == 1
        assert [r.status for r in callback.after] == [expected], callback.behaviour
        returned = callback.behaviour == "return_coroutine" and type(callback) is SyncAdversary
        if returned and callback.round >= callback.at:
            assert callback.coroutines_run == 1

    contents = read_log(log)
    assert contents.truncated is None and contents.skipped == 0
    events = contents.events
    assert [e.seq for e in events] == list(range(len(events)))
    finished = [e for e in events if isinstance(e, RunFinished)]
    assert [f.status for f in finished] == [expected]

    result = callbacks[0].after[0]
    published = sum(
        1
        for e in events
        if isinstance(e, Report) or (isinstance(e, EventPlaceholder) and e.event_type == "Report")
    )
    # Every report published was either gathered or rejected, and counted; without an
    # interrupt, that is every report the workers made but those refused at once.
    assert result.reports + result.rejected == published
    if raised is None:
        assert published == sum(len(s) for s in sent)
        assert published + sum(refused) == world_size * len(reports)
    # Callbacks saw what was reported: each round is the ranks' reports, as sent.
    for callback in callbacks:
        for index, round_seen in enumerate(callback.seen):
            for rank, metrics_seen in enumerate(round_seen):
                assert _same(metrics_seen, sent[rank][index])
    assert run.bus.stats().queued <= run.bus.buffer + EMIT_HEADROOM + 2 * MAX_BATCH
    return {"events_checked": len(events), "reports": sum(len(s) for s in sent)}


def _acceptable(value: Any) -> bool:
    if value == "deep":
        return False
    try:
        freeze_metrics(value)
    except MetricsError:
        return False
    return True


def _same(seen: Any, sent: Any) -> bool:
    """Equal as reported, NaN equal to NaN, tuples as lists, subclasses as their base."""
    if isinstance(sent, float) and isinstance(seen, float):
        return (math.isnan(sent) and math.isnan(seen)) or sent == seen
    if isinstance(sent, dict):
        return (
            isinstance(seen, dict)
            and list(seen) == [k for k in sent if k != "changed after the report"]
            and all(_same(seen[k], sent[k]) for k in seen)
        )
    if isinstance(sent, (list, tuple)):
        return (
            isinstance(seen, list)
            and len(seen) == len(sent)
            and all(_same(a, b) for a, b in zip(seen, sent, strict=True))
        )
    return bool(seen == sent) and type(seen) is type(sent)


@settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    world_size=st.integers(1, 3),
    reports=st.lists(metrics, min_size=1, max_size=6),
    plans=adversaries,
)
def test_adversarial_runs_end_in_order_and_lose_nothing(
    tmp_path: Path,
    anyio_backend: str,
    world_size: int,
    reports: list[Any],
    plans: list[tuple[str, int, bool]],
) -> None:
    figures = anyio.run(
        adversarial_run, tmp_path, world_size, reports, plans, backend=anyio_backend
    )
    FIGURES.add(
        "adversarial",
        runs=1,
        callbacks=len(plans),
        misbehaving=sum(1 for b, _, _ in plans if b != "fine"),
        lost=0,
        **figures,
    )
