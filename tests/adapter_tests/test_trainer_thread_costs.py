"""What the training thread pays per hook of our HF adapter, counted (never timed).

The cause of issue 24: a bus thread of its own took the GIL from the trainer
(the training thread blocked four times a step). The default now steps the
bus in the trainer's hooks, so per hook the training thread must not wake
another thread, acquire a lock or block in a wait; it steps the bus at most
once per poll interval (a fake clock drives that here). A bus thread (trio;
``bus_runs="in_thread"``) keeps the trainer's side to a deque append: no lock,
no wake-up. A change that brings the contention back fails here.
"""

from __future__ import annotations

import os
import selectors
import sys
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from types import FrameType
from typing import Any

import pytest

for _name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_HUB_DISABLE_TELEMETRY"):
    os.environ.setdefault(_name, "1")
transformers = pytest.importorskip("transformers")

from transformers.trainer_callback import (  # noqa: E402
    CallbackHandler,
    TrainerControl,
    TrainerState,
)

import adapters._stepped_bus as stepped_bus  # noqa: E402
from adapters._bus_thread import BusThread  # noqa: E402
from adapters._stepped_bus import SteppedBus  # noqa: E402
from adapters.transformers import EventBusCallback  # noqa: E402
from eventbus.state._files import STATE_FILENAME  # noqa: E402
from handlers import BestCheckpoints  # noqa: E402

HOOKS = ("on_step_begin", "on_step_end", "on_log", "on_save")
#: What a wait or a wake-up of another thread goes through in CPython.
LOCKING_C_CALLS = {"acquire", "acquire_lock", "release", "release_lock", "wait"}
WAKING_CALLS = {"call_soon_threadsafe", "run_sync_soon", "_write_to_self"}
#: The hook being profiled in the training thread ("" between hooks).
IN_HOOK = [""]


class HookCosts:
    """Profiles our callback's hooks (only them) in the training thread and counts,
    by hook: ``counts[hook]`` is a ``Counter`` of what it paid."""

    def __init__(self) -> None:
        self.counts: dict[str, Counter[str]] = {}
        self.hooks: Counter[str] = Counter()
        self._hook = ""

    def _profile(self, frame: FrameType, event: str, arg: Any) -> None:
        counts = self.counts.setdefault(self._hook, Counter())
        if event == "c_call":
            if getattr(arg, "__name__", "") in LOCKING_C_CALLS:
                counts[f"lock: {arg.__qualname__}"] += 1
        elif event == "call":
            code = frame.f_code
            if code.co_filename == threading.__file__:
                counts[f"threading: {code.co_name}"] += 1
            if code.co_name in WAKING_CALLS:
                counts[f"wake-up: {code.co_name}"] += 1

    def wrap(self, callback: EventBusCallback) -> None:
        for name in HOOKS:
            hook = getattr(callback, name)

            def counted(
                *args: Any, _hook: Callable[..., Any] = hook, _name: str = name, **kwargs: Any
            ) -> Any:
                self.hooks[_name] += 1
                self._hook = IN_HOOK[0] = _name
                sys.setprofile(self._profile)
                try:
                    return _hook(*args, **kwargs)
                finally:
                    sys.setprofile(None)
                    IN_HOOK[0] = ""

            setattr(callback, name, counted)


@pytest.fixture
def blocking_selects(monkeypatch: pytest.MonkeyPatch) -> Iterator[Counter[str]]:
    """Counts the event loop's selects that may block (a timeout other than 0) in a hook."""
    counts: Counter[str] = Counter()
    select = selectors.EpollSelector.select

    def counted(self: selectors.EpollSelector, timeout: float | None = None) -> Any:
        if IN_HOOK[0] and (timeout is None or timeout > 0):
            counts[IN_HOOK[0]] += 1
        return select(self, timeout)

    monkeypatch.setattr(selectors.EpollSelector, "select", counted)
    yield counts


class FakeClock:
    """The stepped bus's clock: 10 ms per training step."""

    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now


