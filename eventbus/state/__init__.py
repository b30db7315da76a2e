"""Callback state: each stateful callback's ``{"args": ..., "attributes": ...}`` (Hugging
Face's shape), checked as strict JSON, snapshotted atomically at each checkpoint, read back
confined and bounded, and restored with a warning for every difference.
"""

from ._model import StateError, StateRestoreError
from ._store import StateStore

__all__ = [
    "StateError",
    "StateRestoreError",
    "StateStore",
]
