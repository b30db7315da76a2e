"""Testing helpers: build small logs, replay them against handlers, record a bus; the pytest
plugin (entry point ``pytest11``) gives them as fixtures: ``event_log_factory``,
``replay_log`` and ``recorded_bus``.
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
