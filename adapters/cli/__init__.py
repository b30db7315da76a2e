"""The ``eventbus`` command line: ``demo``, ``bench``, ``show``, ``replay``, ``convert``, ``stats``.

One module per command group (``_demo``, ``_bench``, ``_log``), each with
``register(subparsers)``, which adds its subcommands and sets ``func``
(taking the parsed arguments, returning the exit code); what a command runs
lives beside it (``_demo_trainer``, ``_bench_runner``). Errors meant for
users are ``CliError``: printed as one line, exit 2.

The bench is also a library, for measuring callbacks from code or tests:
``run_bench`` on ``synthetic_events(Workload(...))`` or a recorded log's
events gives a ``BenchResult`` (what ``eventbus bench --json`` writes).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from typing import Any

import eventbus

from ._bench_runner import BenchResult, CallbackFigures, Workload, run_bench, synthetic_events
from ._common import CliError

__all__ = [
    "BenchResult",
    "CallbackFigures",
    "CliError",
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

    registers: list[Register] = [register_demo, register_bench, register_log]
    return registers


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    func = getattr(args, "func", None)
    if func is None:
        parser.print_help()
        return 0
    try:
        code: int = func(args)
    except CliError as exc:
        print(f"eventbus {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    return code


if __name__ == "__main__":
    sys.exit(main())
