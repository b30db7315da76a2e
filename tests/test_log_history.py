"""One history per run across resumes: appending to a log, and what its resumes rolled back."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest
from _builders import eventbus as run_cli
from hypothesis import given, settings
from hypothesis import strategies as st
from structlog.testing import capture_logs

from eventbus import (
    BudgetReport,
    CheckpointSaved,
    Event,
    EventBus,
    HealthCheckTick,
    Report,
    RunFinished,
    RunResumed,
    RunStarted,
    WorkerFailure,
)
from eventbus._events import RunPosition
from eventbus.log import LogError, LogRecorder, _history, read_log, replay_file
from eventbus.log._format import LogFormatError
from eventbus.log._history import LogTail, rollbacks
from eventbus.log._recorder import RunIdMismatch
from eventbus.log._replay import BUS_DIAGNOSTICS

RUN = "run-1"
START = 100.0
FORMATS = ["run.evlog", "run.jsonl"]


def at(seq: int) -> float:
    """Recorded times: 0.0 would mean "not stamped yet"."""
    return START + seq


def report(seq: int, rank: int, index: int, *, time: float | None = None) -> Report:
    return Report(
        run_id=RUN,
        rank=rank,
        world_size=2,
        index=index,
        metrics={"loss": 1.0 / (index + 1)},
        seq=seq,
        time=at(seq) if time is None else time,
    )


def started(seq: int) -> RunStarted:
    return RunStarted(run_id=RUN, name="demo", world_size=2, seq=seq, time=at(seq))


def saved(seq: int, index: int) -> CheckpointSaved:
    return CheckpointSaved(
        run_id=RUN, checkpoint=f"ckpt-{index}", index=index, seq=seq, time=at(seq)
    )


def failure(seq: int) -> WorkerFailure:
    return WorkerFailure(
        run_id=RUN, rank=1, error_type="Killed", message="SIGKILL", seq=seq, time=at(seq)
    )


def resumed(
    seq: int, *, next_index: tuple[int, ...], checkpoint_seq: int, rounds: int = 1
) -> RunResumed:
    position = RunPosition(
        checkpoint=f"ckpt-{rounds - 1}",
        rounds=rounds,
        next_index=next_index,
        world_size=len(next_index),
        checkpoint_seq=checkpoint_seq,
    )
    return RunResumed(
        run_id=RUN, checkpoint=position.checkpoint, position=position, seq=seq, time=at(seq)
    )


def write(path: Path, events: list[Event], **options: Any) -> LogRecorder:
    recorder = LogRecorder(path, run_id=options.pop("run_id", RUN), created=1.0, **options)
    recorder.write_many(events)
    recorder.close()
    return recorder


# Before the crash: round 0 gathered and checkpointed (seq 3), round 1 reported, a
# failure; killed. The resumed run redoes round 1 from the checkpoint.
BEFORE: list[Event] = [
    started(0),
    report(1, 0, 0),
    report(2, 1, 0),
    saved(3, 0),
    report(4, 0, 1),
    report(5, 1, 1),
    failure(6),
]
AFTER: list[Event] = [
    started(7),
    resumed(8, next_index=(1, 1), checkpoint_seq=3),
    report(9, 0, 1),
    report(10, 1, 1),
    RunFinished(run_id=RUN, status="finished", seq=11, time=at(11)),
]


# --- appending -------------------------------------------------------------------------


@pytest.mark.parametrize("name", FORMATS)
def test_append_continues_the_log_and_reads_back_as_one(tmp_path: Path, name: str) -> None:
    log = tmp_path / name
    write(log, BEFORE)
    header = read_log(log).header
    size = log.stat().st_size
    recorder = write(log, AFTER, append=True)
    assert recorder.appended == LogTail(events=7, last_seq=6, last_time=at(6))
    assert recorder.header == header  # the file's own header, not a second one
    contents = read_log(log)
    assert contents.events == [*BEFORE, *AFTER]
    assert (contents.header, contents.truncated, contents.skipped) == (header, None, 0)
    assert log.read_bytes().count(b"eventbus_log" if name.endswith("jsonl") else b"\x89EVB") == 1
    assert log.stat().st_size > size


@pytest.mark.parametrize("name", FORMATS)
def test_append_to_a_missing_or_empty_file_makes_a_new_log(tmp_path: Path, name: str) -> None:
    missing = tmp_path / "new" / name
    assert write(missing, BEFORE, append=True).appended is None
    empty = tmp_path / name
    empty.touch()
    assert write(empty, BEFORE, append=True).appended is None
    for path in (missing, empty):
        assert read_log(path).events == BEFORE
        assert read_log(path).header.run_id == RUN


def test_without_append_the_file_is_replaced(tmp_path: Path) -> None:
    log = tmp_path / "run.evlog"
    write(log, BEFORE)
    recorder = write(log, AFTER)
    assert recorder.appended is None
    assert read_log(log).events == AFTER


def test_appended_figures(tmp_path: Path) -> None:
    log = tmp_path / "run.evlog"
    tick = HealthCheckTick(period=4, start=0.0, end=1.0, seq=9, time=9.5)
    budget = BudgetReport(
        period=5, start=1.0, end=2.0, budget=0.1, total=0.0, fraction=0.0, seq=7, time=9.7
    )
    write(log, [report(3, 0, 0), tick, budget, report(8, 1, 0, time=9.9)])
    recorder = write(log, [], append=True)
    assert recorder.appended == LogTail(
        events=4, last_seq=9, last_time=9.9, last_period=5, period_end=2.0
    )
    # A log with only its header: nothing found, but still appended to.
    bare = tmp_path / "bare.jsonl"
    write(bare, [])
    recorder = write(bare, [report(0, 0, 0)], append=True, run_id="")
    assert recorder.appended == LogTail()
    assert recorder.header.run_id == RUN  # an empty run id takes the file's
    assert read_log(bare).events == [report(0, 0, 0)]


@pytest.mark.parametrize("name", FORMATS)
def test_a_torn_last_record_is_cut_off_before_appending(tmp_path: Path, name: str) -> None:
    log, intact = tmp_path / name, tmp_path / f"intact-{name}"
    write(log, BEFORE)
    write(intact, BEFORE[:-1])
    torn_size = log.stat().st_size - 5  # the failure record, cut short by the crash
    log.write_bytes(log.read_bytes()[:torn_size])
    assert read_log(log).truncated is not None
    with capture_logs() as logs:
        recorder = write(log, AFTER, append=True)
    dropped = torn_size - intact.stat().st_size
    assert recorder.appended is not None
    assert recorder.appended.dropped_bytes == dropped > 0
    assert (recorder.appended.events, recorder.appended.last_seq) == (6, 5)
    (warning,) = [entry for entry in logs if entry["log_level"] == "warning"]
    assert (warning["path"], warning["dropped_bytes"]) == (str(log), dropped)
    contents = read_log(log)
    assert contents.truncated is None and contents.skipped == 0
    assert contents.events == [*BEFORE[:-1], *AFTER]


def test_a_jsonl_last_line_without_its_newline_is_kept(tmp_path: Path) -> None:
    log = tmp_path / "run.jsonl"
    write(log, BEFORE)
    log.write_bytes(log.read_bytes().removesuffix(b"\n"))
    recorder = write(log, AFTER, append=True)
    assert recorder.appended is not None and recorder.appended.dropped_bytes == 0
    assert read_log(log).events == [*BEFORE, *AFTER]


def test_corrupt_records_are_skipped_by_the_scan_and_stay(tmp_path: Path) -> None:
    log = tmp_path / "run.evlog"
    write(log, BEFORE)
    data = bytearray(log.read_bytes())
    data[-20] ^= 0xFF  # inside the last record's payload: a checksum mismatch
    log.write_bytes(bytes(data))
    recorder = write(log, AFTER, append=True)
    assert recorder.appended == LogTail(events=6, last_seq=5, last_time=at(5), skipped=1)
    contents = read_log(log, skip_corrupt=True)
    assert contents.events == [*BEFORE[:-1], *AFTER] and contents.skipped == 1


@pytest.mark.parametrize("name", FORMATS)
def test_another_runs_log_is_refused_untouched(tmp_path: Path, name: str) -> None:
    log = tmp_path / name
    write(log, BEFORE)
    before = log.read_bytes()
    with pytest.raises(RunIdMismatch) as caught:
        LogRecorder(log, run_id="run-2", append=True)
    assert isinstance(caught.value, ValueError)
    assert str(log) in str(caught.value)
    assert "'run-1'" in str(caught.value) and "'run-2'" in str(caught.value)
    assert log.read_bytes() == before


@pytest.mark.parametrize(
    "content", [b"just some text\n", b"\x89EVB\r\n", b'{"not": "a log"}\n', b"\x00" * 100]
)
def test_a_file_that_is_not_a_log_is_refused_untouched(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "notes.evlog"
    path.write_bytes(content)
    with pytest.raises(LogFormatError, match="cannot append") as caught:
        LogRecorder(path, run_id=RUN, append=True)
    assert str(path) in str(caught.value)
    assert path.read_bytes() == content


def test_a_format_that_is_not_the_files_is_refused_untouched(tmp_path: Path) -> None:
    log = tmp_path / "run.log"
    write(log, BEFORE, format="jsonl")
    before = log.read_bytes()
    with pytest.raises(ValueError, match="msgpack records to a jsonl log"):
        LogRecorder(log, run_id=RUN, format="msgpack", append=True)
    assert log.read_bytes() == before
    recorder = write(log, AFTER, append=True)  # no format given: the file's
    assert recorder.format == "jsonl"
    assert read_log(log).events == [*BEFORE, *AFTER]


# --- rollbacks ---------------------------------------------------------------------------


def rolled_back(path: Path) -> list[int]:
    plan = rollbacks(path)
    assert plan is not None
    return [e.seq for e in read_log(path).events if plan.is_rolled_back(e)]


@pytest.mark.parametrize("name", FORMATS)
def test_a_log_without_a_resume_has_no_rollbacks(tmp_path: Path, name: str) -> None:
    log = tmp_path / name
    write(log, [*BEFORE, *AFTER[2:]])
    assert b"RunResumed" in log.read_bytes()  # the header names every type
    assert rollbacks(log) is None
    empty = tmp_path / f"empty-{name}"
    write(empty, [])
    assert rollbacks(empty) is None


@pytest.mark.parametrize("name", FORMATS)
def test_reports_ahead_and_events_after_the_checkpoint_are_rolled_back(
    tmp_path: Path, name: str
) -> None:
    log = tmp_path / name
    write(log, BEFORE)
    write(log, AFTER, append=True)
    plan = rollbacks(log)
    assert plan is not None
    assert [r.seq for r in plan.resumes] == [8]
    assert rolled_back(log) == [4, 5, 6]


@pytest.mark.parametrize("block", [1, 4, 9, 10, 11, 64])
def test_the_tag_is_found_across_the_search_blocks(
    tmp_path: Path, block: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The byte search reads a block at a time (so a big log costs one block of
    memory); a tag split between two blocks is still found."""
    monkeypatch.setattr(_history, "SEARCH_BLOCK", block)
    resumed_log, plain = tmp_path / "resumed.evlog", tmp_path / "plain.evlog"
    write(resumed_log, BEFORE)
    write(resumed_log, AFTER, append=True)
    write(plain, [*BEFORE, *AFTER[2:]])
    assert rollbacks(resumed_log) is not None
    assert rollbacks(plain) is None


