"""What several tests build or take apart: deeply nested dicts, a log's records."""

from __future__ import annotations

import struct
from typing import Any

__all__ = ["nested_dict", "record_spans"]


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
