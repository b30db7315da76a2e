"""Where the ``eventbus`` commands write, and every way that can fail.

Issue item 8: a command never writes onto a file it reads, however the two
are spelled (a hard link, a symlink, ``/dev/stdout`` appended to the log):
files are compared by identity (device and inode), not by path.

Issue item 10: an output that cannot be written (a missing directory, a full
disk or ``/dev/full``, stdout included; a path that is not UTF-8) is one
line naming the output, exit code 2, never a traceback and never blamed on
the log read. Destinations are checked before the work; a write that still
fails after it keeps what was computed (the bench's table is printed first).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import IO

import pytest
from _builders import sample_event

from eventbus import CheckpointSaved, WorkerFailure
from eventbus.log import read_log
from eventbus.testing import report_rounds, write_log

CLI = [sys.executable, "-m", "adapters.cli"]
FULL = "No space left on device"
CALLBACKS = "def count(event):\n    pass\n"


def cli(
    *args: str | Path,
    cwd: Path,
    stdout: int | IO[bytes] = subprocess.PIPE,
    stdin: int | IO[bytes] | None = None,
    buffered: bool = False,
) -> subprocess.CompletedProcess[bytes]:
    """The command line in a subprocess, with its stdout where the test says (bytes: a
    name that is not UTF-8 is printed as its bytes). ``buffered``: stdout buffered as a
    user's is (the tests' environment may say ``PYTHONUNBUFFERED``)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    if not buffered:
        env["PYTHONUNBUFFERED"] = "1"
    return subprocess.run(
        [*CLI, *args],
        stdout=stdout,
        stdin=stdin,
        stderr=subprocess.PIPE,
        cwd=cwd,
        env=env,
        check=False,
        timeout=120,
    )


def one_error(done: subprocess.CompletedProcess[bytes], command: str, *needles: str) -> str:
    """The one line a failed command says (exit code 2), holding every needle. The
    demo logs its run on stderr: its error is the last line, and the only error."""
    stderr = done.stderr.decode("utf-8", "backslashreplace")
    assert done.returncode == 2, (done.returncode, stderr)
    assert "Traceback" not in stderr and "Exception ignored" not in stderr, stderr
    lines = stderr.splitlines()
    if command == "demo":
        assert [line for line in lines if ": error: " in line] == lines[-1:], stderr
        lines = lines[-1:]
    assert len(lines) == 1, stderr
    prefix = f"eventbus {command}" if command else "eventbus"  # no command: main's own
    assert lines[0].startswith(f"{prefix}: error: "), stderr
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    return lines[0]


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    """A directory with ``my_callbacks.py`` and a small log ``run.evlog``."""
    (tmp_path / "my_callbacks.py").write_text(CALLBACKS)
    events = [
        *report_rounds(3, world_size=2),
        sample_event(WorkerFailure, rank=1, message="CUDA out of memory"),
        sample_event(CheckpointSaved, checkpoint="ckpt-2", index=2),
    ]
    write_log(tmp_path / "run.evlog", events, run_id="demo", start=100.0)
    return tmp_path


def has_matplotlib() -> bool:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


# --- 8. never onto an input ------------------------------------------------------------------


def test_convert_onto_a_hard_link_of_its_input_is_refused(workdir: Path) -> None:
    """The paths differ, the file is one: comparing resolved paths truncated the log."""
    log = workdir / "run.evlog"
    original = log.read_bytes()
    os.link(log, workdir / "link.evlog")
    for output in ("link.evlog", "link.jsonl"):
        if output == "link.jsonl":
            os.link(log, workdir / output)
        done = cli("convert", "run.evlog", output, cwd=workdir)
        one_error(done, "convert", output, "is the log being read")
        assert log.read_bytes() == original


@pytest.mark.parametrize("alias", ["symlink", "/dev/stdout", "/dev/stdin"])
def test_convert_onto_an_alias_of_its_input_is_refused(workdir: Path, alias: str) -> None:
    log = workdir / "run.evlog"
    original = log.read_bytes()
    if alias == "symlink":
        (workdir / "alias.evlog").symlink_to("run.evlog")
        done = cli("convert", "run.evlog", "alias.evlog", cwd=workdir)
        output = "alias.evlog"
    elif alias == "/dev/stdout":  # stdout appended to the log itself
        with log.open("ab") as stream:
            done = cli("convert", "run.evlog", alias, cwd=workdir, stdout=stream)
        output = alias
    else:  # the input read through stdin, the output the same file by its name
        with log.open("rb") as stream:
            done = cli("convert", alias, "run.evlog", cwd=workdir, stdin=stream)
        output = "run.evlog"
    one_error(done, "convert", output, "is the log being read")
    assert log.read_bytes() == original


def test_report_onto_a_hard_link_of_its_log_is_refused(workdir: Path) -> None:
    log = workdir / "run.evlog"
    original = log.read_bytes()
    os.link(log, workdir / "page.html")
    one_error(cli("report", "run.evlog", "-o", "page.html", cwd=workdir), "report", "page.html")
    assert log.read_bytes() == original


