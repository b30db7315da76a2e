"""The ``eventbus`` command line: ``demo``, ``bench``, ``show``, ``replay``, ``convert``, ``stats``,
``report``.

One module per command group (``_demo``, ``_bench``, ``_log``, ``_report``), each with
``register(subparsers)``, which adds its subcommands and sets ``func``
(taking the parsed arguments, returning the exit code); what a command runs
lives beside it (``_demo_trainer``, ``_bench_runner``). Errors meant for
users are ``CliError``: printed as one line, exit 2.

Stdout carries a command's data and nothing else: logging is configured to
stderr before any command runs, and every diagnostic goes there too, so
``eventbus bench --json - | jq`` and ``eventbus show --json LOG | ...`` work. A
reader that goes away (``eventbus show LOG | head``) ends the command quietly
with exit code 141 (128 + SIGPIPE), as Unix tools end.

The bench is also a library, for measuring callbacks from code or tests:
``run_bench`` on ``synthetic_events(Workload(...))`` or a recorded log's
events gives a ``BenchResult`` (what ``eventbus bench --json`` writes).
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

from ._bench_figures import BenchResult, CallbackFigures, Spread
from ._bench_runner import Workload, run_bench, synthetic_events
from ._common import CliError

__all__ = [
    "BenchResult",
    "CallbackFigures",
    "CliError",
    "Spread",
    "Workload",
    "build_parser",
    "main",
    "run_bench",
    "synthetic_events",
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="eventbus", description="Event-bus runtime for training callbacks."
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
    parser = build_parser()
    args = parser.parse_args(argv)
    func = getattr(args, "func", None)
    try:
        if func is None:
            parser.print_help()
            code = 0
        else:
            code = func(args)
        sys.stdout.flush()  # a closed pipe shows here, where it is handled, not at exit
    except CliError as exc:
        print(f"eventbus {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        return _stdout_closed()
    except KeyboardInterrupt:
        return 130
    return code


def _stdout_closed() -> int:
    """``eventbus show LOG | head``: stop without a word, as Unix tools do, and point
    stdout at /dev/null so that Python's last flush at exit does not complain."""
    with contextlib.suppress(OSError, ValueError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    return EXIT_STDOUT_CLOSED


if __name__ == "__main__":
    sys.exit(main())
