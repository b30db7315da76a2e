"""handlers: training semantics on top of the event bus.

User callbacks (``UserCallback``: ``before_run``, ``after_report``,
``after_exception``, ``after_run``), the handlers that gather per-rank
reports into rounds and worker failures into health-check periods, the run
composition API (``open_run``) and built-in callbacks.

Importing this package registers the events it derives (``RoundGathered``
and friends) in the event union, so logs that hold them decode.
"""

from ._attach import CallbackAttachment, attach_user_callbacks
from ._best_checkpoints import BestCheckpoints
from ._context import RunResult, RunStatus, TrainRunContext
from ._early_stopping import EarlyStopping
from ._errors import WorkerError, WorkerGroupError
from ._events import FailuresGathered, RoundGathered, RunBegan, RunEnded
from ._failures import ExceptionCallbackHandler
from ._interfaces import ExceptionCallback, ReportCallback, RunCallback, UserCallback
from ._lifecycle import RunCallbackHandler
from ._metrics_logger import MetricsLogger
from ._progress import ProgressDisplay
from ._reporter import Reporter
from ._reports import ReportCallbackHandler
from ._run import Run, WorkerFn, open_run
from ._user import UserCallbackHandler, implemented_hooks

__all__ = [
    "BestCheckpoints",
    "CallbackAttachment",
    "EarlyStopping",
    "ExceptionCallback",
    "ExceptionCallbackHandler",
    "FailuresGathered",
    "MetricsLogger",
    "ProgressDisplay",
    "ReportCallback",
    "ReportCallbackHandler",
    "Reporter",
    "RoundGathered",
    "Run",
    "RunBegan",
    "RunCallback",
    "RunCallbackHandler",
    "RunEnded",
    "RunResult",
    "RunStatus",
    "TrainRunContext",
    "UserCallback",
    "UserCallbackHandler",
    "WorkerError",
    "WorkerFn",
    "WorkerGroupError",
    "attach_user_callbacks",
    "implemented_hooks",
    "open_run",
]
