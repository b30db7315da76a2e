"""The built-in training callbacks' modules; import the callbacks from ``handlers``."""

from .._moved import moved_names

__all__: list[str] = []

__getattr__ = moved_names(
    __name__,
    {
        name: f"handlers.{name}"
        for name in ("BestCheckpoints", "EarlyStopping", "MetricsLogger", "ProgressDisplay")
    },
)
