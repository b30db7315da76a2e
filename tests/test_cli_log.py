"""``eventbus show | replay | convert | stats`` as a user runs them (subprocesses)."""

from __future__ import annotations

import json
import math
import struct
import textwrap
from pathlib import Path

import msgspec
import pytest
from _builders import eventbus as run
from _builders import sample_event

from eventbus import CheckpointSaved, Report, WorkerFailure
from eventbus._codec import encode_json, encode_msgpack
from eventbus._events import SCHEMA_VERSION
from eventbus.log import LogRecorder, read_log
from eventbus.log._format import LOG_MAGIC
from eventbus.testing import report_rounds, write_log


@pytest.fixture
def log(tmp_path: Path) -> Path:
    events = [
        *report_rounds(3, world_size=2),
        sample_event(WorkerFailure, rank=1, message="CUDA out of memory"),
        sample_event(CheckpointSaved, checkpoint="ckpt-2", index=2),
    ]
    return write_log(tmp_path / "run.evlog", events, run_id="demo", start=100.0)


def test_show_table_and_filters(log: Path) -> None:
    result = run("show", log)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].split() == ["seq", "time", "type", "rank", "summary"]
    assert len(lines) == 9
    assert lines[1].split()[:4] == ["0", "100.000000", "Report", "0"]
    assert "message=CUDA out of memory" in lines[7]

    only = run("show", log, "--type", "Report", "--rank", "1", "--from-seq", "2", "--limit", "1")
    assert [line.split()[0] for line in only.stdout.splitlines()[1:]] == ["3"]


def test_show_json_is_one_event_per_line(log: Path) -> None:
    result = run("show", log, "--json", "--type", "WorkerFailure")
    assert result.returncode == 0
    (line,) = result.stdout.splitlines()
    assert json.loads(line)["type"] == "WorkerFailure"


def test_convert_both_ways_round_trips(log: Path, tmp_path: Path) -> None:
    jsonl = tmp_path / "run.jsonl"
    back = tmp_path / "back.evlog"
    assert run("convert", log, jsonl).returncode == 0
    assert jsonl.read_text().startswith('{"eventbus_log":2')
    result = run("convert", jsonl, back)
    assert result.returncode == 0 and "8 events (msgpack)" in result.stdout
    original, again = read_log(log), read_log(back)
    assert again.events == original.events
    assert (again.header.run_id, again.header.created) == ("demo", original.header.created)
    forced = tmp_path / "forced.log"
    assert run("convert", log, forced, "--to", "jsonl").returncode == 0
    assert forced.read_bytes().startswith(b"{")
    assert run("convert", log, log).returncode == 2


def test_stats(log: Path) -> None:
    result = run("stats", log)
    assert result.returncode == 0, result.stderr
    assert "rounds:    3 complete across 2 rank(s)" in result.stdout
    figures = json.loads(run("stats", log, "--json").stdout)
    assert figures["by_type"] == {"Report": 6, "WorkerFailure": 1, "CheckpointSaved": 1}
    assert figures["by_rank"] == {"0": 3, "1": 4}
    assert figures["worker_failures"] == {"1": 1}
    assert figures["span"] == pytest.approx(0.7)


CALLBACKS = textwrap.dedent(
    """
    from eventbus import Report

    seen = []

    def count(event):
        seen.append(event)

    class Strict:
        def __call__(self, event):
            if isinstance(event, Report) and event.index == 1:
                raise RuntimeError("round 1 is bad")

    def make_counter():
        return count

    not_callable = 3
    """
)


def test_replay_against_handlers(log: Path, tmp_path: Path) -> None:
    (tmp_path / "my_callbacks.py").write_text(CALLBACKS)
    ok = run("replay", log, "--callbacks", "my_callbacks:count", "my_callbacks:make_counter",
             cwd=tmp_path)  # fmt: skip
    assert ok.returncode == 0, ok.stderr
    assert "replayed 8 events" in ok.stdout
    assert "my_callbacks:count" in ok.stdout and "my_callbacks:make_counter" in ok.stdout

    failing = run("replay", log, "--callbacks", "my_callbacks:Strict", "--type", "Report",
                  cwd=tmp_path)  # fmt: skip
    assert failing.returncode == 1
    assert "failed 2" in failing.stdout


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("my_callbacks", "expected MODULE:NAME"),
        ("nowhere_module:x", "cannot import 'nowhere_module'"),
        ("my_callbacks:missing", "has no attribute 'missing'"),
        ("my_callbacks:not_callable", "neither a handler"),
    ],
)
def test_replay_bad_callbacks(log: Path, tmp_path: Path, spec: str, message: str) -> None:
    (tmp_path / "my_callbacks.py").write_text(CALLBACKS)
    result = run("replay", log, "--callbacks", spec, cwd=tmp_path)
    assert result.returncode == 2
    assert message in result.stderr and "Traceback" not in result.stderr


