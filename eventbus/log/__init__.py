"""The event log: record a run's events, read them back (damage and all), replay them.

A log is the run's history: one header, then one record per event in
sequence order (length-prefixed msgpack with a CRC, or JSON lines). The
recorder is a tap of the bus, so it costs one call per batch; the reader
yields what a torn or corrupt file still holds and says what was lost; a
replay feeds a log back into a bus, on virtual time or at recorded speed,
charging callbacks the costs a test gives them (``costs=``).
A resumed run appends to its log, so the log is the run's one history;
``rollbacks`` marks what the resumes in it rolled back (a replay skips it).
"""

from ._costs import Costs
from ._format import (
    LOG_FORMAT_VERSION,
    LOG_MAGIC,
    CorruptLogError,
    LogError,
    LogFormat,
    LogFormatError,
    LogHeader,
    TruncatedTail,
)
from ._history import LogTail, Rollbacks, rollbacks
from ._reader import LogContents, LogReader, LogStreamError, read_log
from ._recorder import FsyncPolicy, LogInUse, LogRecorder, RunIdMismatch
from ._replay import (
    BUS_DIAGNOSTICS,
    HandlerSummary,
    LogTiming,
    ReplaySummary,
    Speed,
    log_timing,
    replay,
    replay_file,
)

__all__ = [
    "BUS_DIAGNOSTICS",
    "LOG_FORMAT_VERSION",
    "LOG_MAGIC",
    "CorruptLogError",
    "Costs",
    "FsyncPolicy",
    "HandlerSummary",
    "LogContents",
    "LogError",
    "LogFormat",
    "LogFormatError",
    "LogHeader",
    "LogInUse",
    "LogReader",
    "LogRecorder",
    "LogStreamError",
    "LogTail",
    "LogTiming",
    "ReplaySummary",
    "Rollbacks",
    "RunIdMismatch",
    "Speed",
    "TruncatedTail",
    "log_timing",
    "read_log",
    "replay",
    "replay_file",
    "rollbacks",
]
