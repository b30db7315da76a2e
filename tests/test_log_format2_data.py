"""Logs that format 2 wrote (``tests/data``) read as they were written, round for round.

``tests/data/format2-run.evlog`` and ``format2-run.jsonl`` were written by a real
run of the code of commit 3ec6167 (``tests/data/make_format2_logs.py``): world size
4, a 20-key config, 5 metrics per report, a NaN, a failure and restart, a resume
appended to the log. Whatever changes in the reader or the recorder, these files
must keep reading: every record, each round with its context and the metrics of
the reports it gathered, and a log written again from them reads the same.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import msgspec
import pytest

from eventbus import EventPlaceholder, Report, RoundGathered, RunStarted, TrainRunContext
from eventbus._codec import encode_msgpack
from eventbus.log import LogRecorder, read_log
from eventbus.log._history import rollbacks

DATA = Path(__file__).parent / "data"
LOGS = [DATA / "format2-run.evlog", DATA / "format2-run.jsonl"]
#: Values compared bit for bit (a NaN equals itself).
packed = msgspec.msgpack.encode


@pytest.mark.parametrize("path", LOGS, ids=lambda p: p.suffix)
def test_a_format_2_log_reads_whole(path: Path) -> None:
    contents = read_log(path)
    assert contents.header.format_version == 2 and contents.header.run_id == "format2-run"
    assert (contents.truncated, contents.skipped, contents.placeholders) == (None, 0, 0)
    types = Counter(type(e).__name__ for e in contents.events)
    assert types["RunStarted"] == types["RunFinished"] == 2
    assert types["RoundGathered"] == 20 and types["WorkerFailure"] == 1
    assert types["RunResumed"] == 1 and types["CheckpointSaved"] == 4
    assert not any(isinstance(e, EventPlaceholder) for e in contents.events)
    assert [e.seq for e in contents.events] == list(range(len(contents.events)))
    plan = rollbacks(path)
    assert plan is not None and len(plan.resumes) == 1


@pytest.mark.parametrize("path", LOGS, ids=lambda p: p.suffix)
def test_each_round_holds_its_context_and_the_metrics_its_reports_gave(path: Path) -> None:
    """A round's metrics are those of the reports it gathered (each rank's next
    report, in rank order, since the run started or its workers restarted), its
    context is the run's."""
    events = read_log(path).events
    waiting: dict[int, list[Report]] = {}
    context: TrainRunContext | None = None
    rounds = 0
    for event in events:
        if isinstance(event, RunStarted):
            context = TrainRunContext.from_started(event)
            waiting = {}
        elif type(event).__name__ == "WorkerGroupRestarted":
            waiting = {}
        elif isinstance(event, Report):
            waiting.setdefault(event.rank, []).append(event)
        elif isinstance(event, RoundGathered):
            rounds += 1
            assert context is not None
            assert packed(event.context) == packed(context)
            assert event.context.config["model"] == "llama-3-8b" and len(event.context.config) == 20
            assert event.ranks == (0, 1, 2, 3)
            gathered = [waiting[rank].pop(0) for rank in event.ranks]
            assert len({r.metrics["step"] for r in gathered}) == 1  # one step of each rank
            # Bit for bit: the NaN of one report is the NaN of its round.
            assert [packed(m) for m in event.metrics] == [packed(r.metrics) for r in gathered]
            if any(r.checkpoint for r in gathered):
                assert event.checkpoint == next(r.checkpoint for r in gathered if r.checkpoint)
    assert rounds == 20


@pytest.mark.parametrize("path", LOGS, ids=lambda p: p.suffix)
@pytest.mark.parametrize("suffix", [".evlog", ".jsonl"])
def test_a_format_2_log_written_again_reads_the_same(
    tmp_path: Path, path: Path, suffix: str
) -> None:
    """What ``eventbus convert`` does: every event, rounds included, read back as the
    old log gives it."""
    old = read_log(path)
    again = tmp_path / f"again{suffix}"
    with LogRecorder(
        again, run_id=old.header.run_id, created=old.header.created, fsync="never"
    ) as recorder:
        recorder.write_many(old.events)
    assert recorder.placeholders == 0
    new = read_log(again)
    assert new.header.run_id == old.header.run_id and new.header.created == old.header.created
    assert [encode_msgpack(e) for e in new.events] == [encode_msgpack(e) for e in old.events]
