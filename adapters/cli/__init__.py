"""The ``eventbus`` command line: ``demo``, ``bench``, ``show``, ``replay``, ``convert``, ``stats``,
``report``.

One module per command group (``_demo``, ``_bench``, ``_log``, ``_report``), each with
``register(subparsers)``, which adds its subcommands and sets ``func``
(taking the parsed arguments, returning the exit code); what a command runs
lives beside it (``_demo_trainer``, ``_bench_runner``). Errors meant for
users are printed as one line, exit 2.

Stdout carries a command's data and nothing else: logging is configured to
stderr before any command runs, and every diagnostic goes there too, so
``eventbus bench --json - | jq`` and ``eventbus show --json LOG | ...`` work. A
reader that goes away (``eventbus show LOG | head``) ends the command quietly
with exit code 141 (128 + SIGPIPE), as Unix tools end.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any

import eventbus
from eventbus import configure_logging
from eventbus._options import OptionTypeError
from eventbus.options import OptionError

from ._common import STDOUT, CliError, as_cli_error

__all__ = ["main"]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="eventbus",
        description="Event-bus runtime for training callbacks.",
        # Where a user looks first: the page that explains each command (one per command).
        epilog="docs: docs/operations/cli.md (a command's own page: eventbus COMMAND --help)",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {eventbus.__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for register in _command_modules():
        register(subparsers)
    return parser


Register = Callable[["argparse._SubParsersAction[Any]"], None]


def _command_modules() -> list[Register]:
    # Imported here so that `eventbus --help` stays fast and each group stays optional.
    from ._bench import register as register_bench
    from ._demo import register as register_demo
    from ._log import register as register_log
    from ._report import register as register_report

    registers: list[Register] = [register_demo, register_bench, register_log, register_report]
    return registers


#: Exit code when our stdout's reader went away: what a shell reports for SIGPIPE.
EXIT_STDOUT_CLOSED = 141


def main(argv: Sequence[str] | None = None) -> int:
    configure_logging("INFO")  # before anything can log: diagnostics never reach stdout
    # Linux names are bytes: one that is not UTF-8 is printed as its bytes, as given.
    reconfigure = getattr(sys.stdout, "reconfigure", None)
    if reconfigure is not None:
        reconfigure(errors="surrogateescape")
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit:  # --help, --version, a usage error: printed, and argparse exits
        if (failed := _flush_stdout()) is not None:
            print(f"eventbus: error: {STDOUT}: cannot write: {failed}", file=sys.stderr)
            return 2
        raise
    func = getattr(args, "func", None)
    command = f"eventbus {args.command}" if args.command else "eventbus"
    try:
        if func is None:
            parser.print_help()
            code = 0
        else:
            code = func(args)
        sys.stdout.flush()  # a closed pipe or a full disk shows here, not at exit
    except (CliError, OptionError, OptionTypeError) as exc:
        _flush_stdout()  # what was printed before the error goes out first (or nowhere)
        print(f"{command}: error: {as_cli_error(exc)}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        return _stdout_closed()
    except OSError as exc:
        # Commands name the files they read and write in their own errors (``CliError``):
        # what is left is their writes to stdout (a full disk, /dev/full), never the log's.
        _silence_stdout()
        reason = exc.strerror or str(exc)
        where = f"{STDOUT}: cannot write" if exc.filename is None else os.fsdecode(exc.filename)
        print(f"{command}: error: {where}: {reason}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    return code


def _stdout_closed() -> int:
    """``eventbus show LOG | head``: stop without a word, as Unix tools do, and point
    stdout at /dev/null so that Python's last flush at exit does not complain."""
    _silence_stdout()
    return EXIT_STDOUT_CLOSED


def _flush_stdout() -> str | None:
    """Flush stdout: ``None``, or why it cannot take what it holds (a full disk). A
    stdout that failed, or closed (``| head``: no failure, quiet), is silenced, so
    that Python's last flush at exit adds nothing to the one line the user gets."""
    try:
        sys.stdout.flush()
    except BrokenPipeError:
        _silence_stdout()
    except (OSError, ValueError) as exc:
        _silence_stdout()
        return exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
    return None


def _silence_stdout() -> None:
    """Point stdout at /dev/null: what it still buffers goes nowhere, quietly, at exit."""
    with contextlib.suppress(OSError, ValueError, AttributeError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())


if __name__ == "__main__":
    sys.exit(main())
