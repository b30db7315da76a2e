"""What several tests build or take apart: deeply nested dicts, a log's records, reports,
a stateful callback that restores itself, the command line and the examples run as a user
runs them."""

from __future__ import annotations

import struct
import subprocess
import sys
from pathlib import Path
from typing import Any

from eventbus import Report
from eventbus.state._model import CallbackState

__all__ = [
    "EXAMPLES",
    "Custom",
    "eventbus",
    "nested_dict",
    "ranked_report",
    "record_spans",
    "run_example",
]

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
