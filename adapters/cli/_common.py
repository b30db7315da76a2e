"""Shared pieces of the command-line modules: errors, loading callbacks, opening logs,
checking and writing outputs. Errors tell inputs from outputs, and a file is never written
while it is read (compared by device and inode)."""

from __future__ import annotations

import contextlib
import importlib
import inspect
import os
import stat
import sys
import tempfile
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

from eventbus._options import OptionTypeError
from eventbus.log import LogError, LogReader
from eventbus.options import OptionError
from handlers._user import implemented_hooks

STDOUT = "standard output"


class CliError(Exception):
    """A user's mistake (bad file, bad argument): shown as one line, exit code 2."""


def flag(option: str) -> str:
    """The flag a user types for an option (``--repeat`` for ``repeats``)."""
    return "--repeat" if option == "repeats" else "--" + option.replace("_", "-")


def as_cli_error(exc: Exception) -> CliError:
    """A library error as the command's one line, naming the flag the user typed."""
    if isinstance(exc, OptionError | OptionTypeError):
        option, text = exc.option, str(exc)
        return CliError(flag(option) + text[len(option) :] if text.startswith(option) else text)
    return CliError(str(exc))


def given(args: Any, *names: str) -> dict[str, Any]:
    """The options among ``names`` given on the command line (the others keep defaults)."""
    return {name: value for name in names if (value := getattr(args, name, None)) is not None}


def cannot_write(output: str | Path, exc: Exception) -> CliError:
    """The one line for an output that failed: named, with the system's reason."""
    return CliError(f"{output}: cannot write: {getattr(exc, 'strerror', None) or exc}")


@contextlib.contextmanager
def writing(output: str | Path) -> Iterator[None]:
    """Writes to ``output`` inside: an ``OSError`` is the output's, one line naming it
    (a ``BrokenPipeError`` stays one: ``main`` ends quietly)."""
    try:
        yield
    except BrokenPipeError:
        raise
    except OSError as exc:
        raise cannot_write(output, exc) from None


def write_to(output: str | Path, write: Callable[[Any], object], item: Any) -> None:
    """``write(item)``, its failures ``output``'s, not the log's read in between (no
    context manager: it runs once an event)."""
    try:
        write(item)
    except BrokenPipeError:
        raise
    except OSError as exc:
        raise cannot_write(output, exc) from None


def same_file(a: str | Path, b: str | Path) -> bool:
    """Whether two names are one file (device and inode)."""
    try:
        return os.path.samefile(a, b)
    except (OSError, ValueError):  # either is missing: not one file
        return False


def _check_stdout(inputs: Sequence[Path]) -> None:
    """Refuse a stdout that is one of ``inputs`` (``eventbus show LOG >> LOG``)."""
    for source in inputs:
        try:
            out = os.fstat(sys.stdout.fileno())
            same = stat.S_ISREG(out.st_mode) and os.path.samestat(out, os.stat(source))
        except (OSError, ValueError, AttributeError):  # no descriptor (captured), no file
            same = False
        if same:
            raise CliError(f"{STDOUT}: is the log being read ({source}); write it elsewhere")


def check_output(
    output: Path, *, inputs: Sequence[Path] = (), option: str = "-o", make_parents: bool = False
) -> None:
    """Refuse, before any work, an output that cannot be written or is an input;
    ``option`` names the option that gave it."""
    if str(output) == "-":
        _check_stdout(inputs)
        return
    for source in inputs:
        if same_file(output, source):
            same = "" if str(output) == str(source) else f" ({source})"
            raise CliError(f"{output}: is the log being read{same}; choose another {option}")
    if output.is_dir():
        raise CliError(f"{output}: is a directory; give a file name")
    parent = output.parent
    if make_parents:
        while not parent.exists() and parent != parent.parent:
            parent = parent.parent  # the nearest directory that exists, to make the rest in
    if not parent.is_dir():
        reason = "is not a directory" if parent.exists() else "no such directory"
        raise CliError(f"{output}: cannot write: {parent}: {reason}")
    if not os.access(output if output.exists() else parent, os.W_OK):
        raise CliError(f"{output}: cannot write: permission denied")


