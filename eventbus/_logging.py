"""Logging through structlog, of what is rare (faults, budget warnings), never per event;
to stderr even before anyone configures structlog, whose default writes to stdout."""

from __future__ import annotations

import logging
import sys
from collections.abc import Iterable, MutableMapping
from typing import Any

import structlog

__all__ = ["configure_logging", "get_logger"]


class _StderrUntilConfigured:
    """A logger named ``name``: structlog's own once it is configured (so an
    application's setup, or ``structlog.testing.capture_logs``, decides), and
    structlog's defaults writing to stderr before that."""

    __slots__ = ("_name", "_proxy")

    def __init__(self, name: str) -> None:
        self._name = name
        self._proxy: Any = structlog.get_logger(name)

    def __getattr__(self, method: str) -> Any:
        if structlog.is_configured():
            return getattr(self._proxy, method)
        # Looked up at each call: sys.stderr may have been replaced since (tests, daemons).
        return getattr(structlog.wrap_logger(structlog.PrintLogger(sys.stderr)), method)

    def __repr__(self) -> str:
        return f"<eventbus logger {self._name!r}>"


def get_logger(name: str) -> Any:
    """A structlog logger that never writes to stdout unless told to."""
    return _StderrUntilConfigured(name)


def configure_logging(
    level: int | str = logging.INFO, *, json: bool = False, quiet: Iterable[str] = ()
) -> None:
    """Filter below ``level`` at the call site (a filtered call costs about a microsecond)
    and cache loggers; write to stderr. ``quiet``: messages not to log at all, for a caller
    that reports them itself (``eventbus bench`` sums up budget warnings once)."""
    if isinstance(level, str):
        level = logging.getLevelNamesMapping()[level.upper()]
    renderer: Any = (
        structlog.processors.JSONRenderer()
        if json
        else structlog.dev.ConsoleRenderer(colors=sys.stderr.isatty())
    )
    processors: list[Any] = [
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
        renderer,
    ]
    if quiet:
        processors.insert(0, _drop(frozenset(quiet)))
    structlog.configure(
        processors=processors,
        wrapper_class=structlog.make_filtering_bound_logger(level),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=True,
    )


def _drop(messages: frozenset[str]) -> Any:
    """A processor dropping ``messages``, each as given or followed by a colon and its
    particulars (``callbacks over budget: X took 205 ms ...``)."""

    def drop(logger: Any, method: str, event_dict: MutableMapping[str, Any]) -> Any:
        message = event_dict.get("event")
        if isinstance(message, str) and (
            message in messages or message.partition(":")[0] in messages
        ):
            raise structlog.DropEvent
        return event_dict

    return drop
