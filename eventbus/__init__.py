"""eventbus: the generic runtime that carries training events to callbacks.

Typed msgspec events, an ordered bus with deadlines, budgets and bounded
buffers, clocks (real and virtual) and codecs. It knows nothing about
rank gathering or any training framework: that lives in ``handlers`` and
``adapters``.
"""

from importlib.metadata import PackageNotFoundError, version

from ._bus import BusClosed, BusFull, BusStats, CloseReport, EventBus
from ._clock import Clock, FastForwardClock, MonotonicClock, VirtualClock
from ._codec import EventDecodeError, decode_json, decode_msgpack, encode_json, encode_msgpack
from ._eventfilter import EventFilter
from ._events import (
    SCHEMA_VERSION,
    BudgetReport,
    CheckpointMismatch,
    CheckpointSaved,
    Event,
    EventPlaceholder,
    HandlerFailed,
    HandlerStateChanged,
    HandlerTimedOut,
    HandlerUsage,
    HealthCheckTick,
    Report,
    ReportRejected,
    RunFinished,
    RunStarted,
    StateRestored,
    StateSnapshotted,
    WorkerFailure,
    WorkerGroupRestarted,
    event_types,
)
from ._logformat import (
    LOG_FORMAT_VERSION,
    LOG_MAGIC,
    CorruptLogError,
    LogError,
    LogFormat,
    LogFormatError,
    LogHeader,
    TruncatedTail,
)
from ._logging import configure_logging, get_logger
from ._reader import LogContents, LogReader, read_log
from ._recorder import FsyncPolicy, LogRecorder
from ._replay import (
    BUS_DIAGNOSTICS,
    HandlerSummary,
    LogTiming,
    ReplaySummary,
    log_timing,
    replay,
    replay_file,
)
from ._state import (
    STATE_FORMAT_VERSION,
    CallbackState,
    Snapshot,
    StateError,
    StateFormatError,
    Stateful,
    StatefulCallback,
    StateKeyConflict,
    StateRestoreError,
    is_stateful,
    state_key_of,
)
from ._state_files import STATE_FILENAME, StatePathError, atomic_write
from ._state_hf import (
    from_hf_callbacks,
    read_hf_trainer_state,
    to_hf_callbacks,
    write_hf_trainer_state,
)
from ._state_store import StateStore
from ._subscription import (
    DeliveryMode,
    ErrorPolicy,
    OverBudgetPolicy,
    Subscription,
    SubscriptionStats,
)

try:
    __version__ = version("train-eventbus")
except PackageNotFoundError:  # running from a source tree without installing
    __version__ = "0.0.0"

__all__ = [
    "BUS_DIAGNOSTICS",
    "LOG_FORMAT_VERSION",
    "LOG_MAGIC",
    "SCHEMA_VERSION",
    "STATE_FILENAME",
    "STATE_FORMAT_VERSION",
    "BudgetReport",
    "BusClosed",
    "BusFull",
    "BusStats",
    "CallbackState",
    "CheckpointMismatch",
    "CheckpointSaved",
    "Clock",
    "CloseReport",
    "CorruptLogError",
    "DeliveryMode",
    "ErrorPolicy",
    "Event",
    "EventBus",
    "EventDecodeError",
    "EventFilter",
    "EventPlaceholder",
    "FastForwardClock",
    "FsyncPolicy",
    "HandlerFailed",
    "HandlerStateChanged",
    "HandlerSummary",
    "HandlerTimedOut",
    "HandlerUsage",
    "HealthCheckTick",
    "LogContents",
    "LogError",
    "LogFormat",
    "LogFormatError",
    "LogHeader",
    "LogReader",
    "LogRecorder",
    "LogTiming",
    "MonotonicClock",
    "OverBudgetPolicy",
    "ReplaySummary",
    "Report",
    "ReportRejected",
    "RunFinished",
    "RunStarted",
    "Snapshot",
    "StateError",
    "StateFormatError",
    "StateKeyConflict",
    "StatePathError",
    "StateRestoreError",
    "StateRestored",
    "StateSnapshotted",
    "StateStore",
    "Stateful",
    "StatefulCallback",
    "Subscription",
    "SubscriptionStats",
    "TruncatedTail",
    "VirtualClock",
    "WorkerFailure",
    "WorkerGroupRestarted",
    "__version__",
    "atomic_write",
    "configure_logging",
    "decode_json",
    "decode_msgpack",
    "encode_json",
    "encode_msgpack",
    "event_types",
    "from_hf_callbacks",
    "get_logger",
    "is_stateful",
    "log_timing",
    "read_hf_trainer_state",
    "read_log",
    "replay",
    "replay_file",
    "state_key_of",
    "to_hf_callbacks",
    "write_hf_trainer_state",
]
