"""Events: one tagged union, validated decoding, exceptions as text."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec
import pytest
from _builders import sample_event

from eventbus import CheckpointSaved, Event, Report, WorkerFailure
from eventbus._codec import (
    EventDecodeError,
    decode_json,
    decode_msgpack,
    encode_json,
    encode_msgpack,
)
from eventbus._events import event_types
from eventbus.log import LogRecorder

BuiltinReport = Report


def test_report_round_trips_in_both_formats() -> None:
    report = Report(
        run_id="r", rank=1, world_size=2, index=3, metrics={"loss": 0.25}, checkpoint="c"
    )
    assert decode_msgpack(encode_msgpack(report)) == report
    assert decode_json(encode_json(report)) == report


def test_events_are_frozen_and_keyword_only() -> None:
    report = Report(run_id="r", rank=0, world_size=1, index=0, metrics={})
    with pytest.raises(AttributeError):
        report.rank = 3  # type: ignore[misc]
    with pytest.raises(TypeError):
        Report("r", 0, 1, 0, {})  # type: ignore[call-arg, arg-type]


def test_bad_field_error_names_the_field() -> None:
    with pytest.raises(EventDecodeError, match=r"\$\.rank"):
        decode_json(
            b'{"type":"Report","run_id":"r","rank":"x","world_size":1,"index":0,"metrics":{}}'
        )


def test_missing_field_error_names_the_field() -> None:
    with pytest.raises(EventDecodeError, match="world_size"):
        decode_json(b'{"type":"Report","run_id":"r","rank":0,"index":0,"metrics":{}}')


def test_unknown_type_is_rejected() -> None:
    with pytest.raises(EventDecodeError, match=r"Invalid value 'Exploit'.*\$\.type"):
        decode_msgpack(msgspec.msgpack.encode({"type": "Exploit", "seq": 1}))


def test_garbage_bytes_are_a_decode_error() -> None:
    with pytest.raises(EventDecodeError):
        decode_msgpack(b"\xc1\xff\x00")
    with pytest.raises(EventDecodeError):
        decode_json(b"{not json")


def test_worker_failure_carries_the_exception_as_text() -> None:
    try:
        raise KeyError("missing shard")
    except KeyError as exc:
        failure = WorkerFailure.from_exception("r", 2, exc, retryable=True)
    assert failure.error_type == "KeyError"
    assert failure.message == "'missing shard'"
    assert "raise KeyError" in failure.traceback
    assert failure.retryable
    assert decode_msgpack(encode_msgpack(failure)) == failure


def test_user_event_types_join_the_union() -> None:
    class LearningRateChanged(Event, frozen=True, kw_only=True):
        lr: float

    assert LearningRateChanged in event_types()
    event = LearningRateChanged(lr=0.1)
    assert decode_json(encode_json(event)) == event


def test_checkpoint_saved_defaults() -> None:
    saved = CheckpointSaved(run_id="r", checkpoint="ckpt/1", index=1)
    assert saved.ranks == () and saved.metrics == {}
    assert decode_msgpack(encode_msgpack(saved)) == saved


def test_a_users_event_cannot_take_the_tag_of_a_built_in() -> None:
    class Report(Event, frozen=True, kw_only=True):  # a user's own Report
        value: int

    taken = r"tag 'Report' .* already taken by eventbus\._events\.Report"
    with pytest.raises(TypeError, match=taken):  # as soon as the union is needed
        event_types()
    # Refused once and left out: the built-in still decodes as itself, with every field.
    assert Report not in event_types()
    event = decode_msgpack(encode_msgpack(sample_event(BuiltinReport)))
    assert type(event) is BuiltinReport


def test_a_log_cannot_be_opened_while_a_tag_is_taken_twice(tmp_path: Path) -> None:
    class WorkerFailure(Event, frozen=True, kw_only=True):
        note: str

    with pytest.raises(TypeError, match="WorkerFailure"):
        LogRecorder(tmp_path / "run.evlog")


def test_two_user_events_of_one_name_are_told_apart_by_their_own_tags() -> None:
    class Ping(Event, frozen=True, kw_only=True, tag="first.Ping"):
        a: int

    class Ping2(Event, frozen=True, kw_only=True, tag="second.Ping"):
        b: str

    assert type(decode_json(encode_json(Ping(a=1)))) is Ping
    assert type(decode_json(encode_json(Ping2(b="x")))) is Ping2

    class Other(Event, frozen=True, kw_only=True, tag="first.Ping"):
        c: int

    with pytest.raises(TypeError, match=r"first\.Ping"):
        decode_json(encode_json(Ping(a=1)))
    assert type(decode_json(encode_json(Ping(a=1)))) is Ping


def test_defining_the_same_event_class_again_replaces_it() -> None:
    def define() -> Any:
        class Redefined(Event, frozen=True, kw_only=True):
            n: int

        return Redefined

    first, second = define(), define()
    assert first is not second
    assert type(decode_json(encode_json(second(n=1)))) is second
    assert first not in event_types() and second in event_types()


def test_every_event_of_the_project_is_defined_in_one_module() -> None:
    ours = [c for c in event_types() if c.__module__.split(".")[0] in ("eventbus", "handlers")]
    assert {c.__module__ for c in ours} == {"eventbus._events"}
    assert {"BeforeRun", "RoundGathered", "FailuresGathered", "AfterRun"} <= {
        c.__name__ for c in ours
    }


def test_events_are_not_tracked_by_the_garbage_collector_unless_a_class_asks() -> None:
    """A run keeps many events alive; full collections need not walk them (see ``Event``)."""
    import gc

    report = Report(run_id="r", rank=0, world_size=1, index=0, metrics={"loss": [0.5]})
    assert not gc.is_tracked(report)

    class CyclicPayload(Event, frozen=True, kw_only=True, gc=True):
        items: list[Any] = msgspec.field(default_factory=list)

    assert gc.is_tracked(CyclicPayload())  # a subclass that may sit in a cycle opts back in
