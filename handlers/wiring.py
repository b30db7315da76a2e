"""Wiring training callbacks onto a bus by hand, for what ``open_run`` does not cover.

``open_run`` wires everything for a live run; adapters (a framework's own
loop), replays of a log and benchmarks use these pieces directly, and report
a run's end the way ``open_run`` does (``status_of``).
"""

from ._attach import CallbackAttachment, attach_user_callbacks
from ._core import RunCore
from ._ending import log_run_end, status_of, stop_of
from ._metric_values import MetricsError, freeze_metrics
from ._metrics import mean_metrics
from ._persist import persist_checkpoint
from ._reporter import stopping_lanes
from ._resume import Resume, appends_to_log
from ._signals import takes_signals
from ._user import UserCallbackHandler, implemented_hooks, training_callbacks

__all__ = [
    "CallbackAttachment",
    "MetricsError",
    "Resume",
    "RunCore",
    "UserCallbackHandler",
    "appends_to_log",
    "attach_user_callbacks",
    "freeze_metrics",
    "implemented_hooks",
    "log_run_end",
    "mean_metrics",
    "persist_checkpoint",
    "status_of",
    "stop_of",
    "stopping_lanes",
    "takes_signals",
    "training_callbacks",
]
