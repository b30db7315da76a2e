"""Callback state: snapshot every stateful callback at each checkpoint, restore on resume.

``state()`` returns ``{"args": ..., "attributes": ...}`` (Hugging Face's
shape), checked as strict JSON when taken; each state has a unique key, so
several callbacks of one class are told apart; snapshots are written
atomically inside the checkpoint, read back confined and bounded, and
restored with a warning for every difference between saved and live.
"""

from ._files import (
    DEFAULT_MAX_BYTES,
    STATE_FILENAME,
    StatePathError,
    atomic_write,
    read_regular_file,
)
from ._model import (
    MALFORMED,
    STATE_FORMAT_VERSION,
    CallbackState,
    Snapshot,
    StateError,
    StateFormatError,
    StateKeyConflict,
    StateRestoreError,
    callback_name,
    check_state,
    is_stateful,
    state_class_name,
    state_key_of,
)
from ._store import StateStore

__all__ = [
    "DEFAULT_MAX_BYTES",
    "MALFORMED",
    "STATE_FILENAME",
    "STATE_FORMAT_VERSION",
    "CallbackState",
    "Snapshot",
    "StateError",
    "StateFormatError",
    "StateKeyConflict",
    "StatePathError",
    "StateRestoreError",
    "StateStore",
    "atomic_write",
    "callback_name",
    "check_state",
    "is_stateful",
    "read_regular_file",
    "state_class_name",
    "state_key_of",
]
