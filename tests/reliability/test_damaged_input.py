"""Damaged input: random and mutated bytes into the event decoder, log reader and state loader.

Crafted input too: record headers that pass their checks and claim up to
64 MiB, and nesting far past the recursion limit.

Only the documented errors may come out (``EventDecodeError``; ``LogError``
and its subclasses; ``StateFormatError``), within a time limit and a memory
limit, and nothing is ever decoded by running code: the modules that read
events, logs and state do not import pickle (or marshal, shelve), and a
pickle payload is rejected without its code running.
"""

from __future__ import annotations

import ast
import pickle
import signal
import struct
import tracemalloc
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType

import hypothesis.strategies as st
import msgspec
import pytest
from hypothesis import HealthCheck, given, settings

import eventbus
from eventbus import CheckpointSaved, EventPlaceholder, Report, WorkerFailure
from eventbus._codec import (
    EventDecodeError,
    decode_json,
    decode_msgpack,
    encode_json,
    encode_msgpack,
)
from eventbus.log import LogError, LogReader, LogRecorder
from eventbus.state import StateStore
from eventbus.state._model import StateFormatError

from ._crash_writer import expected_event
from ._figures import FIGURES

EXAMPLES = 200
#: Generous: each example decodes a few kilobytes.
TIME_LIMIT = 5.0
#: Decoding a few kilobytes must not need more than this (the log reader included: a
#: damaged length prefix never makes it read more than the file holds).
MEMORY_LIMIT = 32 * 2**20

FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)

#: The modules on the paths that read events, logs and state.
READING_MODULES = (
    "_codec",
    "_events",
    "log/_format",
    "log/_reader",
    "log/_placeholders",
    "log/_recorder",
    "log/_replay",
    "state/_model",
    "state/_files",
    "state/_restore",
    "state/_store",
)
FORBIDDEN_IMPORTS = {"pickle", "cPickle", "_pickle", "marshal", "shelve", "dill", "cloudpickle"}


class TookTooLong(Exception):
    """The time guard fired: a decoder hung."""


peaks: dict[str, int] = {}


