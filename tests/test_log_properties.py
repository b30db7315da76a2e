"""Properties of event logs over random values and random damage (hypothesis).

- Whatever a metric holds (objects, NaN, ints beyond 64 bits, keys of any
  type, nesting near or past the recursion limit), the recorder writes every
  event and the reader reads them all back, in order, each as itself or as an
  ``EventPlaceholder`` with its ``seq`` and ``time``.
- Random damage in the middle of a log (bytes overwritten, flipped, inserted
  or deleted) costs only the records it touched, whatever the read size.
"""

from __future__ import annotations

import itertools
import json
import math
from pathlib import Path
from typing import Any

import hypothesis.strategies as st
import pytest
from _builders import record_spans
from hypothesis import HealthCheck, given, settings

from eventbus import Event, EventPlaceholder, Report
from eventbus._codec import encode_json, encode_msgpack
from eventbus.log import LogReader, LogRecorder

FORMATS = ["log.evlog", "log.jsonl"]
PROPERTY = settings(
    max_examples=150,
    deadline=None,
    derandomize=True,  # the same examples on every CI run
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


class Opaque:
    """No encoder takes it."""

    def __repr__(self) -> str:
        return "Opaque()"


class BadRepr:
    """No encoder takes it, and its ``repr`` fails."""

    def __repr__(self) -> str:
        raise RuntimeError("no repr")


class Deep(dict[str, Any]):
    """``{"a": {"a": ...}}``, ``depth`` levels: a dict to every encoder, short to print."""

    def __init__(self, depth: int) -> None:
        super().__init__()
        self.depth = depth
        node: dict[str, Any] = self
        for _ in range(depth - 1):
            node["a"] = {}
            node = node["a"]

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        printer.text(f"Deep({self.depth})")


leaves = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=12),
    st.sampled_from(["\udc80", "NaN", "-Infinity", "null", '"}\n{', "\x00"]),
    st.binary(max_size=12),
    st.sampled_from([Path("/p"), Opaque(), {1, 2}, frozenset({"x"})]),
    st.builds(BadRepr),  # built, not sampled: hypothesis shows what it samples
)
keys = st.one_of(
    st.text(max_size=6), st.integers(-3, 3), st.sampled_from([None, 1.5, (1, 2), math.nan])
)
values = st.recursive(
    leaves,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.tuples(inner, inner),
        st.dictionaries(keys, inner, max_size=4),
    ),
    max_leaves=10,
)
metrics = st.one_of(
    st.dictionaries(keys, st.one_of(values, st.integers(850, 1300).map(Deep)), max_size=4),
    values,  # not even a dict: the recorder writes it, the reader makes it a placeholder
)


def canonical_json(event: Event) -> str | None:
    """What a JSON log can keep of ``event``: keys as strings (the last of equal
    ones), tuples as lists, bytes as base64; ``None`` if too deep to compare here."""
    try:
        return json.dumps(json.loads(encode_json(event)))
    except (RecursionError, TypeError, ValueError):
        return None


def same_bits(a: Event, b: Event) -> bool | None:
    """Equal, NaN included; ``None`` if it cannot be told here (too deep)."""
    try:
        return encode_msgpack(a) == encode_msgpack(b)
    except RecursionError:
        return None


@PROPERTY
@given(name=st.sampled_from(FORMATS), batch=st.lists(metrics, min_size=1, max_size=8))
def test_any_metric_values_read_back_to_the_end(
    tmp_path_factory: pytest.TempPathFactory, name: str, batch: list[Any]
) -> None:
    path = tmp_path_factory.mktemp("values") / name
    originals = [
        Report(run_id="r", rank=0, world_size=1, index=i, metrics=m, seq=i, time=1.0 + i)
        for i, m in enumerate(batch)
    ]
    with LogRecorder(path, fsync="never") as recorder:
        for original in originals:
            recorder.write(original)  # never raises for what an event holds
    with LogReader(path) as reader:
        back = list(reader)
    assert reader.skipped == 0 and reader.truncated is None
    assert [e.seq for e in back] == [e.seq for e in originals]
    placeholders = 0
    for original, event in zip(originals, back, strict=True):
        if isinstance(event, EventPlaceholder):
            placeholders += 1
            assert (event.event_type, event.time) == ("Report", original.time)
            assert len(event.text) <= 4097 and event.reason
            continue
        assert isinstance(event, Report)
        if name.endswith(".evlog"):
            assert same_bits(original, event) in (True, None)
        else:
            expected = canonical_json(original)
            assert expected is None or canonical_json(event) == expected
    assert placeholders == recorder.placeholders + reader.placeholders


