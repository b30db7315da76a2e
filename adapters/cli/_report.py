"""``eventbus report LOG [LOG_B] [-o FILE.html]``: a run (or two) as one HTML page.

The page is written beside the log unless ``-o`` says where (``-`` for
stdout), and whole: to a temporary file renamed into place, so an
interrupted report never leaves half a page, and never over one of the
logs it reads. A damaged log
still gives its page (with a banner saying what was lost) and a one-line
warning; a file that is not a log is a one-line error, exit code 2.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from adapters.report import RunDigest, comparison_report, digest_log, run_report
from eventbus.log import LogError
from eventbus.state import StateError, atomic_write

from ._common import CliError

__all__ = ["register", "report_path", "write_page"]


def register(subparsers: Any) -> None:
    report = subparsers.add_parser(
        "report",
        help="write a run's report: one self-contained HTML page",
        description=(
            "Write one HTML page for a recorded run (summary, metrics over rounds, callback "
            "cost per period against the budget, failures), or for two runs side by side. "
            "The page fetches nothing: open it from disk in any browser."
        ),
    )
    report.add_argument("log", type=Path, help="event log (.evlog msgpack or .jsonl)")
    report.add_argument(
        "other", type=Path, nargs="?", default=None, help="a second run's log, to compare"
    )
    report.add_argument(
        "-o",
        "--output",
        type=Path,
        default=None,
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


def _digest(path: Path) -> RunDigest:
    try:
        digest = digest_log(path)
    except FileNotFoundError:
        raise CliError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise CliError(f"{path}: is a directory, not an event log") from None
    except LogError as exc:
        raise CliError(str(exc)) from None
    except OSError as exc:
        raise CliError(f"{path}: cannot read: {exc.strerror or exc}") from None
    damage = digest.damage
    if damage.any:
        lost = []
        if damage.truncated is not None:
            lost.append(f"cut short at byte {damage.truncated.offset}")
        if damage.skipped:
            lost.append(f"{damage.skipped} corrupt record(s) skipped")
        if damage.placeholders:
            lost.append(f"{damage.placeholders} record(s) not decodable")
        print(
            f"eventbus report: warning: {path} is damaged ({', '.join(lost)}); the report "
            "shows what could be read",
            file=sys.stderr,
        )
    return digest


def write_page(page: str, output: Path, *, inputs: tuple[Path, ...] = ()) -> None:
    """Write ``page`` to ``output``: a file is replaced whole (``atomic_write``: a
    temporary file renamed into place, with the mode a new file gets); ``-`` is
    stdout, and a device or a pipe (``/dev/stdout``) is written into, never replaced."""
    if str(output) == "-":
        sys.stdout.write(page)
        return
    for source in inputs:
        if output.exists() and source.exists() and output.samefile(source):
            raise CliError(f"{output}: is the log being read; choose another -o")
    if output.is_dir():
        raise CliError(f"{output}: is a directory; give a file name (-o FILE.html)")
    if not output.parent.is_dir():
        raise CliError(f"{output.parent}: no such directory")
    try:
        if output.exists() and not output.is_file():
            with output.open("w", encoding="utf-8") as stream:
                stream.write(page)
        else:
            atomic_write(output, page.encode())
    except (OSError, StateError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc
        raise CliError(f"{output}: cannot write: {reason}") from None


def _report(args: argparse.Namespace) -> int:
    log: Path = args.log
    other: Path | None = args.other
    digest = _digest(log)
    page = run_report(digest) if other is None else comparison_report(digest, _digest(other))
    output: Path = args.output or report_path(log, other)
    write_page(page, output, inputs=(log,) if other is None else (log, other))
    note = f"report written to {output} ({len(page.encode()) / 1024:.0f} KB): open it in a browser"
    print(note, file=sys.stderr if str(output) == "-" else sys.stdout)  # stdout: the page
    return 0
