"""Logs that can be read only once: pipes, FIFOs, ``/dev/stdin`` (issue item 9).

``LogReader`` reads a stream as it reads a file, in both encodings, its reads
bounded by what a record may be (a stream has no size to bound them by). The
commands that read a log more than once copy a stream to a temporary file
first, so ``cat LOG | eventbus stats /dev/stdin`` works and names
``/dev/stdin`` in what it says.
"""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
import threading
import tracemalloc
from collections.abc import Iterator
from pathlib import Path

import pytest
from _builders import sample_event

from eventbus import Event, RunResumed, WorkerFailure
from eventbus._events import RunPosition
from eventbus.log import LogReader, read_log
from eventbus.testing import report_rounds, write_log

FORMATS = ["run.evlog", "run.jsonl"]
CLI = [sys.executable, "-m", "adapters.cli"]


def events(rounds: int = 3) -> list[Event]:
    return [
        *report_rounds(rounds, world_size=2),
        sample_event(WorkerFailure, rank=1, message="CUDA out of memory"),
    ]


def resumed_events() -> list[Event]:
    """Two rounds, a failure, a resume from round 0's checkpoint (rolls back 3 events)."""
    position = RunPosition(
        checkpoint="ckpt-0", rounds=1, next_index=(1, 1), world_size=2, checkpoint_seq=2
    )
    return [
        *report_rounds(2, world_size=2),  # seq 0..3
        sample_event(WorkerFailure, rank=1, message="killed"),  # seq 4
        RunResumed(run_id="run", checkpoint="ckpt-0", position=position),  # seq 5
        *report_rounds([1], world_size=2),
    ]


@pytest.fixture
def pipe_path() -> Iterator[tuple[str, int]]:
    """An empty pipe: the path that opens its read end (``/dev/fd/N``) and its write end."""
    read_end, write_end = os.pipe()
    yield f"/dev/fd/{read_end}", write_end
    os.close(read_end)


def feed(write_end: int, data: bytes) -> threading.Thread:
    """Write ``data`` into a pipe from a thread (more than its buffer holds), then close it."""

    def run() -> None:
        try:
            with open(write_end, "wb") as stream:
                stream.write(data)
        except BrokenPipeError:  # the reader stopped early: its error is the test's
            pass

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


# --- the reader --------------------------------------------------------------------------


@pytest.mark.parametrize("name", FORMATS)
@pytest.mark.parametrize("chunk_size", [7, 1 << 20])
def test_the_reader_reads_a_pipe(
    tmp_path: Path, pipe_path: tuple[str, int], name: str, chunk_size: int
) -> None:
    """msgpack from a pipe failed with "truncated log header": its reads were sized by
    ``fstat``, which says 0 for a pipe. More than a pipe's buffer, so it is read
    as it comes."""
    log = write_log(tmp_path / name, events(2000))
    path, write_end = pipe_path
    writer = feed(write_end, log.read_bytes())
    with LogReader(path, chunk_size=chunk_size) as reader:
        got = list(reader)
    writer.join(timeout=30)
    assert got == read_log(log).events
    assert (reader.truncated, reader.skipped, reader.count) == (None, 0, 4001)


@pytest.mark.parametrize("name", FORMATS)
def test_the_reader_reads_a_fifo(tmp_path: Path, name: str) -> None:
    log = write_log(tmp_path / name, events(500))
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    writer = feed(os.open(fifo, os.O_RDWR), log.read_bytes())  # O_RDWR: opens at once
    with LogReader(fifo) as reader:
        assert reader.format == ("jsonl" if name.endswith("jsonl") else "msgpack")
        got = list(reader)
    writer.join(timeout=30)
    assert got == read_log(log).events


@pytest.mark.parametrize("name", FORMATS)
def test_a_torn_stream_is_reported_as_a_file_is(
    tmp_path: Path, pipe_path: tuple[str, int], name: str
) -> None:
    data = write_log(tmp_path / name, events()).read_bytes()[:-5]
    torn = tmp_path / f"torn-{name}"
    torn.write_bytes(data)
    path, write_end = pipe_path
    writer = feed(write_end, data)
    contents = read_log(path)
    writer.join(timeout=30)
    assert contents.events == read_log(torn).events
    assert contents.truncated == read_log(torn).truncated is not None


