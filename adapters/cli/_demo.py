"""``eventbus demo``: run the demo trainer and print what happened."""

from __future__ import annotations

import argparse
import json
import shlex
from pathlib import Path
from typing import Any

from eventbus.state import StateError

from ._common import CliError
from ._demo_trainer import main_sync
from ._report import report_path

__all__ = ["register"]


def register(subparsers: Any) -> None:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "demo",
        help="run the demo trainer (N async workers, callbacks, checkpoints)",
        description="Train a linear regression with N async workers reporting every step; "
        "gather the reports into rounds for the built-in callbacks; print a summary.",
    )
    parser.add_argument("--workers", type=int, default=4, help="number of ranks (default 4)")
    parser.add_argument("--steps", type=int, default=100, help="SGD steps per worker (default 100)")
    parser.add_argument(
        "--checkpoint-every", type=int, default=10, help="steps between checkpoints (default 10)"
    )
    parser.add_argument(
        "--fail-rank", type=int, default=None, help="this rank fails once, halfway (restarts)"
    )
    parser.add_argument(
        "--out", type=Path, default=None, help="checkpoint directory (default: temp)"
    )
    parser.add_argument("--seed", type=int, default=0, help="data and sampling seed (default 0)")
    parser.add_argument(
        "--period", type=float, default=0.5, help="health-check period, seconds (default 0.5)"
    )
    parser.add_argument(
        "--step-time", type=float, default=0.01, help="seconds per step of rank 0 (default 0.01)"
    )
    parser.add_argument(
        "--resume",
        type=Path,
        default=None,
        metavar="CHECKPOINT",
        help="continue from a checkpoint of an earlier demo run: weights and callback state",
    )
    parser.add_argument(
        "--no-log", action="store_true", help="do not record the event log (<out>/<run id>.evlog)"
    )
    parser.add_argument(
        "--patience", type=int, default=20, help="early stopping's patience, rounds (default 20)"
    )
    parser.add_argument(
        "--summary",
        type=Path,
        default=None,
        metavar="FILE.json",
        help="write the run's summary (status, rounds, last checkpoint, final mean loss, "
        "every stateful callback's final state) as JSON",
    )
    parser.add_argument(
        "--async-ranks",
        action="store_true",
        help="let ranks run ahead of each other instead of meeting after every report "
        "(when a callback's stop is seen then depends on scheduling)",
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    # Logging is configured (to stderr) by `main`: the summary below is the only stdout.
    try:
        summary = main_sync(
            workers=args.workers,
            steps=args.steps,
            checkpoint_every=args.checkpoint_every,
            fail_rank=args.fail_rank,
            out=args.out,
            seed=args.seed,
            period=args.period,
            step_time=args.step_time,
            resume=args.resume,
            log=not args.no_log,
            sync=not args.async_ranks,
            patience=args.patience,
        )
    except (ValueError, OSError, StateError) as exc:
        raise CliError(str(exc)) from None
    if args.summary is not None:
        args.summary.parent.mkdir(parents=True, exist_ok=True)
        args.summary.write_text(json.dumps(summary.to_json(), indent=2) + "\n")
    for line in summary.lines():
        print(line)
    if summary.log is not None:
        latest = max(summary.out.glob("checkpoint_*"), default=None)
        log = shlex.quote(str(summary.log))  # commands to paste: a path may hold a space
        page = shlex.quote(str(report_path(summary.log)))
        print(f"report: eventbus report {log}  (then open {page})")
        print(f"next: eventbus show {log} | eventbus stats {log}")
        if latest is not None and not summary.stopped_early:  # early stopping would hold
            resume = shlex.quote(str(latest))
            print(f"      eventbus demo --resume {resume} --steps {args.steps + 50}")
    return 0
