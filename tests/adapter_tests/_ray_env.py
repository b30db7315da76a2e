"""Ray's settings for the adapter tests: quiet, offline, fast polling (docs/adapters.md).

They must be set before ray is imported, and the first test module to import
ray sets them for the whole session (its local cluster inherits them), so
every Ray test module sets the same ones, from here.
"""

from __future__ import annotations

import os

QUIET_RAY = {
    "RAY_USAGE_STATS_ENABLED": "0",
    "RAY_AUTH_MODE": "disabled",
    "RAY_TRAIN_V2_ENABLED": "1",
    "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": "0.2",
    "RAY_TRAIN_ENABLE_PREEMPTION_WATCHER": "0",
    "RAY_TRAIN_METRICS_ENABLED": "0",
}


def quiet_ray() -> None:
    """Set ``QUIET_RAY`` where the environment does not say otherwise."""
    for name, value in QUIET_RAY.items():
        os.environ.setdefault(name, value)