def bad_files(tmp_path: Path, log: Path) -> dict[str, tuple[Path, str]]:
    truncated = tmp_path / "truncated.evlog"
    truncated.write_bytes(log.read_bytes()[:-5])
    corrupt = tmp_path / "corrupt.evlog"
    data = bytearray(log.read_bytes())
    data[-20:-10] = b"\xc1" * 10
    corrupt.write_bytes(bytes(data))
    not_log = tmp_path / "notes.txt"
    not_log.write_text("just some text\n")
    deep_jsonl = deep_log(tmp_path)
    meta = msgspec.msgpack.encode({"run_id": "v1", "created": 1.0, "writer": "train-eventbus"})
    version_1 = tmp_path / "v1.evlog"  # format 1 was never released
    version_1.write_bytes(struct.pack("<8sHHI", LOG_MAGIC, 1, SCHEMA_VERSION, len(meta)) + meta)
    return {
        "missing": (tmp_path / "absent.evlog", "no such file"),
        "truncated": (truncated, "truncated at byte"),
        "corrupt": (corrupt, "corrupt record 7 at byte"),
        "not a log": (not_log, "not an event log"),
        "directory": (tmp_path, "cannot read"),
        "format version 1": (version_1, "unsupported log format version 1"),
        "nested 100,000 deep (JSON Lines)": (deep_jsonl, "nested too deep to decode"),
    }


def report(seq: int, **metrics: object) -> Report:
    return Report(
        run_id="r", rank=0, world_size=1, index=seq, metrics=metrics, seq=seq, time=1.0 + seq
    )


def deep_log(tmp_path: Path) -> Path:
    """A JSON Lines log whose record 1 is nested 100,000 deep (a RecursionError for a
    naive reader; in msgpack, an intact record nested that deep is a placeholder)."""
    jsonl = write_log(tmp_path / "deep.jsonl", [report(0)])
    with jsonl.open("ab") as f:
        f.write(b'{"type":"Report","seq":1,"time":2.0,"metrics":{"a":' + b"[" * 100_000)
        f.write(b"]" * 100_000 + b"}}\n" + encode_json(report(2)) + b"\n")
    return jsonl


@pytest.mark.parametrize("command", ["show", "stats", "convert", "replay"])
def test_bad_files_are_one_line_errors_with_exit_code_2(
    log: Path, tmp_path: Path, command: str
) -> None:
    (tmp_path / "my_callbacks.py").write_text(CALLBACKS)
    for kind, (path, message) in bad_files(tmp_path, log).items():
        extras: dict[str, list[str | Path]] = {
            "convert": [tmp_path / "out.jsonl"],
            "replay": ["--callbacks", "my_callbacks:count"],
        }
        extra = extras.get(command, [])
        result = run(command, path, *extra, cwd=tmp_path)
        assert result.returncode == 2, (kind, result.stderr)
        assert message in result.stderr, (kind, result.stderr)
        assert len(result.stderr.strip().splitlines()) == 1, (kind, result.stderr)
        assert "Traceback" not in result.stderr


def test_truncated_show_prints_what_is_intact(log: Path, tmp_path: Path) -> None:
    truncated = tmp_path / "truncated.evlog"
    truncated.write_bytes(log.read_bytes()[:-5])
    result = run("show", truncated)
    assert result.returncode == 2
    assert len(result.stdout.splitlines()) == 8  # header line and the 7 intact events
    skipped = run("show", tmp_path / "x.evlog")
    assert skipped.returncode == 2


def test_corrupt_records_can_be_skipped(log: Path, tmp_path: Path) -> None:
    corrupt = bad_files(tmp_path, log)["corrupt"][0]
    result = run("show", corrupt, "--skip-corrupt")
    assert result.returncode == 2
    assert "skipped 1 corrupt record" in result.stderr
    assert len(result.stdout.splitlines()) == 8


