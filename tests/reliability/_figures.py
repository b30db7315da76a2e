"""The figures the reliability tests measure, gathered for FIGURES.md and the README.

Tests add what they checked (runs, faults injected, events checked, events
lost, and any measured figure); nothing is printed. The conftest writes them
to the JSON file named by ``RELIABILITY_FIGURES`` at the end of the session.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec

__all__ = ["FIGURES", "Figures"]


class Figures:
    """Per-area totals; ``add`` sums counts and keeps the maximum of ``max_*`` figures."""

    def __init__(self) -> None:
        self.entries: dict[str, dict[str, Any]] = {}

    def add(self, area: str, **figures: float | int | str) -> None:
        entry = self.entries.setdefault(area, {})
        for key, value in figures.items():
            if isinstance(value, str) or key not in entry:
                entry[key] = value
            elif key.startswith("max_"):
                entry[key] = max(entry[key], value)
            else:
                entry[key] = entry[key] + value

    def write(self, path: Path) -> None:
        path.write_bytes(msgspec.json.format(msgspec.json.encode(self.entries), indent=2))


FIGURES = Figures()
