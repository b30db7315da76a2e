"""What the trackers (TensorBoard, MLflow) share: rounds and costs as scalars, a writer
thread (writes cost milliseconds a step must not wait for), and the state a resume continues
(docs/operations/trackers.md).

A failure is marked at the step of the last round before it, once that is known (the
group's restart or the run's end): rounds reported ahead of it are gathered after it.
"""

from __future__ import annotations

import hashlib
import math
import queue
import sys
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, ClassVar, TypeGuard

import anyio
import anyio.to_thread

from eventbus import (
    BudgetReport,
    CheckpointSaved,
    Event,
    RoundGathered,
    RunResult,
    StatefulCallback,
    TrainRunContext,
    WorkerFailure,
    WorkerGroupRestarted,
)
from eventbus._logging import get_logger
from eventbus._subscription import OverBudgetPolicy
from eventbus._text import describe as describe_exception
from handlers import UserCallback
from handlers._metrics import mean_metrics

__all__ = [
    "STEP_METRIC",
    "TrackerCallback",
    "TrackerError",
    "backend_name",
    "cost_scalars",
    "flat_config",
    "round_scalars",
    "safe_text",
]

_log = get_logger("adapters.trackers")

#: The run's config key naming the metric that is the trackers' step.
STEP_METRIC = "step_metric"
_MESSAGE_LIMIT = 4096  # characters


class TrackerError(RuntimeError):
    """A tracker's writes failed; the message names the tracker and the first error."""


def round_scalars(
    metrics: Sequence[dict[str, Any]], ranks: Sequence[int], *, per_rank: bool
) -> dict[str, float]:
    """A round as scalars: ``<metric>``, the mean over ranks, and with ``per_rank`` and
    several ranks ``<metric>/rank_<i>``. Only numbers a float holds count."""
    if len(metrics) == 1:
        alone = metrics[0].items()
        return {key: float(v) for key, v in alone if _is_number(v) and _fits(v)}
    try:
        means = mean_metrics(metrics)
    except OverflowError:  # an int past a float's range (a report's hold 64 bits)
        means = mean_metrics([{k: v for k, v in m.items() if _fits(v)} for m in metrics])
    scalars: dict[str, float] = {key: float(v) for key, v in means.items() if _fits(v)}
    if per_rank and len(metrics) > 1:
        for rank, reported in zip(ranks, metrics, strict=False):
            for key, value in reported.items():
                if _is_number(value) and _fits(value):
                    scalars[f"{key}/rank_{rank}"] = float(value)
    return scalars


def cost_scalars(reports: Sequence[BudgetReport]) -> dict[str, float]:
    """The cost of the periods that ended at one step: ``callbacks/<handler>/share``,
    ``callbacks/share``, and timeouts, faults and skipped events when there were any."""
    # The last period, cut short at close, has counts but no meaningful shares.
    whole = [r for r in reports if not r.partial and r.end > r.start]
    judged = {id(r) for r in whole}
    length = sum(r.end - r.start for r in whole)
    scalars = {"callbacks/share": sum(r.total for r in whole) / length} if whole else {}
    took: dict[str, float] = {}
    for report in reports:
        for usage in report.handlers:
            prefix = f"callbacks/{usage.handler}"
            if id(report) in judged:
                took[prefix] = took.get(prefix, 0.0) + usage.total
            for name in ("timeouts", "faults", "skipped"):
                count = getattr(usage, name)
                if count:
                    key = f"{prefix}/{name}"
                    scalars[key] = scalars.get(key, 0.0) + count
    for prefix, total in took.items():
        scalars[f"{prefix}/share"] = total / length
    return scalars


def safe_text(text: str) -> str:
    """``text`` with lone surrogates as their escapes (``\\udcff``), which UTF-8 can hold."""
    try:
        text.encode()
    except UnicodeEncodeError:
        return text.encode("utf-8", "backslashreplace").decode()
    return text


def backend_name(name: str, rule: Callable[[str], str], limit: int | None) -> str:
    """``name`` as a backend takes it: itself if ``rule`` leaves it so within ``limit``;
    else the rule's name, cut, plus ``-`` and a stable hash, so merged names stay apart."""
    fixed = rule(name)
    if fixed == name and (limit is None or len(name) <= limit):
        return name
    digest = hashlib.blake2b(name.encode("utf-8", "surrogatepass"), digest_size=4).hexdigest()
    suffix = f"-{digest}"
    cut = fixed if limit is None else fixed[: limit - len(suffix)]
    return rule(cut + suffix)


