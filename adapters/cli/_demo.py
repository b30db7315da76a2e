"""``eventbus demo``: run the demo trainer and print what happened."""

from __future__ import annotations

import argparse
import json
import shlex
from pathlib import Path
from typing import Any

import anyio

from eventbus.state import StateError
from handlers import latest_checkpoint

from ._common import CliError, as_cli_error, cannot_write, check_output, given, same_file
from ._demo_trainer import DemoOptions, DemoSummary, run_demo
from ._report import report_path


def register(subparsers: Any) -> None:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "demo",
        help="run the demo trainer (N async workers, callbacks, checkpoints)",
        description="Train a linear regression with N async workers reporting every step; "
        "gather the reports into rounds for the built-in callbacks; print a summary.",
        epilog="docs: docs/operations/cli.md#demo",
    )
    parser.add_argument("--workers", type=int, help="number of ranks (default 4)")
    parser.add_argument("--steps", type=int, help="SGD steps per worker (default 100)")
    parser.add_argument(
        "--checkpoint-every", type=int, help="steps between checkpoints (default 10)"
    )
    parser.add_argument("--fail-rank", type=int, help="this rank fails once, halfway (restarts)")
    parser.add_argument("--out", type=Path, help="checkpoint directory (default: temp)")
    parser.add_argument("--seed", type=int, help="data and sampling seed (default 0)")
    parser.add_argument("--period", type=float, help="health-check period, seconds (default 0.5)")
    parser.add_argument("--step-time", type=float, help="seconds per step of rank 0 (default 0.01)")
    parser.add_argument(
        "--resume",
        type=Path,
        metavar="CHECKPOINT",
        help="continue from a checkpoint of an earlier demo run, or its directory's latest",
    )
    parser.add_argument(
        "--no-log", action="store_true", help="do not record the event log (<out>/<run id>.evlog)"
    )
    parser.add_argument(
        "--patience", type=int, help="early stopping's patience, rounds (default 20)"
    )
    parser.add_argument(
        "--summary",
        type=Path,
        metavar="FILE.json",
        help="write the run's summary as JSON",
    )
    parser.add_argument(
        "--async-ranks",
        action="store_true",
        help="let ranks run ahead of each other, not meet after every report",
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    # Logging is configured (to stderr) by `main`: the summary below is the only stdout.
    if args.summary is not None:  # before the run: a destination that cannot be is said now
        check_output(args.summary, option="--summary", make_parents=True)
    options = DemoOptions.build(None, **given(args, *DemoOptions.__struct_fields__))
    try:
        summary = anyio.run(
            lambda: run_demo(
                options=options,
                out=args.out,
                resume=args.resume,
                log=not args.no_log,
                sync=not args.async_ranks,
            )
        )
    except (ValueError, OSError, StateError) as exc:
        raise as_cli_error(exc) from None
    for line in summary.lines():
        print(line)
    if summary.log is not None:
        latest = latest_checkpoint(summary.out)
        log = shlex.quote(str(summary.log))  # commands to paste: a path may hold a space
        page = shlex.quote(str(report_path(summary.log)))
        print(f"report: eventbus report {log}  (then open {page})")
        print(f"next: eventbus show {log} | eventbus stats {log}")
        if latest is not None and not summary.stopped_early:  # early stopping would hold
            resume = shlex.quote(str(latest))
            print(f"      eventbus demo --resume {resume} --steps {options.steps + 50}")
    if args.summary is not None:  # after the lines above: a failure here loses none of them
        _write_summary(args.summary, summary)
    return 0


def _write_summary(path: Path, summary: DemoSummary) -> None:
    """The summary as JSON at ``path`` (its directories made), never over the run's log
    (a resumed run appends to it: the summary would erase the run's history)."""
    if summary.log is not None and same_file(path, summary.log):
        raise CliError(f"{path}: is the run's event log; choose another --summary")
    check_output(path, option="--summary", make_parents=True)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(summary.to_json(), indent=2) + "\n")
    except OSError as exc:
        raise cannot_write(path, exc) from None
