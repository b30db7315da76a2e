"""handlers: training semantics on top of the event bus.

Training callbacks (``UserCallback``: ``before_run``, ``after_report``,
``after_exception``, ``after_run``); the handlers that gather per-rank
reports into rounds, worker failures into health-check periods and the run's
start and end, each emitting its gathered event with the run's context, to
which every training callback's hooks subscribe; the run composition API
(``open_run``); built-in callbacks. What callbacks are told (``TrainRunContext``,
``RoundGathered``, ``RunResult``) and ``StatefulCallback`` are ``eventbus``'s.
``attach_user_callbacks`` wires training callbacks onto a bus by hand, for a
replay or a trainer of your own.
"""

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