#: Names a tracker remembers, per kind, before it starts afresh (a bound on memory).
_NAMES_KEPT = 65_536


def _shown(name: str) -> str:
    if len(name) <= 80:
        return repr(name)
    return f"{name[:40]!r}...{name[-20:]!r} ({len(name):,} characters)"


#: The longest a worker thread waits for a tracker's thread, seconds, so a stuck writer
#: cannot keep the process from exiting.
_WAIT_LIMIT = 120.0

#: A step the trackers can store: TensorBoard's and MLflow's are 64-bit integers.
_STEP_LIMIT = 2**63

_Item = tuple[Callable[..., Any], tuple[Any, ...]] | threading.Event | None


class _WriterThread:
    """Runs a tracker's writes in order in a daemon thread, and keeps their errors
    for the bus side to raise (a write that raises never stops the thread)."""

    def __init__(self, name: str) -> None:
        #: Writes, marks (``threading.Event``s set when reached) and ``None``, the end.
        self._queue: queue.SimpleQueue[_Item] = queue.SimpleQueue()
        self._errors: list[BaseException] = []
        self._lock = threading.Lock()
        self.put_count = 0
        self.done_count = 0
        self.broken = False
        self.closed = False
        #: The thread's CPU seconds, once it ended (for benchmarks).
        self.cpu_seconds: float | None = None
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def put(self, write: Callable[..., Any], *args: Any) -> None:
        """Hand ``write(*args)`` over; after ``close`` nothing is written."""
        if self.closed:
            return
        self.put_count += 1
        self._queue.put((write, args))

    @property
    def lag(self) -> int:
        return self.put_count - self.done_count

    def keep_error(self, exc: BaseException) -> None:
        """Have the bus side raise ``exc`` as a failed write."""
        with self._lock:
            self._errors.append(exc)

    def take_errors(self) -> list[BaseException]:
        with self._lock:
            errors, self._errors = self._errors, []
        return errors

    async def settle(self) -> None:
        """Wait until every write handed over so far is done (at once after ``close``)."""
        if self.closed:
            return
        done = threading.Event()
        self.put_count += 1
        self._queue.put(done)
        await anyio.to_thread.run_sync(done.wait, _WAIT_LIMIT, abandon_on_cancel=True)

    async def close(self) -> None:
        """Do what is queued, then end the thread."""
        self.closed = True
        self._queue.put(None)
        await anyio.to_thread.run_sync(self._thread.join, _WAIT_LIMIT, abandon_on_cancel=True)

    def _run(self) -> None:
        while (item := self._queue.get()) is not None:
            try:
                if isinstance(item, threading.Event):
                    item.set()
                elif not self.broken:
                    write, args = item
                    write(*args)
            except BaseException as exc:  # kept for the bus side: the thread goes on
                self.keep_error(exc)
            finally:
                self.done_count += 1
        self.cpu_seconds = time.thread_time()