@contextmanager
def guarded(area: str, limit: int = MEMORY_LIMIT) -> Iterator[None]:
    """Fail if the body runs longer than ``TIME_LIMIT`` or allocates more than ``limit``."""

    def expire(signum: int, frame: FrameType | None) -> None:
        raise TookTooLong(f"no result within {TIME_LIMIT}s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, TIME_LIMIT)
    tracemalloc.start()
    try:
        yield
        _, peak = tracemalloc.get_traced_memory()
        assert peak < limit, f"decoding took {peak} bytes"
        peaks[area] = max(peaks.get(area, 0), peak)
    finally:
        tracemalloc.stop()
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def samples() -> list[bytes]:
    events = [
        expected_event(3),
        WorkerFailure(run_id="r", rank=1, error_type="ValueError", message="m", traceback="t"),
        CheckpointSaved(run_id="r", checkpoint="c/1", index=2, ranks=(0, 1), metrics={"a": 1.0}),
    ]
    return [encode_msgpack(e) for e in events] + [encode_json(e) for e in events]


def mutate(data: bytes, edits: list[tuple[int, int, int]]) -> bytes:
    """Apply (kind, position, value) edits: flip a byte, insert one, delete one, or truncate."""
    buf = bytearray(data)
    for kind, position, value in edits:
        if not buf:
            break
        at = position % len(buf)
        if kind == 0:
            buf[at] ^= value or 1
        elif kind == 1:
            buf.insert(at, value)
        elif kind == 2:
            del buf[at]
        else:
            del buf[at:]
    return bytes(buf)


edits = st.lists(
    st.tuples(st.integers(0, 3), st.integers(0, 2**16), st.integers(0, 255)), min_size=1, max_size=8
)
counts: dict[str, int] = {}


def count(area: str, outcome: str) -> None:
    counts[f"{area}:{outcome}"] = counts.get(f"{area}:{outcome}", 0) + 1


def decode_or_documented_error(decode: Callable[[bytes], object], data: bytes) -> str:
    with guarded("decoder"):
        try:
            decode(data)
        except EventDecodeError as exc:
            assert str(exc)
            return "rejected"
    return "decoded"


@FUZZ
@given(data=st.binary(max_size=2048))
def test_event_decoders_on_random_bytes(data: bytes) -> None:
    count("decoder-random", decode_or_documented_error(decode_msgpack, data))
    count("decoder-random", decode_or_documented_error(decode_json, data))


@FUZZ
@given(which=st.integers(0, 5), changes=edits)
def test_event_decoders_on_mutated_events(which: int, changes: list[tuple[int, int, int]]) -> None:
    sample = samples()[which]
    decode = decode_msgpack if which < 3 else decode_json
    count("decoder-mutated", decode_or_documented_error(decode, mutate(sample, changes)))


def log_bytes(fmt: str, tmp: Path) -> bytes:
    path = tmp / ("base.jsonl" if fmt == "jsonl" else "base.evlog")
    if not path.exists():
        with LogRecorder(path, run_id="fuzz", created=0.0) as recorder:
            for i in range(12):
                recorder.write(expected_event(i))
    return path.read_bytes()


def read_or_documented_error(path: Path, *, skip_corrupt: bool) -> str:
    with guarded("log"):
        try:
            with LogReader(path, skip_corrupt=skip_corrupt) as reader:
                events = list(reader)
        except LogError as exc:
            assert str(path) in str(exc)  # the error names the file
            return "rejected"
    assert reader.count == len(events)
    return "truncated" if reader.truncated else "read"


@FUZZ
@given(fmt=st.sampled_from(["msgpack", "jsonl"]), changes=edits, skip=st.booleans())
def test_log_reader_on_mutated_logs(
    tmp_path_factory: pytest.TempPathFactory,
    fmt: str,
    changes: list[tuple[int, int, int]],
    skip: bool,
) -> None:
    tmp = tmp_path_factory.getbasetemp() / "fuzz-logs"
    tmp.mkdir(exist_ok=True)
    path = tmp / "mutated.log"
    path.write_bytes(mutate(log_bytes(fmt, tmp), changes))
    count("log-mutated", read_or_documented_error(path, skip_corrupt=skip))


@FUZZ
@given(head=st.sampled_from([b"", b"\x89EVB\r\n\x1a\n", b'{"eventbus_log":1}\n']), tail=st.binary())
def test_log_reader_on_random_bytes(
    tmp_path_factory: pytest.TempPathFactory, head: bytes, tail: bytes
) -> None:
    path = tmp_path_factory.getbasetemp() / "random.log"
    path.write_bytes(head + tail)
    count("log-random", read_or_documented_error(path, skip_corrupt=False))


def crafted_header(claim: int, crc: int) -> bytes:
    """A version-2 record header whose length passes its check (and whose CRC is a guess)."""
    return struct.pack("<2sHII", b"\xc1\xeb", (claim ^ claim >> 16) & 0xFFFF, claim, crc)


@FUZZ
@given(
    fmt=st.sampled_from(["msgpack", "jsonl"]),
    where=st.integers(0, 2**16),
    headers=st.lists(
        st.tuples(st.integers(0, 2**26), st.integers(0, 2**32 - 1), st.binary(max_size=64)),
        max_size=200,
    ),
    deep=st.integers(0, 200_000),
)
def test_log_reader_on_crafted_framing_and_nesting(
    tmp_path_factory: pytest.TempPathFactory,
    fmt: str,
    where: int,
    headers: list[tuple[int, int, bytes]],
    deep: int,
) -> None:
    """Plausible record headers (lengths up to 64 MiB that pass their check),
    nesting up to 200,000 deep, spliced into a log: documented errors only, in
    bounded time and memory, and with ``skip_corrupt`` the records after."""
    tmp = tmp_path_factory.getbasetemp() / "fuzz-logs"
    tmp.mkdir(exist_ok=True)
    base = log_bytes(fmt, tmp)
    if fmt == "jsonl":
        splice = b'{"type":"Report","metrics":' + b"[" * deep + b"]" * deep + b"}\n"
        lines = base.splitlines(keepends=True)
        at = 1 + where % (len(lines) - 1)  # before a line, the last one at the latest
        junk = b"".join(filler for _, _, filler in headers).replace(b"\n", b"")
        data = b"".join([*lines[:at], splice, junk + b"\n", *lines[at:]])
    else:
        splice = b"".join(crafted_header(claim, crc) + filler for claim, crc, filler in headers)
        splice += crafted_header(deep + 1, 0) + b"\x91" * deep + b"\xc0"
        start = 16 + struct.unpack_from("<I", base, 12)[0]  # after the header
        last = len(base) - 12 - len(encode_msgpack(expected_event(11)))
        at = start + where % (last + 1 - start)  # anywhere up to the last record's start
        data = base[:at] + splice + base[at:]
    path = tmp / "crafted.log"
    path.write_bytes(data)
    count("log-crafted", read_or_documented_error(path, skip_corrupt=False))
    outcome = read_or_documented_error(path, skip_corrupt=True)
    count("log-crafted-skipping", outcome)
    assert outcome != "rejected"
    with LogReader(path, skip_corrupt=True) as reader:
        events = [e for e in reader if not isinstance(e, EventPlaceholder)]
    assert events[-1] == expected_event(11)  # the last record is always read


@FUZZ
@given(depth=st.integers(900, 300_000), json_text=st.booleans())
def test_event_decoders_on_deep_nesting(depth: int, json_text: bool) -> None:
    if json_text:
        data = b'{"type":"Report","metrics":{"a":' + b"[" * depth + b"]" * depth + b"}}"
        count("decoder-deep", decode_or_documented_error(decode_json, data))
    else:
        data = b"\x82\xa4type\xa6Report\xa7metrics\x81\xa1a" + b"\x91" * depth + b"\xc0"
        count("decoder-deep", decode_or_documented_error(decode_msgpack, data))


def checkpoint_in(store: StateStore) -> str:
    """A checkpoint inside the store's root, where a reported checkpoint must lie."""
    return str(store.root / "c")


def snapshot_bytes(tmp: Path) -> bytes:
    store = StateStore(tmp / "base-state")

    class Tracker:
        def state(self) -> dict[str, object]:
            return {"args": {"metric": "loss"}, "attributes": {"best": [[0.5, "c/1"]], "n": 3}}

    store.register([Tracker()])
    store.snapshot(checkpoint_in(store))
    return store.path_of(checkpoint_in(store)).read_bytes()


def load_or_documented_error(store: StateStore) -> str:
    with guarded("state"):
        try:
            store.load(checkpoint_in(store))
        except StateFormatError as exc:
            assert "callback_state.json" in str(exc)
            return "rejected"
    return "loaded"


@FUZZ
@given(changes=edits, random=st.none() | st.binary(max_size=1024))
def test_state_loader_on_mutated_and_random_files(
    tmp_path_factory: pytest.TempPathFactory,
    changes: list[tuple[int, int, int]],
    random: bytes | None,
) -> None:
    tmp = tmp_path_factory.getbasetemp() / "fuzz-state"
    tmp.mkdir(exist_ok=True)
    base = tmp / "base.json"
    if not base.exists():
        base.write_bytes(snapshot_bytes(tmp))
    store = StateStore(tmp / "damaged")
    target = store.path_of(checkpoint_in(store))
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(mutate(base.read_bytes(), changes) if random is None else random)
    count("state", load_or_documented_error(store))


# --- never by executing code -------------------------------------------------------


def test_reading_modules_never_import_pickle_or_eval() -> None:
    package = Path(eventbus.__file__).parent
    for name in READING_MODULES:
        tree = ast.parse((package / f"{name}.py").read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                imported = {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom):
                imported = {(node.module or "").split(".")[0]}
            else:
                imported = set()
            assert not imported & FORBIDDEN_IMPORTS, (name, imported)
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
                assert node.func.id not in ("eval", "exec", "__import__"), (name, node.func.id)


EXECUTED: list[str] = []


def _mark_executed(note: str) -> str:
    EXECUTED.append(note)
    return note


class Payload:
    """Unpickling this runs ``_mark_executed``: the test fails if anything unpickles it."""

    def __reduce__(self) -> tuple[Callable[[str], str], tuple[str]]:
        return (_mark_executed, ("unpickled",))


def test_pickle_payloads_are_rejected_without_running(tmp_path: Path) -> None:
    payload = pickle.dumps(Payload(), protocol=pickle.HIGHEST_PROTOCOL)
    for decode in (decode_msgpack, decode_json):
        with pytest.raises(EventDecodeError):
            decode(payload)
    # Framed as a log record after a valid header.
    log = tmp_path / "pickled.evlog"
    with LogRecorder(log, created=0.0):
        pass
    log.write_bytes(log.read_bytes() + len(payload).to_bytes(4, "little") + payload)
    with pytest.raises(LogError), LogReader(log) as reader:
        list(reader)
    # A pickle inside a msgpack binary field of an event: stays bytes, never loaded.
    report = msgspec.msgpack.encode(
        {
            "type": "Report",
            "run_id": "r",
            "rank": 0,
            "world_size": 1,
            "index": 0,
            "metrics": {"blob": payload},
        }
    )
    event = decode_msgpack(report)
    assert isinstance(event, Report) and event.metrics["blob"] == payload
    # As a state file.
    store = StateStore(tmp_path / "state")
    store.path_of(checkpoint_in(store)).parent.mkdir(parents=True)
    store.path_of(checkpoint_in(store)).write_bytes(payload)
    with pytest.raises(StateFormatError):
        store.load(checkpoint_in(store))
    assert EXECUTED == []


def test_figures() -> None:
    """Runs last in this module: records how many damaged inputs were tried."""
    tried = sum(counts.values())
    assert tried >= 5 * EXAMPLES or not counts  # all the fuzz tests ran (or were deselected)
    for key, value in sorted(counts.items()):
        area, outcome = key.split(":")
        FIGURES.add("damaged_input", **{f"{area}_{outcome}": value})
    for area, peak in peaks.items():
        FIGURES.add("damaged_input", **{f"max_peak_{area}_mb": round(peak / 2**20, 2)})
    FIGURES.add("damaged_input", inputs=tried, undocumented_errors=0, hangs=0)