BENCH_ONTO_LOG = {
    "--json hard link": ["--json", "link.json"],
    "--json same path": ["--json", "run.evlog"],
    "--html same path": ["--html", "run.evlog"],
    "--html symlink": ["--html", "alias.html"],
    "--plot hard link": ["--plot", "link.json"],
}


@pytest.mark.parametrize("option", BENCH_ONTO_LOG.values(), ids=BENCH_ONTO_LOG.keys())
def test_bench_outputs_onto_its_log_are_refused_before_the_bench(
    workdir: Path, option: list[str]
) -> None:
    if option[0] == "--plot" and not has_matplotlib():
        pytest.skip("--plot needs matplotlib")
    log = workdir / "run.evlog"
    original = log.read_bytes()
    os.link(log, workdir / "link.json")
    (workdir / "alias.html").symlink_to("run.evlog")
    done = cli("bench", "noop", "--log", "run.evlog", "--repeat", "1", *option, cwd=workdir)
    one_error(done, "bench", option[1], "is the log being read")
    assert done.stdout == b""  # refused before the bench ran
    assert log.read_bytes() == original


@pytest.mark.parametrize("command", [["show", "--json"], ["show"], ["stats"]])
def test_stdout_onto_the_log_read_is_refused(workdir: Path, command: list[str]) -> None:
    """``eventbus show --json run.jsonl >> run.jsonl`` would read what it writes."""
    for name in ("run.evlog", "run.jsonl"):
        log = write_log(workdir / name, report_rounds(3, world_size=2))
        original = log.read_bytes()
        with log.open("ab") as stream:
            done = cli(*command, name, cwd=workdir, stdout=stream)
        one_error(done, command[0], name, "standard output")
        assert log.read_bytes() == original


