"""Deprecated: every event type and codec is exported by ``eventbus`` itself.

Until 0.2 this module was the home of the event types; they keep working
from here, each access warning with the name to import instead.
"""

from ._deprecated import moved_names

__all__: list[str] = []

__getattr__ = moved_names(
    __name__,
    {
        "SCHEMA_VERSION": "eventbus.SCHEMA_VERSION",
        "AfterRun": "eventbus.AfterRun",
        "BeforeRun": "eventbus.BeforeRun",
        "BudgetReport": "eventbus.BudgetReport",
        "CheckpointMismatch": "eventbus.CheckpointMismatch",
        "CheckpointSaved": "eventbus.CheckpointSaved",
        "Event": "eventbus.Event",
        "EventDecodeError": "eventbus.EventDecodeError",
        "EventPlaceholder": "eventbus.EventPlaceholder",
        "FailuresGathered": "eventbus.FailuresGathered",
        "HandlerFailed": "eventbus.HandlerFailed",
        "HandlerStateChanged": "eventbus.HandlerStateChanged",
        "HandlerTimedOut": "eventbus.HandlerTimedOut",
        "HandlerUsage": "eventbus.HandlerUsage",
        "HealthCheckTick": "eventbus.HealthCheckTick",
        "Report": "eventbus.Report",
        "ReportRejected": "eventbus.ReportRejected",
        "RoundGathered": "eventbus.RoundGathered",
        "RunFinished": "eventbus.RunFinished",
        "RunPosition": "eventbus.RunPosition",
        "RunResult": "eventbus.RunResult",
        "RunResumed": "eventbus.RunResumed",
        "RunStarted": "eventbus.RunStarted",
        "RunStatus": "eventbus.RunStatus",
        "StateRestored": "eventbus.StateRestored",
        "StateSnapshotted": "eventbus.StateSnapshotted",
        "TrainRunContext": "eventbus.TrainRunContext",
        "WorkerFailure": "eventbus.WorkerFailure",
        "WorkerGroupRestarted": "eventbus.WorkerGroupRestarted",
        "decode_json": "eventbus.decode_json",
        "decode_msgpack": "eventbus.decode_msgpack",
        "encode_json": "eventbus.encode_json",
        "encode_msgpack": "eventbus.encode_msgpack",
        "event_types": "eventbus.event_types",
        "is_derived": "eventbus.is_derived",
        "RunBegan": "eventbus.BeforeRun",
        "RunEnded": "eventbus.AfterRun",
    },
)
