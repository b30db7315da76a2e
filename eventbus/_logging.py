"""Logging through structlog, configured for speed.

The library only logs what is rare (faults, budget warnings, close reports),
never per event at an enabled level. ``configure_logging`` is for
applications and the command line; a library never configures global state
on import.
"""

from __future__ import annotations

import logging
import sys
from typing import Any

import structlog

__all__ = ["configure_logging", "get_logger"]


def get_logger(name: str) -> Any:
    return structlog.get_logger(name)


def configure_logging(level: int | str = logging.INFO, *, json: bool = False) -> None:
    """Filter below ``level`` at the call site (a filtered call costs ~0.1 µs) and cache loggers."""
    if isinstance(level, str):
        level = logging.getLevelNamesMapping()[level.upper()]
    renderer: Any = (
        structlog.processors.JSONRenderer()
        if json
        else structlog.dev.ConsoleRenderer(colors=sys.stderr.isatty())
    )
    structlog.configure(
        processors=[
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(level),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=True,
    )