def test_demo_summary_onto_the_runs_log_is_refused(tmp_path: Path) -> None:
    """A resumed demo appends to its log; a summary written over it would erase it.
    The summary still reaches stdout."""
    first = cli("demo", "--out", "d", "--steps", "10", "--step-time", "0.001", cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    (log,) = (tmp_path / "d").glob("*.evlog")
    (checkpoint,) = (tmp_path / "d").glob("checkpoint_*")
    summary = f"d/{log.name}"
    done = cli(
        "demo", "--resume", checkpoint, "--steps", "20", "--step-time", "0.001",
        "--summary", summary, cwd=tmp_path,
    )  # fmt: skip
    one_error(done, "demo", summary, "is the run's event log")
    assert b"run finished:" in done.stdout
    events = read_log(log).events
    assert [type(e).__name__ for e in events].count("RunResumed") == 1


# --- 10. every output, every way it fails -----------------------------------------------------


STDOUT_COMMANDS = {
    "show": ["show", "run.evlog"],
    "show --json": ["show", "--json", "run.evlog"],
    "stats": ["stats", "run.evlog"],
    "stats --json": ["stats", "--json", "run.evlog"],
    "convert": ["convert", "run.evlog", "copy.jsonl"],
    "replay": ["replay", "run.evlog", "--callbacks", "my_callbacks:count"],
    "report -o -": ["report", "run.evlog", "-o", "-"],
    "report": ["report", "run.evlog"],
    "bench": ["bench", "noop", "--events", "40", "--repeat", "1"],
    "bench --json -": ["bench", "noop", "--events", "40", "--repeat", "1", "--json", "-"],
    "demo": ["demo", "--steps", "10", "--step-time", "0.001", "--out", "d", "--no-log"],
    "help": ["--help"],
}


@pytest.mark.parametrize("buffered", [False, True], ids=["unbuffered", "buffered"])
@pytest.mark.parametrize("command", STDOUT_COMMANDS.values(), ids=STDOUT_COMMANDS.keys())
def test_a_full_stdout_is_one_line_naming_it(
    workdir: Path, command: list[str], buffered: bool
) -> None:
    """``eventbus show LOG > /dev/full`` said "run.evlog: cannot read: No space left on
    device", blaming the log; ``stats`` ended in a traceback."""
    with open("/dev/full", "wb") as full:
        done = cli(*command, cwd=workdir, stdout=full, buffered=buffered)
    if command == ["--help"]:  # argparse's own: it ignores a failed write, main the flush
        assert done.returncode in (0, 2), done.stderr
        assert b"Traceback" not in done.stderr and b"Exception ignored" not in done.stderr
        if done.returncode == 2:
            one_error(done, "", "standard output", FULL)
        return
    line = one_error(done, command[0], "standard output", FULL)
    assert "run.evlog" not in line and "cannot read" not in line


def test_a_closed_stdout_stays_quiet(workdir: Path) -> None:
    """What a full stdout must not change: a reader gone (``| head``) is exit 141, silent."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        with open(write_end, "wb", closefd=False) as closed:
            done = cli("stats", "--json", "run.evlog", cwd=workdir, stdout=closed)
    finally:
        os.close(write_end)
    assert (done.returncode, done.stderr) == (141, b"")


FULL_FILES = {
    "convert": (["convert", "run.evlog", "/dev/full", "--to", "jsonl"], b""),
    "report -o": (["report", "run.evlog", "-o", "/dev/full"], b""),
    "bench --json": (["bench", "noop", "--events", "40", "--repeat", "1", "--json", "/dev/full"],
                     b"through the bus: "),
    "bench --html": (["bench", "noop", "--events", "40", "--repeat", "1", "--html", "/dev/full"],
                     b"through the bus: "),
    "demo --summary": (["demo", "--steps", "10", "--step-time", "0.001", "--out", "d", "--no-log",
                        "--summary", "/dev/full"], b"run finished:"),
}  # fmt: skip


@pytest.mark.parametrize(("command", "kept"), FULL_FILES.values(), ids=FULL_FILES.keys())
def test_a_full_output_file_is_one_line_and_keeps_the_rest(
    workdir: Path, command: list[str], kept: bytes
) -> None:
    """``--json FILE`` on a full disk: the table is printed all the same (the bench's
    results are not lost), then one line says the file could not be written."""
    done = cli(*command, cwd=workdir)
    line = one_error(done, command[0], "/dev/full", FULL)
    assert "run.evlog" not in line
    assert kept in done.stdout


MISSING_DIRECTORY = {
    "bench --json": (["bench", "noop", "--duration", "0.2", "--json", "missing/x.json"],
                     "missing/x.json"),
    "bench --html": (["bench", "noop", "--duration", "0.2", "--html", "missing/x.html"],
                     "missing/x.html"),
    "bench --plot": (["bench", "noop", "--duration", "0.2", "--plot", "missing/x.png"],
                     "missing/x.png"),
    "report -o": (["report", "run.evlog", "-o", "missing/x.html"], "missing/x.html"),
    "convert under a file": (["convert", "run.evlog", "run.evlog/x.jsonl"], "run.evlog/x.jsonl"),
    "demo --summary under a file": (["demo", "--steps", "10", "--step-time", "0.001", "--out",
                                     "d", "--summary", "run.evlog/s.json"], "run.evlog/s.json"),
    "demo --summary a directory": (["demo", "--steps", "10", "--step-time", "0.001", "--out",
                                    "d", "--summary", "."], "."),
}  # fmt: skip


@pytest.mark.parametrize(("command", "output"), MISSING_DIRECTORY.values(), ids=MISSING_DIRECTORY)
def test_an_output_nowhere_is_refused_before_the_work(
    workdir: Path, command: list[str], output: str
) -> None:
    """``eventbus bench ... --json missing/x.json`` ran the whole bench, then died."""
    if "--plot" in command and not has_matplotlib():
        pytest.skip("--plot needs matplotlib")
    before = sorted(p.name for p in workdir.iterdir())
    done = cli(*command, cwd=workdir)
    line = one_error(done, command[0], f"{output}: ")
    assert "Traceback" not in line
    assert done.stdout == b""  # before any work: nothing printed, no demo run
    assert sorted(p.name for p in workdir.iterdir()) == before


def test_demo_summary_and_convert_make_their_directories(workdir: Path) -> None:
    """What did and does: the directories of the summary and of a converted log are made."""
    done = cli(
        "demo", "--steps", "10", "--step-time", "0.001", "--out", "d", "--no-log",
        "--summary", "missing/dir/s.json", cwd=workdir,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert (workdir / "missing" / "dir" / "s.json").read_text().startswith("{")
    converted = cli("convert", "run.evlog", "new/dir/run.jsonl", cwd=workdir)
    assert converted.returncode == 0, converted.stderr
    assert len(read_log(workdir / "new" / "dir" / "run.jsonl").events) == 8


NOT_UTF8 = os.fsdecode(b"\xff-run")


def test_a_log_name_that_is_not_utf8(workdir: Path) -> None:
    """Linux names are bytes: ``eventbus report`` on ``b'\\xff-run.evlog'`` failed to
    encode its page (a traceback); ``stats`` and ``convert`` to print the name."""
    os.rename(workdir / "run.evlog", workdir / f"{NOT_UTF8}.evlog")
    name = b"\xff-run"

    report = cli("report", f"{NOT_UTF8}.evlog", cwd=workdir)
    assert report.returncode == 0, report.stderr
    assert report.stdout.startswith(b"report written to \xff-run.html (")
    page = (workdir / f"{NOT_UTF8}.html").read_bytes().decode("utf-8")  # valid UTF-8
    assert "\\xff-run.evlog" in page

    stats = cli("stats", f"{NOT_UTF8}.evlog", cwd=workdir)
    assert stats.returncode == 0, stats.stderr
    assert stats.stdout.startswith(b"log:       " + name + b".evlog (run demo")

    convert = cli("convert", f"{NOT_UTF8}.evlog", f"{NOT_UTF8}.jsonl", cwd=workdir)
    assert convert.returncode == 0, convert.stderr
    assert convert.stdout == name + b".jsonl: 8 events (jsonl)\n"

    missing = cli("report", f"{NOT_UTF8}.evlog", "-o", f"{NOT_UTF8}/x.html", cwd=workdir)
    # stderr escapes what is not UTF-8 as Python does (backslashreplace).
    one_error(missing, "report", "\\udcff-run/x.html", "no such directory")
