"""The event log: record a run's events, read them back (damage and all), replay them.

A log is the run's history: one header, then one record per event in
sequence order (length-prefixed msgpack with a CRC, or JSON lines). The
recorder is a tap of the bus, so it costs one call per batch; the reader
yields what a torn or corrupt file still holds and says what was lost; a
replay feeds a log back into a bus, on virtual time or at recorded speed,
charging callbacks the costs a test gives them (``costs=``).
A resumed run appends to its log, so the log is the run's one history;
what the resumes in it rolled back is told apart (a replay skips it).
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