def test_the_rule_event_by_event(tmp_path: Path) -> None:
    log = tmp_path / "run.evlog"
    events: list[Event] = [
        report(1, 0, 3),  # before the checkpoint, but ahead of next_index[0] = 2: rolled back
        report(2, 1, 0),  # behind next_index[1]
        saved(3, 1),  # the checkpoint itself
        report(4, 0, 1),  # after the checkpoint, but behind next_index[0]: kept
        report(5, 2, 9),  # a rank next_index does not know: kept
        failure(6),  # after the checkpoint: rolled back
        started(7),  # never rolled back
        resumed(8, next_index=(2, 1), checkpoint_seq=3, rounds=2),
        report(9, 0, 2),  # after the resume: never
        failure(10),
    ]
    write(log, events)
    assert rolled_back(log) == [1, 6]


def test_a_resume_without_a_checkpoint_seq_rolls_back_only_reports(tmp_path: Path) -> None:
    log = tmp_path / "run.evlog"
    write(log, [report(0, 0, 0), report(1, 0, 1), failure(2)])
    write(log, [started(3), resumed(4, next_index=(1,), checkpoint_seq=-1)], append=True)
    assert rolled_back(log) == [1]


def test_several_resumes(tmp_path: Path) -> None:
    log = tmp_path / "run.jsonl"
    write(log, [started(0), report(1, 0, 0), saved(2, 0), report(3, 0, 1), failure(4)])
    # First resume from ckpt-0: report 1 (seq 3) and the failure are rolled back.
    write(
        log,
        [started(5), resumed(6, next_index=(1,), checkpoint_seq=2), report(7, 0, 1), saved(8, 1)],
        append=True,
    )
    write(log, [report(9, 0, 2), failure(10)], append=True)
    # Second resume from ckpt-1 (seq 8): report 2 (seq 9) and the failure after it.
    write(
        log,
        [
            started(11),
            resumed(12, next_index=(2,), checkpoint_seq=8, rounds=2),
            report(13, 0, 2),
        ],
        append=True,
    )
    plan = rollbacks(log)
    assert plan is not None and [r.seq for r in plan.resumes] == [6, 12]
    assert rolled_back(log) == [3, 4, 9, 10]
    assert len(read_log(log).events) == 14


