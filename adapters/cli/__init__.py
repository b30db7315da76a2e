"""The ``eventbus`` command line (docs/operations/cli.md): data alone on stdout, a user's
error one line (exit 2), a reader gone away (``| head``) a quiet end (exit 141)."""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from collections.abc import Sequence

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
        epilog="docs: docs/operations/cli.md (a command's own page: eventbus COMMAND --help)",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {eventbus.__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    from . import _bench, _demo, _log, _report  # here: importing the package stays cheap

    for module in (_demo, _bench, _log, _report):
        module.register(subparsers)
    return parser


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
    except BrokenPipeError:  # `eventbus show LOG | head`: stop without a word, as Unix tools do
        _silence_stdout()
        return EXIT_STDOUT_CLOSED
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


def _flush_stdout() -> str | None:
    """Flush stdout: ``None``, or why it cannot (a full disk); a stdout that failed or
    closed is silenced, so that Python's flush at exit adds nothing to the user's line."""
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
