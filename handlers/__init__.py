"""handlers: training semantics on top of the event bus: training callbacks, the handlers
that gather reports into rounds and failures into periods for their hooks, runs
(``open_run``), built-in callbacks. What callbacks are told (``TrainRunContext``,
``RoundGathered``, ``RunResult``) and ``StatefulCallback`` are ``eventbus``'s."""

from ._attach import attach_user_callbacks
from ._callback import UserCallback
from ._errors import RankStalledError, ReportError, WorkerError, WorkerGroupError
from ._options import RunOptions
from ._reporter import Reporter
from ._resume import latest_checkpoint
from ._run import Run, WorkerFn, open_run
from ._signals import Preempted
from .builtins._best_checkpoints import BestCheckpoints
from .builtins._early_stopping import EarlyStopping
from .builtins._metrics_logger import MetricsLogger
from .builtins._progress import ProgressDisplay

__all__ = [
    "BestCheckpoints",
    "EarlyStopping",
    "MetricsLogger",
    "Preempted",
    "ProgressDisplay",
    "RankStalledError",
    "ReportError",
    "Reporter",
    "Run",
    "RunOptions",
    "UserCallback",
    "WorkerError",
    "WorkerFn",
    "WorkerGroupError",
    "attach_user_callbacks",
    "latest_checkpoint",
    "open_run",
]