# --- replay ------------------------------------------------------------------------------


@pytest.mark.anyio
@pytest.mark.parametrize("name", FORMATS)
async def test_replay_leaves_rolled_back_events_out(tmp_path: Path, name: str) -> None:
    log = tmp_path / name
    write(log, BEFORE)
    write(log, AFTER, append=True)
    got: list[Event] = []

    def setup(bus: EventBus) -> None:
        bus.subscribe(Event, got.append, name="record")

    summary = await replay_file(log, setup)
    got = [e for e in got if not isinstance(e, BUS_DIAGNOSTICS)]  # the replay bus's own
    kept = [e for e in [*BEFORE, *AFTER] if e.seq not in (4, 5, 6)]
    assert [(type(e), e.time) for e in got] == [(type(e), e.time) for e in kept]
    assert [(e.rank, e.index) for e in got if isinstance(e, Report)] == [
        (0, 0),
        (1, 0),
        (0, 1),
        (1, 1),
    ]
    assert (summary.replayed, summary.rolled_back, summary.filtered) == (9, 3, 0)


@pytest.mark.anyio
async def test_replay_of_a_log_without_a_resume_rolls_nothing_back(tmp_path: Path) -> None:
    log = tmp_path / "run.evlog"
    write(log, BEFORE)
    got: list[Event] = []
    summary = await replay_file(log, lambda bus: bus.subscribe(Event, got.append, name="r"))
    got = [e for e in got if not isinstance(e, BUS_DIAGNOSTICS)]
    assert (summary.replayed, summary.rolled_back, len(got)) == (7, 0, 7)


