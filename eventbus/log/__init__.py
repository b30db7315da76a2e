"""The event log: a run's one history (a resumed run appends to it), recorded by a tap of
the bus, read back with what a torn or corrupt file still holds and what was lost, and
replayed into a bus on virtual time or at recorded speed (what resumes rolled back skipped).
"""

from ._costs import Costs
from ._format import LogError
from ._reader import LogReader, read_log
from ._recorder import LogInUse, LogRecorder
from ._replay import ReplaySummary, replay, replay_file

__all__ = [
    "Costs",
    "LogError",
    "LogInUse",
    "LogReader",
    "LogRecorder",
    "ReplaySummary",
    "read_log",
    "replay",
    "replay_file",
]
