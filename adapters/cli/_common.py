"""Shared pieces of the command-line modules."""

from __future__ import annotations

__all__ = ["CliError"]


class CliError(Exception):
    """A user's mistake (bad file, bad argument): shown as one line, exit code 2."""