# --- the command line --------------------------------------------------------------------


CLI = [sys.executable, "-m", "adapters.cli"]


def cli(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*CLI, *map(str, args)],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )


@pytest.fixture
def resumed_log(tmp_path: Path) -> Path:
    log = tmp_path / "run.evlog"
    write(log, BEFORE)
    write(log, AFTER, append=True)
    return log


def test_show_marks_rolled_back_events(resumed_log: Path) -> None:
    table = cli("show", resumed_log)
    assert table.returncode == 0, table.stderr
    rows = table.stdout.splitlines()[1:]
    assert len(rows) == 12
    marked = [int(row.split()[0]) for row in rows if row.endswith(" (rolled back)")]
    assert marked == [4, 5, 6]

    lines = cli("show", "--json", resumed_log).stdout.splitlines()
    objects = [json.loads(line) for line in lines]
    assert [o["seq"] for o in objects if o.get("rolled_back") is True] == [4, 5, 6]
    assert all("rolled_back" not in o for o in objects if o["seq"] not in (4, 5, 6))
    assert objects[4] == {**msgspec.to_builtins(BEFORE[4]), "rolled_back": True}


def test_show_of_a_log_without_a_resume_is_unchanged(tmp_path: Path) -> None:
    log = tmp_path / "run.evlog"
    write(log, BEFORE)
    assert "rolled back" not in cli("show", log).stdout
    assert "rolled_back" not in cli("show", "--json", log).stdout


