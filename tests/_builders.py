"""What several tests build or take apart: deeply nested dicts, a log's records, reports,
a stateful callback that restores itself, the command line and the examples run as a user
runs them."""

from __future__ import annotations

import struct
import subprocess
import sys
from pathlib import Path
from typing import Any, TypeVar

import msgspec

from eventbus import Event, Report
from eventbus.state._model import CallbackState

__all__ = [
    "EXAMPLES",
    "Custom",
    "EventCapture",
    "eventbus",
    "nested_dict",
    "ranked_report",
    "record_spans",
    "run_example",
    "sample_event",
]

E = TypeVar("E", bound=Event)

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def nested_dict(depth: int) -> dict[str, Any]:
    """``{"a": {"a": ...}}``, ``depth`` dicts below the top one (built without recursion)."""
    root: dict[str, Any] = {}
    node = root
    for _ in range(depth):
        node["a"] = {}
        node = node["a"]
    return root


def record_spans(data: bytes) -> list[tuple[int, int]]:
    """(start, end) of each record of a format-version-2 msgpack log's bytes."""
    pos = 16 + struct.unpack_from("<I", data, 12)[0]
    spans = []
    while pos < len(data):
        end = pos + 12 + struct.unpack_from("<I", data, pos + 4)[0]
        spans.append((pos, end))
        pos = end
    return spans


def ranked_report(rank: Any, index: Any, world_size: int = 3, **fields: Any) -> Report:
    """A report of run ``r`` whose metrics say who sent it: ``{"rank": rank, "i": index}``."""
    given: dict[str, Any] = {"metrics": {"rank": rank, "i": index}, "run_id": "r", **fields}
    return Report(rank=rank, world_size=world_size, index=index, **given)


class Custom:
    """Overrides restore with its own ``from_state``."""

    def __init__(self) -> None:
        self.value = 0
        self.via = "init"

    def state(self) -> CallbackState:
        return {"args": {}, "attributes": {"value": self.value}}

    @classmethod
    def from_state(cls, state: CallbackState) -> Custom:
        instance = cls()
        instance.value = state["attributes"]["value"] * 10
        instance.via = "from_state"
        return instance


def eventbus(
    *args: str | Path, cwd: Path | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """The real ``eventbus`` command line in a subprocess, its output captured."""
    return subprocess.run(
        [sys.executable, "-m", "adapters.cli", *map(str, args)],
        capture_output=True,
        text=True,
        cwd=cwd,
        check=False,
        timeout=timeout,
    )


def run_example(
    name: str,
    timeout: float,
    *args: str,
    cwd: Path | None = None,
    env: dict[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    """``python examples/NAME ARGS`` in a subprocess, its output captured."""
    return subprocess.run(
        [sys.executable, str(EXAMPLES / name), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        cwd=cwd,
        env=env,
    )


def _sample_value(info: msgspec.inspect.Type, name: str) -> Any:
    """A plain valid value of a field's type: the smallest that validates."""
    if isinstance(info, msgspec.inspect.StrType):
        return name
    if isinstance(info, msgspec.inspect.BoolType):
        return False
    if isinstance(info, msgspec.inspect.IntType):
        return 0
    if isinstance(info, msgspec.inspect.FloatType):
        return 0.0
    if isinstance(info, msgspec.inspect.LiteralType):
        return info.values[0]
    if isinstance(info, msgspec.inspect.UnionType):
        if info.includes_none:
            return None
        return _sample_value(info.types[0], name)
    if isinstance(info, msgspec.inspect.DictType):
        return {}
    if isinstance(info, msgspec.inspect.ListType):
        return []
    if isinstance(info, msgspec.inspect.VarTupleType):
        return ()
    if isinstance(info, msgspec.inspect.SetType | msgspec.inspect.FrozenSetType):
        return set() if isinstance(info, msgspec.inspect.SetType) else frozenset()
    if isinstance(info, msgspec.inspect.TupleType):
        return tuple(_sample_value(item, name) for item in info.item_types)
    if isinstance(info, msgspec.inspect.StructType):
        return info.cls(**_required_fields(info))
    if isinstance(info, msgspec.inspect.AnyType):
        return None
    raise TypeError(f"sample_event cannot fill field {name!r} of type {info!r}; pass it")


def _required_fields(info: msgspec.inspect.StructType) -> dict[str, Any]:
    return {f.name: _sample_value(f.type, f.name) for f in info.fields if f.required}


def sample_event(cls: type[E], **fields: Any) -> E:
    """An instance of event class ``cls`` with every required field filled (strings by
    their field name, numbers 0, optionals ``None``); ``fields`` override."""
    info = msgspec.inspect.type_info(cls)
    assert isinstance(info, msgspec.inspect.StructType)
    values = _required_fields(info)
    values.update(fields)
    return cls(**values)


class EventCapture:
    """A handler that keeps every event it gets, in order."""

    def __init__(self) -> None:
        self.events: list[Event] = []

    def __call__(self, event: Event) -> None:
        self.events.append(event)

    def of_type(self, cls: type[E]) -> list[E]:
        return [e for e in self.events if isinstance(e, cls)]

    @property
    def types(self) -> list[str]:
        return [type(e).__name__ for e in self.events]

    def __len__(self) -> int:
        return len(self.events)