def test_a_damaged_length_on_a_stream_does_not_allocate_what_it_claims(
    tmp_path: Path, pipe_path: tuple[str, int]
) -> None:
    """A stream has no size to bound a read by: a record claims at most ``MAX_RECORD``
    (64 MiB) bytes, a longer length is damage, never read. Here record 0 claims 3 GiB
    (its length check holds)."""
    log = write_log(tmp_path / "run.evlog", events())
    data = bytearray(log.read_bytes())
    meta = struct.unpack_from("<I", data, 12)[0]
    claim = 3 << 30
    struct.pack_into("<HI", data, 16 + meta + 2, (claim ^ claim >> 16) & 0xFFFF, claim)
    path, write_end = pipe_path
    writer = feed(write_end, bytes(data))
    tracemalloc.start()
    try:
        with pytest.raises(ValueError, match="length 3221225472 is over the 64 MiB limit"):
            read_log(path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    writer.join(timeout=30)
    assert peak < 16 << 20, peak


# --- the command line ----------------------------------------------------------------------


def piped(
    log: Path, *args: str | Path, cwd: Path | None = None, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """``cat LOG | eventbus ARGS`` (``/dev/stdin`` in ``args`` is the pipe)."""
    with log.open("rb") as source:
        cat = subprocess.Popen(["cat"], stdin=source, stdout=subprocess.PIPE)
        assert cat.stdout is not None
        try:
            return subprocess.run(
                [*CLI, *map(str, args)],
                stdin=cat.stdout,
                capture_output=True,
                text=True,
                cwd=cwd,
                env=env,
                check=False,
                timeout=120,
            )
        finally:
            cat.stdout.close()
            cat.wait(timeout=30)


@pytest.fixture
def tmpdir_env(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    """A TMPDIR of its own, to see that a spooled copy is gone afterwards."""
    spool = tmp_path / "spool"
    spool.mkdir()
    return spool, {**os.environ, "TMPDIR": str(spool)}


@pytest.mark.parametrize("name", FORMATS)
def test_stats_of_a_shell_pipe(tmp_path: Path, name: str) -> None:
    """Exactly what a user types: ``cat LOG | eventbus stats /dev/stdin``."""
    log = write_log(tmp_path / name, resumed_events())
    eventbus = Path(sys.executable).with_name("eventbus")
    done = subprocess.run(
        f"cat {log} | {eventbus} stats --json /dev/stdin",
        shell=True,
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    figures = json.loads(done.stdout)
    assert (figures["events"], figures["rolled_back"], len(figures["resumes"])) == (8, 3, 1)


@pytest.mark.parametrize("name", FORMATS)
def test_every_log_command_reads_a_pipe(
    tmp_path: Path, tmpdir_env: tuple[Path, dict[str, str]], name: str
) -> None:
    log = write_log(tmp_path / name, resumed_events())
    spool, env = tmpdir_env
    stats = piped(log, "stats", "/dev/stdin", env=env)
    assert stats.returncode == 0, stats.stderr
    assert "log:       /dev/stdin" in stats.stdout
    assert "resumes:   1; 3 event(s) rolled back" in stats.stdout

    show = piped(log, "show", "/dev/stdin", env=env)
    assert show.returncode == 0, show.stderr
    assert show.stdout.count("(rolled back)") == 3 and len(show.stdout.splitlines()) == 9

    (tmp_path / "my_callbacks.py").write_text("def count(event):\n    pass\n")
    replay = piped(
        log, "replay", "/dev/stdin", "--callbacks", "my_callbacks:count", cwd=tmp_path, env=env
    )
    assert replay.returncode == 0, replay.stderr
    assert "replayed 5 events" in replay.stdout and "3 rolled back skipped" in replay.stdout

    page = tmp_path / "page.html"
    report = piped(log, "report", "/dev/stdin", "-o", page, env=env)
    assert report.returncode == 0, report.stderr
    assert "/dev/stdin" in page.read_text() and str(spool) not in page.read_text()

    out = tmp_path / "copy.jsonl"
    convert = piped(log, "convert", "/dev/stdin", out, env=env)
    assert convert.returncode == 0, convert.stderr
    assert read_log(out).events == read_log(log).events

    bench = piped(log, "bench", "noop", "--log", "/dev/stdin", "--repeat", "1", env=env)
    assert bench.returncode == 0, bench.stderr
    assert bench.stdout.startswith("8 events")
    assert list(spool.iterdir()) == []  # every copy deleted


@pytest.mark.parametrize("command", ["stats", "show", "report", "replay"])
def test_a_damaged_pipe_is_named_as_given(
    tmp_path: Path, tmpdir_env: tuple[Path, dict[str, str]], command: str
) -> None:
    """The error names ``/dev/stdin``, not the temporary copy read in its place."""
    torn = tmp_path / "torn.evlog"
    torn.write_bytes(write_log(tmp_path / "run.evlog", events()).read_bytes()[:-5])
    spool, env = tmpdir_env
    (tmp_path / "my_callbacks.py").write_text("def count(event):\n    pass\n")
    extra = {
        "report": ["-o", str(tmp_path / "page.html")],
        "replay": ["--callbacks", "my_callbacks:count"],
    }.get(command, [])
    done = piped(torn, command, "/dev/stdin", *extra, cwd=tmp_path, env=env)
    (line,) = done.stderr.splitlines()
    damage = "cut short at byte" if command == "report" else "truncated at byte"
    assert "/dev/stdin" in line and damage in line, line
    assert str(spool) not in done.stderr and "Traceback" not in done.stderr
    assert done.returncode == (0 if command == "report" else 2)  # a report shows the rest
    if command == "report":
        page = (tmp_path / "page.html").read_text()
        assert "This log is damaged" in page and str(spool) not in page
    assert list(spool.iterdir()) == []


def test_not_a_log_on_a_pipe_is_one_line(tmp_path: Path) -> None:
    notes = tmp_path / "notes.txt"
    notes.write_text("just some text\n")
    done = piped(notes, "stats", "/dev/stdin")
    assert done.returncode == 2
    assert done.stderr == (
        "eventbus stats: error: /dev/stdin: not an event log (starts with b'just som', "
        "expected b'\\x89EVB\\r\\n\\x1a\\n' or a JSON Lines header)\n"
    )


def test_a_report_of_a_pipe_needs_an_output(tmp_path: Path) -> None:
    """Beside the log is no place for a pipe's page (``/dev/stdin.html``)."""
    log = write_log(tmp_path / "run.evlog", events())
    done = piped(log, "report", "/dev/stdin")
    assert done.returncode == 2
    (line,) = done.stderr.splitlines()
    assert line.startswith("eventbus report: error: /dev/stdin: ") and "-o FILE.html" in line
    assert not Path("/dev/stdin.html").exists()
