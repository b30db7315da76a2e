"""Any name, any value, nothing lost (issue 41, item 1), as properties over hostile names
and values, for each tracker: every name maps to one its backend takes, names that differ
stay apart, and one hostile entry costs only itself, never its round or the run, read back
with TensorBoard's ``EventAccumulator`` and MLflow's client."""

from __future__ import annotations

import math
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from structlog.testing import capture_logs

pytest.importorskip("tensorboard", reason="pip install '.[tensorboard]'")
pytest.importorskip("mlflow", reason="pip install '.[mlflow]'")

from _trackers_readback import mlflow_metrics, mlflow_only_run, tensorboard_scalars
from mlflow.utils.validation import _validate_metric_name, _validate_param_name

from adapters._tracker import _shown, backend_name
from adapters.mlflow import MLflowLogger, mlflow_key
from adapters.tensorboard import TensorBoardLogger
from handlers import Reporter, open_run

#: Characters that trip backends: path separators and dots, a lone surrogate of each
#: half, refused punctuation, letters beyond ASCII.
TRICKY = ["/", ".", " ", ":", "#", "\ud800", "\udfff", "é", "損", "\n", "\x00"]
alphabet = st.one_of(st.characters(), st.sampled_from(TRICKY))
#: Short tricky names (shown whole in warnings), and long ones, up to 10,000 characters,
#: that differ at their end (shown by their length and last characters).
names = st.one_of(
    st.text(alphabet, max_size=24),
    st.builds(
        lambda n, tail: "a" * n + tail, st.integers(230, 10_000), st.text(alphabet, max_size=10)
    ),
)
values = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.integers(-(2**63), 2**63 - 1),
    st.booleans(),
    st.none(),
    st.text(max_size=4),
    st.lists(st.integers(-(2**63), 2**63 - 1), max_size=2),  # a report holds 64 bits
    st.dictionaries(st.text(max_size=3), st.integers(0, 9), max_size=2),
)
hostile_metrics = st.dictionaries(names.filter(lambda n: n != "loss"), values, max_size=6)
config_values = st.one_of(st.floats(), st.integers(), st.text(max_size=8), st.none())
#: A run per example: a few, each a second or so.
slow = settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def tensorboard_name(name: str) -> str:
    return backend_name(name, TensorBoardLogger._backend_rule, None)


def has_surrogate(name: str) -> bool:
    return any(0xD800 <= ord(c) <= 0xDFFF for c in name)


@settings(max_examples=300, deadline=None)
@given(st.lists(names, unique=True, max_size=12))
def test_every_name_maps_to_one_mlflow_takes_and_names_that_differ_stay_apart(
    given_names: list[str],
) -> None:
    keys = [mlflow_key(name) for name in given_names]
    for key in keys:
        _validate_metric_name(key)  # MLflow's own checks (they raise)
        _validate_param_name(key)
        assert len(key) <= 250
        key.encode()
        assert mlflow_key(key) == key  # a name MLflow takes is kept as it is
    assert len(set(keys)) == len(keys)


@settings(max_examples=300, deadline=None)
@given(st.lists(names, unique=True, max_size=12))
def test_every_name_maps_to_one_tensorboard_takes_and_names_that_differ_stay_apart(
    given_names: list[str],
) -> None:
    tags = [tensorboard_name(name) for name in given_names]
    for name, tag in zip(given_names, tags, strict=True):
        tag.encode()  # a protobuf string: UTF-8
        assert (tag == name) is not has_surrogate(name)  # only what UTF-8 cannot hold
    assert len(set(tags)) == len(tags)


def run_with(tracker: Any, hostile: dict[str, Any], config: dict[str, Any]) -> Any:
    """Six rounds of ``loss`` on one rank; rounds 2 and 4 report ``hostile`` too. The run,
    and what was logged."""

    async def train(reporter: Reporter) -> None:
        for step in range(6):
            extra = hostile if step in (2, 4) else {}
            await reporter.report({"loss": 1.0 / (step + 1), **extra})

    async def main() -> Any:
        async with open_run(world_size=1, callbacks=[tracker], config=config) as run:
            await run.workers(train)
        return run

    with capture_logs() as logs:
        run = anyio.run(main)
    assert run.result.status == "finished"
    assert not [e for e in logs if e["event"] == "handler failed"], logs
    return [str(e["event"]) for e in logs]


def check(
    read: dict[str, list[tuple[int, float]]],
    hostile: dict[str, Any],
    said: list[str],
    name_of: Callable[[str], str],
    stored: Callable[[float], float],
) -> None:
    """Every round's loss; each number, as the backend stores it, under its backend name
    at steps 2 and 4; each non-number left out; one warning per renamed or left-out name."""
    assert [step for step, _ in read["loss"]] == list(range(6))
    for name, value in hostile.items():
        shown = f"metric {_shown(name)} is "
        renamed = [e for e in said if shown + "written as" in e]
        if isinstance(value, bool) or not isinstance(value, int | float):
            assert name_of(name) not in read and not renamed
            assert len([e for e in said if shown in e and "not a number" in e]) == 1, name
            continue
        assert len(renamed) == (name_of(name) != name), (name, renamed)
        points = read[name_of(name)]
        assert [step for step, _ in points] == [2, 4]
        expected = stored(float(value))
        for _, got in points:
            assert (math.isnan(got) and math.isnan(expected)) or got == pytest.approx(expected)


def float32(value: float) -> float:
    """A float as TensorBoard's ``simple_value`` (32 bits) holds it."""
    if math.isnan(value) or abs(value) <= 3.4028234663852886e38:
        return value
    return math.copysign(math.inf, value)


def mlflow_double(value: float) -> float:
    """A float as MLflow's store holds it: an infinity as the largest double, NaN as NaN."""
    if math.isnan(value):  # min() and max() would make it the largest double
        return value
    return max(-sys.float_info.max, min(sys.float_info.max, value))


@slow
@given(hostile_metrics)
def test_hostile_names_and_values_cost_only_themselves_in_tensorboard(
    hostile: dict[str, Any],
) -> None:
    folder = Path(tempfile.mkdtemp()) / "tb"
    said = run_with(TensorBoardLogger(folder, costs=False, flush_secs=0.05), hostile, {})
    check(tensorboard_scalars(folder), hostile, said, tensorboard_name, float32)


@slow
@given(hostile_metrics, st.dictionaries(names, config_values, max_size=4))
@example(hostile={"": 0.0}, config={"": None})  # one name renamed as a config key and a metric
@example(hostile={"nan": math.nan, "inf": -math.inf}, config={})  # MLflow keeps NaN as NaN
def test_hostile_names_and_values_cost_only_themselves_in_mlflow(
    hostile: dict[str, Any], config: dict[str, Any]
) -> None:
    uri = f"sqlite:///{tempfile.mkdtemp()}/mlflow.db"
    said = run_with(MLflowLogger(uri, "hostile", costs=False), hostile, config)
    found = mlflow_only_run(uri, "hostile")
    assert found.info.status == "FINISHED"
    assert set(found.data.params) == {mlflow_key(k) for k in config}  # each config key, apart
    check(mlflow_metrics(uri, found.info.run_id), hostile, said, mlflow_key, mlflow_double)
