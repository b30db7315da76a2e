"""handlers: training semantics on top of the event bus.

Training callbacks (``UserCallback``: ``before_run``, ``after_report``,
``after_exception``, ``after_run``); the handlers that gather per-rank
reports into rounds, worker failures into health-check periods and the run's
start and end (Ray Train's shape: ``XxxCallbackHandler`` over a list of
``XxxCallback``; on a bus each also emits its gathered event, with the run's
context, to which every training callback's hooks subscribe); the run
composition API (``open_run``); built-in callbacks (``handlers.builtins``).
``StatefulCallback`` (from ``eventbus``) is here too, so one callback needs
one import.
Wiring by hand is in ``handlers.wiring``.
"""

from eventbus import StatefulCallback
from eventbus.events import (
    FailuresGathered,
    RoundGathered,
    RunBegan,
    RunEnded,
    RunResult,
    RunStatus,
    TrainRunContext,
)

from ._callback import UserCallback
from ._errors import ReportError, WorkerError, WorkerGroupError
from ._failures import ExceptionCallbackHandler
from ._interfaces import ExceptionCallback, ReportCallback, RunCallback
from ._lifecycle import RunCallbackHandler
from ._open_run import TrainingCallback, open_run
from ._reporter import Reporter
from ._reports import ReportCallbackHandler
from ._resume import latest_checkpoint
from ._run import Run, WorkerFn
from .builtins import BestCheckpoints, EarlyStopping, MetricsLogger, ProgressDisplay
from .options import RunOptions

__all__ = [
    "BestCheckpoints",
    "EarlyStopping",
    "ExceptionCallback",
    "ExceptionCallbackHandler",
    "FailuresGathered",
    "MetricsLogger",
    "ProgressDisplay",
    "ReportCallback",
    "ReportCallbackHandler",
    "ReportError",
    "Reporter",
    "RoundGathered",
    "Run",
    "RunBegan",
    "RunCallback",
    "RunCallbackHandler",
    "RunEnded",
    "RunOptions",
    "RunResult",
    "RunStatus",
    "StatefulCallback",
    "TrainRunContext",
    "TrainingCallback",
    "UserCallback",
    "WorkerError",
    "WorkerFn",
    "WorkerGroupError",
    "latest_checkpoint",
    "open_run",
]
