"""Shared pieces of the command-line modules: errors, loading callbacks, opening logs."""

from __future__ import annotations

import contextlib
import importlib
import inspect
import os
import sys
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

from eventbus.log import LogError, LogReader
from handlers.wiring import implemented_hooks

__all__ = [
    "CliError",
    "callback_name",
    "check_log_tail",
    "is_training_callback",
    "load_object",
    "reading_log",
    "split_callbacks",
]


class CliError(Exception):
    """A user's mistake (bad file, bad argument): shown as one line, exit code 2."""


@contextlib.contextmanager
def reading_log(path: Path, *, skip_corrupt: bool = False) -> Iterator[LogReader]:
    """Open a log; every way a user's file can be bad becomes a one-line ``CliError``."""
    try:
        reader = LogReader(path, skip_corrupt=skip_corrupt)
    except FileNotFoundError:
        raise CliError(f"{path}: no such file") from None
    except OSError as exc:
        raise CliError(f"{path}: cannot read: {exc.strerror or exc}") from None
    except LogError as exc:
        raise CliError(str(exc)) from None
    try:
        with reader:
            yield reader
    except LogError as exc:
        raise CliError(str(exc)) from None
    except BrokenPipeError:  # our stdout closed (`| head`): not the log's fault
        raise
    except OSError as exc:
        raise CliError(f"{path}: cannot read: {exc.strerror or exc}") from None
    except MemoryError:
        raise CliError(f"{path}: not enough memory to read this log") from None


def check_log_tail(reader: LogReader) -> None:
    """After the output: a torn tail or skipped records are an error the user sees;
    placeholders (records that did not decode as their type) are a note on stderr."""
    note = (
        f"{reader.placeholders} record(s) shown as EventPlaceholder (not decodable as "
        "their type; see their reason)"
        if reader.placeholders
        else ""
    )
    if reader.truncated is not None:
        raise CliError(reader.truncated.describe(reader.path) + (f"; {note}" if note else ""))
    if reader.skipped:
        raise CliError(
            f"{reader.path}: skipped {reader.skipped} corrupt record(s); first: {reader.errors[0]}"
            + (f"; {note}" if note else "")
        )
    if note:
        print(f"{reader.path}: note: {note}", file=sys.stderr)


def load_object(spec: str) -> Any:
    """``module:attr`` → the object; classes and zero-argument factories are called."""
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise CliError(f"{spec!r}: expected MODULE:NAME, e.g. mypkg.callbacks:LossLogger")
    if os.getcwd() not in sys.path:  # like `python -m`: modules of the current directory
        sys.path.insert(0, os.getcwd())
    try:
        target: Any = importlib.import_module(module_name)
    except ImportError as exc:
        raise CliError(f"{spec!r}: cannot import {module_name!r}: {exc}") from None
    for part in attr.split("."):
        try:
            target = getattr(target, part)
        except AttributeError:
            raise CliError(f"{spec!r}: {module_name!r} has no attribute {attr!r}") from None
    if isinstance(target, type) or (is_function(target) and takes_no_arguments(target)):
        try:
            target = target()
        except Exception as exc:
            raise CliError(f"{spec!r}: creating it failed: {type(exc).__name__}: {exc}") from None
    return target


def is_function(obj: Any) -> bool:
    return inspect.isfunction(obj) or inspect.ismethod(obj)


def takes_no_arguments(func: Callable[..., Any]) -> bool:
    try:
        params = inspect.signature(func).parameters.values()
    except (TypeError, ValueError):
        return False
    return all(
        p.default is not p.empty or p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) for p in params
    )


def is_training_callback(obj: Any) -> bool:
    """Whether ``obj`` is wired as a training callback or as a plain bus handler.

    One rule, ``handlers``'s own: an object that implements a training hook
    (``implemented_hooks``) is a training callback; anything else must be a
    callable, a handler that gets every event. ``ValueError`` otherwise.
    """
    if implemented_hooks(obj):
        return True
    if callable(obj):
        return False
    raise ValueError(
        "neither a handler (callable) nor a training callback (with before_run, "
        "after_report, after_exception or after_run)"
    )


def split_callbacks(callbacks: Iterable[Any]) -> tuple[list[Any], list[Any]]:
    """Training callbacks and plain bus handlers (see ``is_training_callback``)."""
    training: list[Any] = []
    plain: list[Any] = []
    for callback in callbacks:
        try:
            (training if is_training_callback(callback) else plain).append(callback)
        except ValueError as exc:
            raise ValueError(f"{callback_name(callback)}: {exc}") from None
    return training, plain


def callback_name(callback: Any) -> str:
    """How a callback is named in figures: a function's own name, or its class's."""
    name = getattr(callback, "__qualname__", None)  # functions and methods have their own
    return name if isinstance(name, str) else type(callback).__qualname__
