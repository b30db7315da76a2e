"""The eventbus pytest plugin (entry point ``pytest11``): ``eventbus.testing``'s helpers as
plain (not async) fixtures, so they work with any async test runner."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import pytest

from .._events import Event
from ._helpers import BusRecording, write_log
from ._helpers import replay_log as _replay_log

__all__ = ["event_log_factory", "recorded_bus", "replay_log"]


@pytest.fixture
def event_log_factory(tmp_path: Path) -> Callable[..., Path]:
    """Build a log file from events in ``tmp_path`` (see ``eventbus.testing.write_log``)."""

    def make(events: Iterable[Event], name: str = "events.evlog", **options: Any) -> Path:
        return write_log(tmp_path / name, events, **options)

    return make


@pytest.fixture
def replay_log() -> Callable[..., Any]:
    """``await replay_log(path, *handlers, **options)`` (see ``eventbus.testing.replay_log``)."""
    return _replay_log


@pytest.fixture
def recorded_bus(tmp_path: Path) -> BusRecording:
    """Run a bus whose events are recorded to ``tmp_path / "recorded.evlog"``."""
    return BusRecording(tmp_path / "recorded.evlog")
