"""Testing helpers: build small logs, replay them against handlers, record a bus.

Shipped in the library, as ``structlog.testing`` and ``trio.testing`` are,
so users test their callbacks against a recorded run in a few lines. The
pytest plugin (``eventbus.testing._plugin``, registered through the
``pytest11`` entry point) wraps these helpers as fixtures:
``event_log_factory``, ``replay_log`` and ``recorded_bus``.
"""

from ._helpers import (
    BusRecording,
    ReplayResult,
    assert_rounds,
    attach,
    replay_log,
    report_rounds,
    write_log,
)

__all__ = [
    "BusRecording",
    "ReplayResult",
    "assert_rounds",
    "attach",
    "replay_log",
    "report_rounds",
    "write_log",
]