def test_unknown_type_filter_is_a_user_error(log: Path) -> None:
    result = run("show", log, "--type", "Reprot")
    assert result.returncode == 2 and "unknown event type 'Reprot'" in result.stderr


def test_help_lists_the_log_commands() -> None:
    result = run("--help")
    for command in ("show", "replay", "convert", "stats"):
        assert command in result.stdout


def test_replay_against_training_callbacks(log: Path, tmp_path: Path) -> None:
    (tmp_path / "training_callbacks.py").write_text(
        textwrap.dedent(
            """
            class Rounds:
                def after_report(self, run_context, metrics, checkpoint):
                    print("round of", len(metrics), "ranks")
            """
        )
    )
    result = run("replay", log, "--callbacks", "training_callbacks:Rounds", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.count("round of 2 ranks") == 3
    assert "Rounds.after_report" in result.stdout


def test_deeply_nested_records_can_be_skipped(tmp_path: Path) -> None:
    result = run("show", deep_log(tmp_path), "--json", "--skip-corrupt")
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "skipped 1 corrupt record(s); first:" in result.stderr
    assert "nested too deep to decode" in result.stderr
    assert [json.loads(line)["seq"] for line in result.stdout.splitlines()] == [0, 2]


NONFINITE = {"loss": math.nan, "grad": math.inf, "low": -math.inf, "text": "NaN"}


def test_convert_keeps_nan_and_infinity_both_ways(tmp_path: Path) -> None:
    log = write_log(tmp_path / "nan.evlog", [report(0, **NONFINITE), report(1, loss=0.5)])
    jsonl, back = tmp_path / "nan.jsonl", tmp_path / "back.evlog"
    assert run("convert", log, jsonl).returncode == 0
    line = jsonl.read_text().splitlines()[1]
    assert '"loss":NaN,"grad":Infinity,"low":-Infinity,"text":"NaN"' in line
    assert run("convert", jsonl, back).returncode == 0
    originals, again = read_log(log).events, read_log(back).events
    assert [encode_msgpack(e) for e in again] == [encode_msgpack(e) for e in originals]


def test_show_json_keeps_nan_and_infinity(tmp_path: Path) -> None:
    for name in ("nan.evlog", "nan.jsonl"):
        log = write_log(tmp_path / name, [report(0, **NONFINITE)])
        result = run("show", log, "--json")
        assert result.returncode == 0, result.stderr
        metrics = json.loads(result.stdout)["metrics"]  # Python's json reads the tokens
        assert math.isnan(metrics["loss"]) and (metrics["grad"], metrics["low"]) == (
            math.inf,
            -math.inf,
        )
        table = run("show", log)
        assert 'metrics={"loss":NaN,"grad":Infinity,' in table.stdout


def test_records_that_do_not_decode_are_shown_as_placeholders(tmp_path: Path) -> None:
    log = tmp_path / "odd.evlog"
    bad = Report(run_id="r", rank=0, world_size=1, index=1, metrics=None, seq=1, time=2.0)  # type: ignore[arg-type]
    with LogRecorder(log) as recorder:
        recorder.write_many([report(0, loss=1.0), bad, report(2, path=Path("/x"))])
    result = run("show", log)
    assert result.returncode == 0, result.stderr
    rows = result.stdout.splitlines()[1:]
    assert [row.split()[2] for row in rows] == ["Report", "EventPlaceholder", "EventPlaceholder"]
    assert "event_type=Report reason=not a valid event: Expected `object`, got `None`" in rows[1]
    assert "reason=not encodable: TypeError" in rows[2]
    assert "1 record(s) shown as EventPlaceholder" in result.stderr
    stats = json.loads(run("stats", log, "--json").stdout)
    assert stats["by_type"] == {"EventPlaceholder": 2, "Report": 1}
    converted = run("convert", log, tmp_path / "odd.jsonl")
    assert converted.returncode == 0 and "3 events (jsonl)" in converted.stdout
    (tmp_path / "my_callbacks.py").write_text(CALLBACKS)
    replayed = run("replay", log, "--callbacks", "my_callbacks:count", cwd=tmp_path)
    assert replayed.returncode == 0, replayed.stderr
    assert "replayed 1 events" in replayed.stdout and "2 placeholders skipped" in replayed.stdout
