"""eventbus: the runtime that carries a training run's events to its callbacks.

What it is: the event vocabulary of a training run (what workers report,
what the bus says about its handlers, what the gathering derives for
callbacks), an ordered bus with deadlines, budgets per
health-check period and bounded buffers (``EventBus``), clocks, the event log
(``eventbus.log``), the callback-state store (``eventbus.state``) and test
helpers (``eventbus.testing``). What it is not: it does not gather ranks into
rounds or call training callbacks (``handlers`` does, on top of it), and it
knows no training framework (``adapters`` does).
"""

from importlib.metadata import PackageNotFoundError, version

from ._bus import BusClosed, BusFull, BusStats, CloseReport, EventBus
from ._clock import Clock, FastForwardClock, MonotonicClock, VirtualClock
from ._codec import EventDecodeError, decode_json, decode_msgpack, encode_json, encode_msgpack
from ._eventfilter import EventFilter
from ._events import (
    SCHEMA_VERSION,
    AfterRun,
    BeforeRun,
    BudgetReport,
    CallbackCost,
    CheckpointMismatch,
    CheckpointSaved,
    Event,
    EventPlaceholder,
    FailuresGathered,
    HandlerFailed,
    HandlerStateChanged,
    HandlerTimedOut,
    HandlerUsage,
    HealthCheckTick,
    RankRecovered,
    RankStalled,
    Report,
    ReportRejected,
    RoundGathered,
    RunFinished,
    RunPosition,
    RunResult,
    RunResumed,
    RunStarted,
    RunStatus,
    StateRestored,
    StateSnapshotted,
    TrainRunContext,
    WorkerFailure,
    WorkerGroupRestarted,
    event_types,
    is_derived,
)
from ._logging import configure_logging, get_logger
from ._observers import HandlerCall
from ._stages import Stage
from ._subscription import (
    DeliveryMode,
    ErrorPolicy,
    OverBudgetPolicy,
    Subscription,
    SubscriptionStats,
)
from ._text import describe as describe_exception
from .options import BusOptions
from .state._model import Stateful, StatefulCallback

try:
    __version__ = version("train-eventbus")
except PackageNotFoundError:  # running from a source tree without installing
    __version__ = "0.0.0"

__all__ = [
    "SCHEMA_VERSION",
    "AfterRun",
    "BeforeRun",
    "BudgetReport",
    "BusClosed",
    "BusFull",
    "BusOptions",
    "BusStats",
    "CallbackCost",
    "CheckpointMismatch",
    "CheckpointSaved",
    "Clock",
    "CloseReport",
    "DeliveryMode",
    "ErrorPolicy",
    "Event",
    "EventBus",
    "EventDecodeError",
    "EventFilter",
    "EventPlaceholder",
    "FailuresGathered",
    "FastForwardClock",
    "HandlerCall",
    "HandlerFailed",
    "HandlerStateChanged",
    "HandlerTimedOut",
    "HandlerUsage",
    "HealthCheckTick",
    "MonotonicClock",
    "OverBudgetPolicy",
    "RankRecovered",
    "RankStalled",
    "Report",
    "ReportRejected",
    "RoundGathered",
    "RunFinished",
    "RunPosition",
    "RunResult",
    "RunResumed",
    "RunStarted",
    "RunStatus",
    "Stage",
    "StateRestored",
    "StateSnapshotted",
    "Stateful",
    "StatefulCallback",
    "Subscription",
    "SubscriptionStats",
    "TrainRunContext",
    "VirtualClock",
    "WorkerFailure",
    "WorkerGroupRestarted",
    "__version__",
    "configure_logging",
    "decode_json",
    "decode_msgpack",
    "describe_exception",
    "encode_json",
    "encode_msgpack",
    "event_types",
    "get_logger",
    "is_derived",
]
