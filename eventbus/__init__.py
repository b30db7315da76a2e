"""eventbus: the generic runtime that carries training events to callbacks.

Typed msgspec events, an ordered bus with deadlines, budgets and bounded
buffers, clocks (real and virtual) and codecs. It knows nothing about
rank gathering or any training framework: that lives in ``handlers`` and
``adapters``.
"""

from importlib.metadata import PackageNotFoundError, version

from ._bus import BusClosed, BusFull, BusStats, CloseReport, EventBus
from ._clock import Clock, MonotonicClock, VirtualClock
from ._codec import EventDecodeError, decode_json, decode_msgpack, encode_json, encode_msgpack
from ._events import (
    SCHEMA_VERSION,
    BudgetReport,
    CheckpointMismatch,
    CheckpointSaved,
    Event,
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
from ._logging import configure_logging, get_logger
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
    "SCHEMA_VERSION",
    "BudgetReport",
    "BusClosed",
    "BusFull",
    "BusStats",
    "CheckpointMismatch",
    "CheckpointSaved",
    "Clock",
    "CloseReport",
    "DeliveryMode",
    "ErrorPolicy",
    "Event",
    "EventBus",
    "EventDecodeError",
    "HandlerFailed",
    "HandlerStateChanged",
    "HandlerTimedOut",
    "HandlerUsage",
    "HealthCheckTick",
    "MonotonicClock",
    "OverBudgetPolicy",
    "Report",
    "ReportRejected",
    "RunFinished",
    "RunStarted",
    "StateRestored",
    "StateSnapshotted",
    "Subscription",
    "SubscriptionStats",
    "VirtualClock",
    "WorkerFailure",
    "WorkerGroupRestarted",
    "__version__",
    "configure_logging",
    "decode_json",
    "decode_msgpack",
    "encode_json",
    "encode_msgpack",
    "event_types",
    "get_logger",
]
