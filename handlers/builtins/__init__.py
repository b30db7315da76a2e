"""Built-in training callbacks: ready-made ``UserCallback``s, stateful where it matters."""

from ._best_checkpoints import BestCheckpoints
from ._early_stopping import EarlyStopping
from ._metrics_logger import MetricsLogger
from ._progress import ProgressDisplay

__all__ = ["BestCheckpoints", "EarlyStopping", "MetricsLogger", "ProgressDisplay"]