@contextlib.contextmanager
def local_log(path: Path) -> Iterator[Path]:
    """The log at ``path`` as a file that can be read more than once: itself, or for a
    stream a temporary copy (its header checked first). Errors inside name ``path``."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        mode = stat.S_IFREG
    if stat.S_ISREG(mode) or stat.S_ISDIR(mode):
        yield path
        return
    try:
        fd, name = tempfile.mkstemp(prefix="eventbus-", suffix=".log")
    except OSError as exc:
        raise _cannot_copy(path, exc) from None
    copy = Path(name)
    try:
        try:
            with open(fd, "wb") as target, reading_log(path) as source:
                try:
                    source.copy_to(target)
                except OSError as exc:  # the copy's, not a read of the log's
                    raise _cannot_copy(path, exc) from None
        except OSError as exc:  # closing the copy (a full disk)
            raise _cannot_copy(path, exc) from None
        try:
            yield copy
        except CliError as exc:
            raise CliError(str(exc).replace(str(copy), str(path))) from None
    finally:
        copy.unlink(missing_ok=True)


def _cannot_copy(path: Path, exc: OSError) -> CliError:
    return CliError(f"{path}: cannot copy it to a temporary file to read: {exc.strerror or exc}")


@contextlib.contextmanager
def reading_log(path: Path, *, skip_corrupt: bool = False) -> Iterator[LogReader]:
    """Open a log, its errors one line each (``log_errors``)."""
    _check_stdout((path,))
    with log_errors(path), LogReader(path, skip_corrupt=skip_corrupt) as reader:
        yield reader


@contextlib.contextmanager
def log_errors(name: str | Path) -> Iterator[None]:
    """Reading the log ``name`` inside: every way a user's file can be bad is one line."""
    try:
        yield
    except FileNotFoundError:
        raise CliError(f"{name}: no such file") from None
    except IsADirectoryError:
        raise CliError(f"{name}: cannot read: is a directory, not an event log") from None
    except LogError as exc:
        raise CliError(str(exc)) from None
    except BrokenPipeError:  # our stdout closed (`| head`): not the log's fault
        raise
    except OSError as exc:
        raise CliError(f"{name}: cannot read: {exc.strerror or exc}") from None
    except MemoryError:
        raise CliError(f"{name}: not enough memory to read this log") from None


def check_log_tail(reader: LogReader, name: Path | None = None) -> None:
    """After the output: a torn tail or skipped records are an error; placeholders a note."""
    note = (
        f"{reader.placeholders} record(s) shown as EventPlaceholder (not decodable as "
        "their type; see their reason)"
    )
    also = f"; {note}" if reader.placeholders else ""
    if reader.truncated is not None:
        raise CliError(reader.truncated.describe(reader.path) + also)
    if reader.skipped:
        raise CliError(
            f"{reader.path}: skipped {reader.skipped} corrupt record(s); first: "
            f"{reader.errors[0]}{also}"
        )
    if reader.placeholders:
        print(f"{name or reader.path}: note: {note}", file=sys.stderr)


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
    if isinstance(target, type) or _is_factory(target):
        try:
            target = target()
        except Exception as exc:
            raise CliError(f"{spec!r}: creating it failed: {type(exc).__name__}: {exc}") from None
    return target


def _is_factory(obj: Any) -> bool:
    """A function or method callable with no arguments (a handler takes the event)."""
    if not (inspect.isfunction(obj) or inspect.ismethod(obj)):
        return False
    try:
        params = inspect.signature(obj).parameters.values()
    except (TypeError, ValueError):
        return False
    return all(
        p.default is not p.empty or p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) for p in params
    )


def is_training_callback(obj: Any) -> bool:
    """Whether ``obj`` implements a training hook (else it must be a callable bus
    handler: ``ValueError`` otherwise)."""
    if implemented_hooks(obj):
        return True
    if callable(obj):
        return False
    raise ValueError(
        "neither a handler (callable) nor a training callback (with before_run, "
        "after_report, after_exception or after_run)"
    )


def split_callbacks(callbacks: Iterable[Any]) -> tuple[list[Any], list[Any]]:
    """(training callbacks, plain handlers)."""
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