def train(callback: EventBusCallback, output: Path, clock: FakeClock, steps: int) -> HookCosts:
    """``steps`` steps of HF's hook sequence, a log every step and a save every 50."""
    args = transformers.TrainingArguments(output_dir=str(output), report_to="none")
    state, control = TrainerState(max_steps=steps), TrainerControl()
    handler = CallbackHandler([callback], None, None, None, None)
    handler.on_train_begin(args, state, control)
    costs = HookCosts()
    costs.wrap(callback)
    for step in range(1, steps + 1):
        clock.now += 0.010
        state.global_step = step
        handler.on_step_begin(args, state, control)
        handler.on_step_end(args, state, control)
        handler.on_log(args, state, control, {"loss": 1.0 / step, "learning_rate": 1e-3})
        if step % 50 == 0:
            Path(output, f"checkpoint-{step}").mkdir()
            handler.on_save(args, state, control)
    handler.on_train_end(args, state, control)
    return costs


def test_stepped_in_the_hooks_the_trainer_wakes_no_thread_takes_no_lock_never_blocks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, blocking_selects: Counter[str]
) -> None:
    clock = FakeClock()
    monkeypatch.setattr(stepped_bus, "time", clock)
    # No stopper: a callback that can stop the run (``EarlyStopping``) makes ``on_log``
    # wait for its decision, so the trainer stops at the step it was decided at
    # (tests/adapter_tests/test_stops_with_trackers.py).
    callbacks = [BestCheckpoints("loss", k=3)]
    callback = EventBusCallback(callbacks, log=True, poll_interval=0.05)
    threads = threading.active_count()
    steps = 300
    costs = train(callback, tmp_path, clock, steps)
    host = callback.bus_thread
    assert isinstance(host, SteppedBus)
    saves = steps // 50
    assert costs.hooks == {
        "on_step_begin": steps,
        "on_step_end": steps,
        "on_log": steps,
        "on_save": saves,
    }
    # No lock, no wait, no wake-up of another thread, in any hook (a save included).
    assert all(not counts for counts in costs.counts.values()), costs.counts
    assert blocking_selects == {}  # the loop never blocked in a hook
    assert threading.active_count() == threads
    # A step every 5 training steps (50 ms of 10 ms steps), one per save, start and end.
    assert host.wakeups <= steps // 5 + steps // 50 + 3, host.wakeups
    assert callback.dropped == 0
    for step in range(50, steps + 1, 50):  # each save's snapshot, written in its hook
        assert Path(tmp_path, f"checkpoint-{step}", STATE_FILENAME).is_file()


def test_with_a_bus_thread_a_hook_is_a_deque_append_no_lock_no_wake_up(tmp_path: Path) -> None:
    """trio (or ``bus_runs="in_thread"``): the hot hooks take no lock and wake nothing;
    only a checkpoint's hand-off may (it is rare, and waits for room when full)."""
    pytest.importorskip("trio")
    callbacks = [BestCheckpoints("loss", k=3)]  # no stopper: see the test above
    callback = EventBusCallback(callbacks, state=False, backend="trio", poll_interval=0.05)
    costs = HookCosts()
    args = transformers.TrainingArguments(output_dir=str(tmp_path), report_to="none")
    state, control = TrainerState(max_steps=300), TrainerControl()
    handler = CallbackHandler([callback], None, None, None, None)
    handler.on_train_begin(args, state, control)
    assert isinstance(callback.bus_thread, BusThread)
    costs.wrap(callback)
    for step in range(1, 301):
        state.global_step = step
        handler.on_step_begin(args, state, control)
        handler.on_step_end(args, state, control)
        handler.on_log(args, state, control, {"loss": 1.0 / step})
    assert costs.hooks == {"on_step_begin": 300, "on_step_end": 300, "on_log": 300}
    assert all(not counts for counts in costs.counts.values()), costs.counts
    handler.on_train_end(args, state, control)
    assert callback.bus_thread.handed_off == 302