class TrackerCallback(UserCallback, StatefulCallback):
    """Base of the trackers: hands rounds, costs, checkpoints and failures to a writer thread.

    Subclasses write, in that thread, with the methods declared below (``_flush``: at each
    checkpoint). A round's step is its number in the run, across resumes, or its
    ``step_metric`` value (a round without one is not written).

    Attributes:
        rounds: the rounds given to the tracker, across resumes (saved).
        last_step: the step of the last round given (saved: a resume redoes later ones).
    """

    event_types: ClassVar[tuple[type[Event], ...]] = (
        RoundGathered,
        CheckpointSaved,
        BudgetReport,
        WorkerFailure,
        WorkerGroupRestarted,
    )
    #: A flush at a checkpoint may take a while on a slow store.
    timeout: ClassVar[float | None] = 60.0
    #: Every round, always: coalescing would leave rounds out of the tracker.
    over_budget: ClassVar[OverBudgetPolicy | None] = "warn"
    #: What the trackers call themselves in errors ("TensorBoard", "MLflow").
    tracker: ClassVar[str] = "tracker"
    #: Writes the thread may fall behind by before the hooks wait for it.
    max_lag: ClassVar[int] = 10_000

    #: The backend's longest name; ``name_rule`` says ``_backend_rule`` in words.
    name_limit: ClassVar[int | None] = None
    name_rule: ClassVar[str] = ""

    state_attributes: tuple[str, ...] = ("rounds", "last_step")

    # ``_open(run_context, resumed_after)``: ``resumed_after``, the step a resume redoes
    # after; ``_checkpoint(checkpoint, round, step, wall_time)``.
    _open: Callable[[TrainRunContext, int | None], None]
    _scalars: Callable[[dict[str, float], int, float], None]
    _text: Callable[[str, str, int, float], None]
    _checkpoint: Callable[[str, int, int, float], None]
    _flush: Callable[[], None]
    _end: Callable[[RunResult], None]

    def __init__(
        self, *, step_metric: str | None = None, per_rank: bool = True, costs: bool = True
    ) -> None:
        self.step_metric = step_metric
        self.per_rank = per_rank
        self.costs = costs
        self.rounds = 0
        self.last_step: int | None = None
        self.rounds_without_step = 0
        self.failed_writes = 0
        self._thread: _WriterThread | None = None

    # --- the hooks (the bus's side) --------------------------------------------------

    async def before_run(self, run_context: TrainRunContext) -> None:
        if self._thread is not None and not self._thread.closed:
            raise RuntimeError(
                f"{self!r} is already writing a run: give each run its own tracker object"
            )
        thread = self._thread = _WriterThread(f"{type(self).__name__}-writer")
        #: Per kind of name (a metric, a config key, a tag): each name as the backend has it.
        self._known: dict[str, dict[str, str]] = {}
        self._not_numbers: set[str] = set()
        self._said: set[str] = set()
        self.failed_writes = 0
        #: Failures not marked yet, as their entries' lines; costs held for their step.
        self._failures: list[str] = []
        self._costs: list[BudgetReport] = []
        self._costs_step = 0
        configured = run_context.config.get(STEP_METRIC)
        own = self.step_metric
        self._step_key = own if own is not None or not isinstance(configured, str) else configured
        # ``last_step`` is restored before the run begins: set, this run continues one.
        thread.put(self._open_or_break, run_context, self.last_step)

    async def on_event(self, run_context: TrainRunContext, event: Event) -> None:
        thread = self._writer()
        if type(event) is RoundGathered:
            step = self._step_of(event)
            self.rounds += 1
            if step is None:
                return
            self.last_step = step
            thread.put(self._write_round, event, step, time.time())
            if thread.lag > self.max_lag:
                await thread.settle()
        elif type(event) is CheckpointSaved:
            self._put_costs(thread)
            thread.put(self._flush)
            await thread.settle()
        elif type(event) is BudgetReport:
            if self.costs:
                step = self._step_now()
                if self._costs and step != self._costs_step:
                    self._put_costs(thread)
                self._costs.append(event)
                self._costs_step = step
        elif type(event) is WorkerFailure:
            message = f": {event.message[:_MESSAGE_LIMIT]}" if event.message else ""
            self._failures.append(f"rank {event.rank}: {event.error_type}{message}")
        elif type(event) is WorkerGroupRestarted:
            self._mark_failures(thread)
            text = f"worker group restarted: {event.world_size} workers"
            thread.put(self._text, "restarts", text, self._step_now(), time.time())
        self._raise_errors(thread)

    async def after_run(self, run_context: TrainRunContext, result: RunResult) -> None:
        thread = self._writer()
        self._mark_failures(thread)
        self._put_costs(thread)
        thread.put(self._end, result)
        await thread.close()
        self._raise_errors(thread)
        repeated = self.failed_writes - len(self._said)
        if repeated > 0:
            _log.warning(
                f"{self!r}: {repeated:,} more writes to {self.tracker} failed as said before "
                "in this run, each losing what it wrote"
            )

    # --- helpers -----------------------------------------------------------------------

    def _writer(self) -> _WriterThread:
        if self._thread is None:
            raise RuntimeError(f"{self!r} got an event before the run began")
        return self._thread

    def _put_costs(self, thread: _WriterThread) -> None:
        """Hand over the periods' costs held for their step: one point a step."""
        if self._costs:
            scalars = cost_scalars(self._costs)  # per period, not per step: cheap here
            thread.put(self._write_scalars, scalars, self._costs_step, time.time())
            self._costs = []

    def _mark_failures(self, thread: _WriterThread) -> None:
        """The failures since the last mark, as one entry at the last round's step."""
        if self._failures:
            text, self._failures = "\n\n".join(self._failures), []
            thread.put(self._text, "failures", text, self._step_now(), time.time())

    def _step_now(self) -> int:
        return self.last_step if self.last_step is not None else 0

    def _step_of(self, event: RoundGathered) -> int | None:
        name = self._step_key
        if name is None:
            return self.rounds
        for reported in event.metrics:
            value = reported.get(name)
            if _is_number(value) and math.isfinite(value) and abs(value) < _STEP_LIMIT:
                return int(value)
        self.rounds_without_step += 1
        if self.rounds_without_step == 1:
            _log.warning(
                f"{self!r}: a round without a finite {name!r} metric (a 64-bit step) is "
                f"not written (step_metric={name!r}); this warning is shown once",
                round=event.round,
            )
        return None

    def _raise_errors(self, thread: _WriterThread) -> None:
        """Raise the first failed write not said before; count the rest (no flood)."""
        errors = thread.take_errors()
        self.failed_writes += len(errors)
        new = [exc for exc in errors if describe_exception(exc) not in self._said]
        if not new:
            return
        first = describe_exception(new[0])
        if len(self._said) < _NAMES_KEPT:
            self._said.add(first)
        notes = "".join(f"; {note}" for note in getattr(new[0], "__notes__", ()))
        more = f" (and {len(errors) - 1} more writes failed)" if len(errors) > 1 else ""
        broken = "; nothing more is written" if thread.broken else ""
        raise TrackerError(
            f"{self!r}: writing to {self.tracker} failed: {first}{notes}{more}{broken}"
        ) from new[0]

    def _name(self, name: str, what: str = "metric") -> str:
        """``backend_name`` of ``name``, cached, with one warning per name renamed (per kind:
        a config key and a metric of one name are each said)."""
        known = self._known.setdefault(what, {})
        mapped = known.get(name)
        if mapped is None:
            if len(known) >= _NAMES_KEPT:
                known.clear()
            mapped = known[name] = backend_name(name, self._backend_rule, self.name_limit)
            if mapped != name:
                _log.warning(
                    f"{self!r}: {what} {_shown(name)} is written as {_shown(mapped)}: "
                    f"{self.name_rule}; a hash of the name after it keeps names apart (said "
                    "once per name)"
                )
        return mapped

    @staticmethod
    def _backend_rule(name: str) -> str:
        """``name`` as one the backend takes; by default any text as it is."""
        return name

    # --- in the writer thread ----------------------------------------------------------

    def _open_or_break(self, run_context: TrainRunContext, resumed_after: int | None) -> None:
        try:
            self._open(run_context, resumed_after)
        except Exception:
            self._writer().broken = True
            raise

    def _write_round(self, event: RoundGathered, step: int, wall_time: float) -> None:
        metrics: Sequence[dict[str, Any]] = event.metrics
        if (key := self._step_key) is not None:  # the x-axis, not a series
            metrics = [{k: v for k, v in m.items() if k != key} for m in metrics]
        self._say_not_numbers(metrics)
        self._write_scalars(
            round_scalars(metrics, event.ranks, per_rank=self.per_rank), step, wall_time
        )
        if event.checkpoint is not None:
            self._checkpoint(event.checkpoint, event.round, step, wall_time)

    def _write_scalars(self, scalars: dict[str, float], step: int, wall_time: float) -> None:
        if scalars:
            named = {self._name(name): value for name, value in scalars.items()}
            self._scalars(named, step, wall_time)

    def _say_not_numbers(self, metrics: Sequence[dict[str, Any]]) -> None:
        """One warning for each metric left out for not being a number."""
        for reported in metrics:
            for name, value in reported.items():
                if (_is_number(value) and _fits(value)) or name in self._not_numbers:
                    continue
                if len(self._not_numbers) >= _NAMES_KEPT:
                    self._not_numbers.clear()
                self._not_numbers.add(name)
                kind = "None" if value is None else f"a {type(value).__name__}"
                what = "past a float's range" if _is_number(value) else f"{kind}, not a number"
                _log.warning(
                    f"{self!r}: metric {_shown(name)} is {what}: it is not written to "
                    f"{self.tracker} (said once per name)"
                )


def flat_config(config: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """A run's config with nested dicts as ``outer.inner`` keys."""
    flat: dict[str, Any] = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            flat.update(flat_config(value, f"{name}."))
        else:
            flat[name] = value
    return flat


def _fits(value: object) -> bool:
    return type(value) is not int or -_FLOAT_MAX <= value <= _FLOAT_MAX


_FLOAT_MAX = int(sys.float_info.max)


def _is_number(value: object) -> TypeGuard[int | float]:
    return isinstance(value, int | float) and not isinstance(value, bool)
