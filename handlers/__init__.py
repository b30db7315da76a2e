"""handlers: training semantics on top of the event bus.

Training callbacks (``UserCallback``: ``before_run``, ``after_report``,
``after_exception``, ``after_run``); the handlers that gather per-rank
reports into rounds, worker failures into health-check periods and the run's
start and end, each emitting its gathered event with the run's context, to
which every training callback's hooks subscribe; the run composition API
(``open_run``); built-in callbacks. What callbacks are told (``TrainRunContext``,
``RoundGathered``, ``RunResult``) and ``StatefulCallback`` are ``eventbus``'s.
Wiring by hand is in ``handlers.wiring``.
"""

from ._callback import UserCallback
from ._engine import WorkerEngine
from ._errors import RankStalledError, ReportError, WorkerError, WorkerGroupError
from ._failures import ExceptionCallbackHandler
from ._lifecycle import RunCallbackHandler
from ._metric_values import FrozenDict, FrozenList
from ._open_run import TrainingCallback, open_run
from ._reporter import Reporter
from ._reports import ReportCallbackHandler
from ._resume import latest_checkpoint
from ._run import Run, WorkerFn
from ._signals import Preempted
from .builtins._best_checkpoints import BestCheckpoints
from .builtins._early_stopping import EarlyStopping
from .builtins._metrics_logger import MetricsLogger
from .builtins._progress import ProgressDisplay
from .options import RunOptions

__all__ = [
    "BestCheckpoints",
    "EarlyStopping",
    "ExceptionCallbackHandler",
    "FrozenDict",
    "FrozenList",
    "MetricsLogger",
    "Preempted",
    "ProgressDisplay",
    "RankStalledError",
    "ReportCallbackHandler",
    "ReportError",
    "Reporter",
    "Run",
    "RunCallbackHandler",
    "RunOptions",
    "TrainingCallback",
    "UserCallback",
    "WorkerEngine",
    "WorkerError",
    "WorkerFn",
    "WorkerGroupError",
    "latest_checkpoint",
    "open_run",
]