def same(a: Event, b: Event) -> bool:
    try:
        return encode_msgpack(a) == encode_msgpack(b)
    except (OverflowError, TypeError):
        return False


def line_spans(data: bytes) -> list[tuple[int, int]]:
    ends = [i + 1 for i, b in enumerate(data) if b == 10]
    return list(itertools.pairwise(ends))


damage = st.tuples(
    st.sampled_from(["overwrite", "flip", "insert", "delete"]),
    st.floats(0.0, 1.0),  # where, between the first record and the last
    st.integers(1, 400),  # how many bytes
    st.binary(min_size=1, max_size=64),  # what (repeated)
)


@PROPERTY
@given(
    name=st.sampled_from(FORMATS),
    sizes=st.lists(st.integers(0, 200), min_size=4, max_size=30),
    damages=st.lists(damage, min_size=1, max_size=3),
    chunk=st.sampled_from([5, 12, 13, 100, 4096, 1 << 20]),
)
def test_random_damage_in_the_middle_loses_only_the_damaged_records(
    tmp_path_factory: pytest.TempPathFactory,
    name: str,
    sizes: list[int],
    damages: list[tuple[str, float, int, bytes]],
    chunk: int,
) -> None:
    path = tmp_path_factory.mktemp("damage") / name
    originals = [
        Report(
            run_id="r",
            rank=i % 3,
            world_size=3,
            index=i,
            metrics={"loss": 1.0 / (i + 1), "note": "n" * size, "nan": math.nan},
            seq=i,
            time=1.0 + i,
        )
        for i, size in enumerate(sizes)
    ]
    with LogRecorder(path, fsync="never") as recorder:
        recorder.write_many(originals)
    data = bytearray(path.read_bytes())
    spans = record_spans(bytes(data)) if name.endswith(".evlog") else line_spans(bytes(data))
    assert len(spans) == len(originals)
    # Damage lands between the start of the first record and the start of the last,
    # applied back to front so that the positions drawn stay where they were meant.
    first, last = spans[0][0], spans[-1][0]
    touched: set[int] = set()
    edits: list[tuple[int, str, int, bytes]] = []
    for kind, where, drawn, content in damages:
        at = first + int(where * (last - first - 1))
        length = min(drawn, last - at)
        hit = (at, at + max(length, 1))
        if any(a < hit[1] + 1 and hit[0] < b + 1 for a, _, b, _ in edits):
            continue  # apart from the others, so that each edit stays where it was drawn
        edits.append((at, kind, hit[1], content))
        hits = {i for i, (s, e) in enumerate(spans) if s < hit[1] and hit[0] < e}
        if name.endswith(".jsonl"):
            # A line's newline is also where the next one starts.
            hits |= {i + 1 for i, (_, e) in enumerate(spans) if hit[0] < e <= hit[1]}
        elif kind == "insert" and at in (s for s, _ in spans):
            hits = set()  # bytes between two records damage neither (lines have no such gap)
        touched |= hits
    for at, kind, stop, content in sorted(edits, reverse=True):
        length = stop - at
        filler = (content * (length // len(content) + 1))[:length]
        if kind == "overwrite":
            data[at : at + length] = filler
        elif kind == "flip":
            for i, byte in enumerate(filler):
                data[at + i] ^= byte or 1
        elif kind == "insert":
            data[at:at] = filler
        else:
            del data[at : at + length]
    path.write_bytes(bytes(data))
    with LogReader(path, skip_corrupt=True, chunk_size=chunk) as reader:
        back = list(reader)
    assert reader.truncated is None
    by_seq = {e.seq: e for e in originals}
    kept = [e.seq for e in back if not isinstance(e, EventPlaceholder)]
    untouched = [i for i in range(len(originals)) if i not in touched]
    if name.endswith(".evlog"):
        # Every record the damage missed, and nothing else: a CRC lets no damage through.
        assert kept == sorted(set(kept)) and set(kept) >= set(untouched)
        assert all(encode_msgpack(e) == encode_msgpack(by_seq[e.seq]) for e in back)
        assert reader.placeholders == 0
    else:
        # JSON Lines has no checksum: a damaged line may still parse (as some other
        # event, or a placeholder), but every line the damage missed is there, intact.
        intact = [e.seq for e in back if e.seq in by_seq and same(e, by_seq[e.seq])]
        position = 0
        for seq in untouched:
            assert seq in intact[position:], (seq, intact, untouched)
            position = intact.index(seq, position) + 1
