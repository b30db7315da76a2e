"""Callback state: snapshot every stateful callback at each checkpoint, restore on resume.

``state()`` returns ``{"args": ..., "attributes": ...}`` (Hugging Face's
shape), checked as strict JSON when taken; each state has a unique key, so
several callbacks of one class are told apart; snapshots are written
atomically inside the checkpoint, read back confined and bounded, and
restored with a warning for every difference between saved and live.
"""

from ._model import StateError, StateRestoreError
from ._store import StateStore

__all__ = [
    "StateError",
    "StateRestoreError",
    "StateStore",
]
