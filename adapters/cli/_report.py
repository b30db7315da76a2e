"""``eventbus report LOG [LOG_B] [-o FILE.html]``: a run (or two) as one HTML page, written
whole (never half a page) and never over a log it reads. A damaged log still gives its
page, with a warning: what could be read is what a user needs to see."""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from pathlib import Path
from typing import Any

import msgspec

from adapters.report import comparison_report, run_report
from adapters.report._digest import RunDigest, digest_log
from eventbus.state import StateError
from eventbus.state._files import atomic_write

from ._common import CliError, cannot_write, check_output, local_log, log_errors


def register(subparsers: Any) -> None:
    report = subparsers.add_parser(
        "report",
        help="write a run's report: one self-contained HTML page",
        description="Write one self-contained HTML page for a recorded run, or for two side by "
        "side.",
        epilog="docs: docs/report.md",
    )
    report.add_argument("log", type=Path, help="event log (.evlog msgpack or .jsonl)")
    report.add_argument("other", type=Path, nargs="?", help="a second run's log, to compare")
    report.add_argument(
        "-o",
        "--output",
        type=Path,
        metavar="FILE.html",
        help="where to write the page, '-' for stdout (default: beside the log, LOG.html, "
        "or A-vs-B.html for two logs)",
    )
    report.set_defaults(func=_report)


def report_path(log: Path, other: Path | None = None) -> Path:
    """Where a report goes by default: beside the (first) log."""
    if other is None:
        return log.with_suffix(".html")
    return log.with_name(f"{log.stem}-vs-{other.stem}.html")


def _digest(path: Path, name: Path) -> RunDigest:
    """The digest of the log at ``path``, which the user named ``name`` (``path`` may be
    a copy of a pipe, see ``local_log``): the page and the messages say ``name``."""
    with log_errors(name):
        digest = digest_log(path)
    # A name that is not UTF-8 (Linux names are bytes) shows its bytes escaped: the
    # page is UTF-8 text.
    digest.path = Path(os.fsencode(name).decode("utf-8", "backslashreplace"))
    damage = digest.damage
    if damage.first_error:
        first = damage.first_error.replace(str(path), str(digest.path))
        digest.damage = damage = msgspec.structs.replace(damage, first_error=first)
    if damage.any:
        print(
            f"eventbus report: warning: {name} is damaged: {damage.lost()}; the report shows "
            "what could be read",
            file=sys.stderr,
        )
    return digest


def write_page(
    page: str, output: Path, *, inputs: tuple[Path, ...] = (), option: str = "-o"
) -> None:
    """Write ``page`` to ``output``, never onto one of ``inputs``: a file replaced whole,
    a device or a pipe written into, ``-`` stdout; a failure is one line naming it."""
    check_output(output, inputs=inputs, option=option)
    if str(output) == "-":  # a failing stdout: `main` names it
        sys.stdout.write(page)
        return
    data = page.encode("utf-8", "backslashreplace")  # never a traceback for a stray name
    try:
        if output.exists() and not output.is_file():
            with output.open("wb") as stream:
                stream.write(data)
        else:
            atomic_write(output, data)
    except (OSError, StateError) as exc:
        raise cannot_write(output, exc) from None


def _report(args: argparse.Namespace) -> int:
    log: Path = args.log
    other: Path | None = args.other
    inputs = (log,) if other is None else (log, other)
    if args.output is None:
        for source in inputs:
            if source.exists() and not (source.is_file() or source.is_dir()):
                raise CliError(
                    f"{source}: is not a regular file (a pipe?), so the page cannot go "
                    "beside it: give -o FILE.html"
                )
    output: Path = args.output or report_path(log, other)
    check_output(output, inputs=inputs)  # before reading: a missing directory is said now
    with contextlib.ExitStack() as copies:  # a pipe is read once, into a temporary file
        digest = _digest(copies.enter_context(local_log(log)), log)
        if other is None:
            page = run_report(digest)
        else:
            page = comparison_report(digest, _digest(copies.enter_context(local_log(other)), other))
    write_page(page, output, inputs=inputs)
    size = len(page.encode("utf-8", "backslashreplace")) / 1024
    note = f"report written to {output} ({size:.0f} KB): open it in a browser"
    if str(output) == "-":  # stdout is the page
        print(note, file=sys.stderr)
    else:
        print(note)
    return 0
