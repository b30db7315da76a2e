"""A stream without a valid header is refused at the header, at once (issue 40, item 5).

``eventbus show /dev/zero`` never returned: the commands that read a log twice copied
a stream whole before its header was looked at, and ``/dev/zero`` has no end. Every
reader now reads a header no further than it may reach (the first bytes that rule it
out; a JSON Lines header line up to 1 MiB) and refuses what is no log in one line naming
the file and what was expected. Each run here is a subprocess bounded by a timeout, so a
reader that reads on fails the test instead of hanging it.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from eventbus.log._format import LOG_MAGIC

CLI = [sys.executable, "-m", "adapters.cli"]
#: A reader that refuses at the header returns in well under a second; this only bounds
#: one that reads on (``/dev/zero`` has no end).
BOUND_S = 20
NOT_A_LOG = "not an event log (starts with {start}, expected {magic} or a JSON Lines header)"

#: Each command that reads a log, with what it needs besides the log.
COMMANDS = {
    "show": ["show", "{log}"],
    "stats": ["stats", "{log}"],
    "replay": ["replay", "{log}", "--callbacks", "json:dumps"],
    "report": ["report", "{log}", "-o", "{out}/page.html"],
    "convert": ["convert", "{log}", "{out}/copy.jsonl"],
    "bench": ["bench", "noop", "--log", "{log}"],
}
#: What the library's reader does, on its own.
READER = [
    sys.executable,
    "-c",
    "import sys\n"
    "from eventbus.log import LogReader\n"
    "from eventbus.log._format import LogFormatError\n"
    "try:\n"
    "    LogReader(sys.argv[1])\n"
    "except LogFormatError as exc:\n"
    "    sys.exit(str(exc))\n",
    "{log}",
]


def run(argv: list[str], log: str | Path, out: Path) -> subprocess.CompletedProcess[str]:
    """``argv`` with the log and an output folder filled in, its own TMPDIR (to see that
    no copy of a stream is left), at most ``BOUND_S`` seconds."""
    spool = out / "spool"
    spool.mkdir(exist_ok=True)
    args = [a.format(log=log, out=out) for a in argv]
    done = subprocess.run(
        args,
        capture_output=True,
        text=True,
        timeout=BOUND_S,
        check=False,
        env={**os.environ, "TMPDIR": str(spool)},
    )
    assert list(spool.iterdir()) == []
    return done


def one_line(done: subprocess.CompletedProcess[str]) -> str:
    """The one line a refusal says (no traceback), its exit code not 0."""
    assert done.returncode != 0, done
    assert "Traceback" not in done.stderr, done.stderr
    (line,) = done.stderr.splitlines()
    return line


@pytest.fixture
def out(tmp_path: Path) -> Path:
    return tmp_path


@pytest.mark.parametrize("command", [*COMMANDS, "reader"])
@pytest.mark.parametrize("device", ["/dev/zero", "/dev/urandom"])
def test_an_endless_device_is_refused_at_its_first_bytes(
    out: Path, command: str, device: str
) -> None:
    argv = READER if command == "reader" else [*CLI, *COMMANDS[command]]
    line = one_line(run(argv, device, out))
    prefix = "" if command == "reader" else f"eventbus {command}: error: "
    if device == "/dev/zero":
        assert line == prefix + f"{device}: " + NOT_A_LOG.format(
            start=repr(bytes(8)), magic=repr(LOG_MAGIC)
        )
    else:  # random bytes start like a JSON header (`{"`) once in 65,536 runs: refused later
        assert line.startswith(f"{prefix}{device}: "), line
        assert "not an event log (starts with b" in line or "not an event-log header" in line
    assert not (out / "page.html").exists() and not (out / "copy.jsonl").exists()


class Writer:
    """The write end of a FIFO, held open for the whole test (a writer that never closes):
    it sends ``data`` from a thread, a piece at a time as the FIFO takes it, then waits."""

    def __init__(self, fifo: Path, data: bytes) -> None:
        # Read and write, so that opening does not wait for a reader; never blocking, so
        # that the thread can stop whenever the test ends, however much is left unsent.
        self.fd = os.open(fifo, os.O_RDWR | os.O_NONBLOCK)
        self.data = data
        self.sent = 0
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._send, daemon=True)
        self.thread.start()

    def _send(self) -> None:
        view = memoryview(self.data)
        while self.sent < len(self.data) and not self.done.wait(0.001):
            try:
                self.sent += os.write(self.fd, view[self.sent : self.sent + 65536])
            except BlockingIOError:
                continue

    def close(self) -> None:
        self.done.set()
        self.thread.join(timeout=BOUND_S)
        os.close(self.fd)


@pytest.fixture
def fifo(tmp_path: Path) -> Path:
    path = tmp_path / "log.fifo"
    os.mkfifo(path)
    return path


@pytest.fixture
def writer(fifo: Path, request: pytest.FixtureRequest) -> Iterator[Writer]:
    sender = Writer(fifo, request.param)
    yield sender
    sender.close()


GARBAGE = {
    # Fewer bytes than a msgpack header's prefix: refused without waiting for more.
    "text": b"garbage",
    "a JSON value, not an object": b"[1, 2, 3]\n",
    "not a JSON object's first key": b"{garbage}",
    "the magic, then garbage": LOG_MAGIC[:4] + b"junk",
}


@pytest.mark.parametrize("command", ["show", "stats", "reader"])
@pytest.mark.parametrize("writer", GARBAGE.values(), ids=GARBAGE.keys(), indirect=True)
def test_a_fifo_whose_writer_sends_garbage_and_never_closes_is_refused(
    out: Path, fifo: Path, writer: Writer, command: str
) -> None:
    argv = READER if command == "reader" else [*CLI, *COMMANDS[command]]
    line = one_line(run(argv, fifo, out))
    start = writer.data[:8]
    assert line.endswith(
        f"{fifo}: " + NOT_A_LOG.format(start=repr(start), magic=repr(LOG_MAGIC))
    ), line


#: A JSON Lines header line that never ends (2 MiB, no newline): read to 1 MiB, no further.
ENDLESS_LINE = b'{"eventbus_log": 2, "run_id": "' + b"r" * (2 << 20)


@pytest.mark.parametrize("command", ["show", "stats", "reader"])
@pytest.mark.parametrize("writer", [ENDLESS_LINE], ids=["2 MiB line"], indirect=True)
def test_a_first_json_line_without_an_end_is_refused_after_a_bounded_prefix(
    out: Path, fifo: Path, writer: Writer, command: str
) -> None:
    argv = READER if command == "reader" else [*CLI, *COMMANDS[command]]
    line = one_line(run(argv, fifo, out))
    assert line.endswith(
        f"{fifo}: first line is not an event-log header (longer than 1 MiB, expected a "
        "JSON object with an 'eventbus_log' key on a line of at most that)"
    ), line
    # The reader stopped where the header's bound is: the writer could not send it all.
    assert writer.sent < len(ENDLESS_LINE)


@pytest.mark.parametrize("command", ["show", "reader"])
def test_a_file_whose_first_json_line_is_huge_is_refused(
    out: Path, tmp_path: Path, command: str
) -> None:
    log = tmp_path / "huge.jsonl"
    log.write_bytes(ENDLESS_LINE + b'"}\n')
    argv = READER if command == "reader" else [*CLI, *COMMANDS[command]]
    line = one_line(run(argv, log, out))
    assert line.endswith(
        f"{log}: first line is not an event-log header (longer than 1 MiB, "
        "expected a JSON object with an 'eventbus_log' key on a line of at "
        "most that)"
    ), line
