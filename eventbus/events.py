"""Every event type, and how events are encoded and decoded.

One tagged union of frozen msgspec structs: the bus's own diagnostics, what
workers report, and what the gathering derives for training callbacks
(``RoundGathered`` and friends, with the run's context and result). Defined
in one module, so a log decodes without importing anything else.
"""

from ._codec import EventDecodeError, decode_json, decode_msgpack, encode_json, encode_msgpack
from ._events import (
    SCHEMA_VERSION,
    BudgetReport,
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
    Report,
    ReportRejected,
    RoundGathered,
    RunBegan,
    RunEnded,
    RunFinished,
    RunResult,
    RunStarted,
    RunStatus,
    StateRestored,
    StateSnapshotted,
    TrainRunContext,
    WorkerFailure,
    WorkerGroupRestarted,
    event_types,
)

__all__ = [
    "SCHEMA_VERSION",
    "BudgetReport",
    "CheckpointMismatch",
    "CheckpointSaved",
    "Event",
    "EventDecodeError",
    "EventPlaceholder",
    "FailuresGathered",
    "HandlerFailed",
    "HandlerStateChanged",
    "HandlerTimedOut",
    "HandlerUsage",
    "HealthCheckTick",
    "Report",
    "ReportRejected",
    "RoundGathered",
    "RunBegan",
    "RunEnded",
    "RunFinished",
    "RunResult",
    "RunStarted",
    "RunStatus",
    "StateRestored",
    "StateSnapshotted",
    "TrainRunContext",
    "WorkerFailure",
    "WorkerGroupRestarted",
    "decode_json",
    "decode_msgpack",
    "encode_json",
    "encode_msgpack",
    "event_types",
]
