"""Events: one tagged union, validated decoding, exceptions as text."""

from __future__ import annotations

import msgspec
import pytest

from eventbus import (
    CheckpointSaved,
    Event,
    EventDecodeError,
    Report,
    WorkerFailure,
    decode_json,
    decode_msgpack,
    encode_json,
    encode_msgpack,
    event_types,
)


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