def test_stats_counts_rolled_back_events_and_lists_the_resumes(
    resumed_log: Path, tmp_path: Path
) -> None:
    text = cli("stats", resumed_log)
    assert text.returncode == 0, text.stderr
    assert "events:    12" in text.stdout
    assert "resumes:   1; 3 event(s) rolled back" in text.stdout
    assert "  seq 8: from checkpoint ckpt-0 (saved at seq 3; 1 round(s) kept)" in text.stdout
    figures = json.loads(cli("stats", "--json", resumed_log).stdout)
    assert figures["rolled_back"] == 3
    assert figures["resumes"] == [
        {"seq": 8, "time": at(8), "checkpoint": "ckpt-0", "checkpoint_seq": 3, "rounds": 1}
    ]
    plain = tmp_path / "plain.evlog"
    write(plain, BEFORE)
    assert "resumes" not in cli("stats", plain).stdout
    assert json.loads(cli("stats", "--json", plain).stdout)["rolled_back"] == 0


def test_replay_command_says_how_many_were_rolled_back(resumed_log: Path, tmp_path: Path) -> None:
    (tmp_path / "my_callbacks.py").write_text("def count(event):\n    pass\n")
    done = subprocess.run(
        [*CLI, "replay", str(resumed_log), "--callbacks", "my_callbacks:count"],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    assert "replayed 9 events" in done.stdout and "3 rolled back skipped" in done.stdout


# --- every pass is linear, whatever the resumes say ----------------------------------


def reference_rolled_back(resumes: list[RunResumed], event: Event) -> bool:
    """The rule of ``Rollbacks`` read literally: every resume asked about every event."""
    if isinstance(event, RunResumed | RunStarted):
        return False
    for r in resumes:
        checkpoint_seq, next_index = r.position.checkpoint_seq, r.position.next_index
        if event.seq >= r.seq:
            continue
        if isinstance(event, Report):
            if not 0 <= event.rank < len(next_index):
                continue
            first = next_index[event.rank]
            if (event.index >= first) if first >= 0 else (0 <= checkpoint_seq < event.seq):
                return True
        elif 0 <= checkpoint_seq < event.seq:
            return True
    return False


SEQS = st.integers(min_value=-1, max_value=10)  # few values: spans that touch, seqs at edges
RESUMES = st.lists(
    st.builds(
        lambda seq, next_index, checkpoint_seq: resumed(
            seq, next_index=next_index, checkpoint_seq=checkpoint_seq
        ),
        SEQS,
        st.lists(st.integers(min_value=-2, max_value=6), max_size=4).map(tuple),
        SEQS,
    ),
    max_size=8,
)
EVENTS = st.lists(
    st.one_of(
        st.builds(
            lambda seq, rank, index: Report(
                run_id=RUN, rank=rank, world_size=4, index=index, metrics={}, seq=seq, time=1.0
            ),
            SEQS,
            st.integers(min_value=-1, max_value=4),
            st.integers(min_value=0, max_value=7),
        ),
        st.builds(failure, SEQS),
        st.builds(saved, SEQS, st.just(0)),
        st.builds(started, SEQS),
        st.builds(lambda seq: resumed(seq, next_index=(0,), checkpoint_seq=0), SEQS),
    ),
    max_size=40,
)


@settings(max_examples=400, deadline=None, derandomize=True)
@given(resumes=RESUMES, events=EVENTS)
def test_rollbacks_agree_with_the_rule_read_literally(
    resumes: list[RunResumed], events: list[Event]
) -> None:
    """Issue item 12: ``is_rolled_back`` answers from sorted spans (a bisection per
    event), not by asking every resume; it must say what every resume would say."""
    plan = _history.Rollbacks(resumes)
    for event in events:
        assert plan.is_rolled_back(event) == reference_rolled_back(resumes, event), event


def test_rollbacks_agree_with_the_rule_at_every_edge() -> None:
    """Every pair of resumes of a small world (a seq, a checkpoint, rank 0's next index)
    against every event near them: spans that touch or meet a resume's own seq, equal
    seqs, a rank not required. What random examples may not hit."""
    resumes = [
        resumed(seq, next_index=(first,), checkpoint_seq=checkpoint_seq)
        for seq in range(1, 6)
        for checkpoint_seq in range(-1, 5)
        for first in (-1, 0, 2)
    ]
    events: list[Event] = [
        *(report(seq, 0, index) for seq in range(7) for index in range(4)),
        *(failure(seq) for seq in range(7)),
    ]
    for a in resumes:
        for b in resumes:
            plan = _history.Rollbacks([a, b])
            for event in events:
                assert plan.is_rolled_back(event) == reference_rolled_back([a, b], event), (
                    a,
                    b,
                    event,
                )


#: Resumes in the hostile log: at one question per resume per event, ``stats`` took
#: over five minutes here (16,000 resumes: 12 s, quadratic); linear, seconds.
HOSTILE_RESUMES = 80_000


def hostile_log(path: Path, resumes: int) -> Path:
    """A report, a failure and a resume, ``resumes`` times. Resume ``i`` rolls back
    report ``i`` (its ``next_index``) and, for even ``i``, failure ``i`` (its checkpoint)."""

    def events() -> Iterator[Event]:
        for i in range(resumes):
            yield report(3 * i, 0, i)
            yield failure(3 * i + 1)
            yield resumed(3 * i + 2, next_index=(i,), checkpoint_seq=3 * i if i % 2 == 0 else -1)

    with LogRecorder(path, run_id=RUN, created=1.0, fsync="never") as recorder:
        recorder.write_many(events())
    return path


def test_a_log_of_80000_resumes_gets_its_stats_in_linear_time(tmp_path: Path) -> None:
    """Issue item 12: one hostile log (tens of thousands of ``RunResumed``) made
    ``eventbus stats`` quadratic. Linear, this takes a few seconds; quadratic, minutes
    (the subprocess's timeout ends it)."""
    log = hostile_log(tmp_path / "hostile.evlog", HOSTILE_RESUMES)
    started_at = time.perf_counter()
    result = run_cli("stats", "--json", log, timeout=120)
    took = time.perf_counter() - started_at
    assert result.returncode == 0, result.stderr
    figures = json.loads(result.stdout)
    assert figures["events"] == 3 * HOSTILE_RESUMES
    assert len(figures["resumes"]) == HOSTILE_RESUMES
    assert figures["rolled_back"] == HOSTILE_RESUMES + HOSTILE_RESUMES // 2
    assert took < 60, took


# --- a log that can be read only once --------------------------------------------------


def pipe_of(data: bytes) -> tuple[str, int]:
    """A pipe holding ``data`` (small: the pipe's buffer), its writer closed; the path
    that opens it (``/dev/fd/N``) and its descriptor (for the caller to close)."""
    read_end, write_end = os.pipe()
    assert len(data) < 60_000
    os.write(write_end, data)
    os.close(write_end)
    return f"/dev/fd/{read_end}", read_end


@pytest.mark.parametrize("name", FORMATS)
def test_rollbacks_of_a_pipe_is_refused_naming_it(tmp_path: Path, name: str) -> None:
    """Issue item 9: ``rollbacks`` reads a log twice (a byte search, then a decode),
    which a pipe cannot give; it says so, naming the file, and what to do."""
    log = tmp_path / name
    write(log, BEFORE)
    write(log, AFTER, append=True)
    path, fd = pipe_of(log.read_bytes())
    try:
        with pytest.raises(LogError) as caught:
            rollbacks(path)
    finally:
        os.close(fd)
    message = str(caught.value)
    assert message.startswith(f"{path}: ") and "pipe" in message and "\n" not in message
    assert message.endswith("reads a log twice: copy it to a file first")


@pytest.mark.anyio
async def test_replay_file_of_a_pipe_is_refused_naming_it(tmp_path: Path) -> None:
    log = tmp_path / "run.evlog"
    write(log, BEFORE)
    path, fd = pipe_of(log.read_bytes())
    try:
        with pytest.raises(LogError, match=f"^{path}: .*pipe"):
            await replay_file(path, lambda bus: None)
    finally:
        os.close(fd)
