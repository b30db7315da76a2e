"""One validated configuration: every option checked once, where it is built, at every way in.

NaN, infinities, zero, negatives, subnormals, absurd sizes and wrong types are
refused by the call the user made (``EventBus(...)``, ``open_run(...)``, an
adapter, the bench), with an ``OptionError`` (a ``ValueError``) or an
``OptionTypeError`` (a ``TypeError``) naming the option: never accepted to fail
later inside a task group (issue 23, items 1 and 2).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec
import pytest

from adapters import AdapterOptions
from adapters._bus_thread import BusThread
from adapters.cli._bench_runner import Workload, run_bench, synthetic_events
from eventbus import BusOptions, EventBus, Report
from eventbus._options import OptionTypeError, range_of
from eventbus.options import OptionError
from handlers import RunOptions, open_run

HOSTILE_SECONDS = [math.nan, math.inf, -math.inf, 0.0, -0.0, -1.0, 1e308, "2", None, True, [1]]
HOSTILE_COUNTS = [0, -1, 2.0, 1.5, math.nan, 10**30, "8", None, True]


def _hf_callback(name: str, value: Any) -> object:
    from adapters.transformers import EventBusCallback

    return EventBusCallback([], **{name: value})


def _ray_callback(name: str, value: Any) -> object:
    from adapters.ray import EventBusUserCallback

    return EventBusUserCallback([], **{name: value})


#: Each way in: builds what it builds from one option, as a user would write it.
ENTRY_POINTS: dict[str, Callable[[str, Any], object]] = {
    "Hugging Face EventBusCallback": _hf_callback,
    "Ray EventBusUserCallback": _ray_callback,
    "EventBus": lambda name, value: EventBus(**{name: value}),
    "open_run": lambda name, value: open_run(world_size=2, **{name: value}),
    "BusOptions": lambda name, value: BusOptions(**{name: value}),
    "RunOptions": lambda name, value: RunOptions(world_size=2, **{name: value}),
    "AdapterOptions": lambda name, value: AdapterOptions.build(None, **{name: value}),
    "adapters' bus thread": lambda name, value: BusThread(lambda bus: None, **{name: value}),
    "run_bench": lambda name, value: run_bench(lambda: [], [], **{name: value}),
}

BUS_SECONDS = ["timeout", "period", "drain_timeout"]


def _refused(build: Callable[[str, Any], object], name: str, value: Any) -> BaseException:
    with pytest.raises((ValueError, TypeError)) as info:
        build(name, value)
    error = info.value
    assert isinstance(error, OptionError | OptionTypeError), repr(error)
    assert error.option == name and str(error).startswith(name), str(error)
    if not isinstance(value, str | list) and value is not None:
        assert repr(value) in str(error)
    return error


@pytest.mark.parametrize("entry", ENTRY_POINTS)
@pytest.mark.parametrize("name", BUS_SECONDS)
@pytest.mark.parametrize("value", HOSTILE_SECONDS, ids=repr)
def test_every_way_in_refuses_a_hostile_number_of_seconds(
    entry: str, name: str, value: Any
) -> None:
    if (
        name == "drain_timeout"
        and value in (0.0, -0.0)
        and entry in ("EventBus", "BusOptions", "run_bench")
    ):
        pytest.skip("a bare bus may close without draining: drain_timeout=0 is in its range")
    _refused(ENTRY_POINTS[entry], name, value)


@pytest.mark.parametrize("entry", ENTRY_POINTS)
@pytest.mark.parametrize("value", [*HOSTILE_COUNTS, 2**20 + 1])
def test_every_way_in_refuses_a_hostile_buffer(entry: str, value: Any) -> None:
    _refused(ENTRY_POINTS[entry], "buffer", value)


@pytest.mark.parametrize("entry", ENTRY_POINTS)
@pytest.mark.parametrize("value", [0, -0.1, 1.0000001, math.nan, math.inf, 5e-324 * 0, "0.5"])
def test_every_way_in_refuses_a_budget_that_is_no_share(entry: str, value: Any) -> None:
    _refused(ENTRY_POINTS[entry], "budget", value)


@pytest.mark.parametrize("entry", ENTRY_POINTS)
@pytest.mark.parametrize("value", [0, -1, 2.0, math.nan, True, 10**30, "3", 10**6 + 1])
def test_every_way_in_refuses_a_hostile_stall_periods(entry: str, value: Any) -> None:
    _refused(ENTRY_POINTS[entry], "stall_periods", value)


@pytest.mark.parametrize(
    ("keywords", "option", "words"),
    [
        ({"world_size": 200_000}, "world_size", "from 1 to 131,072, got 200000"),
        ({"world_size": 2.0}, "world_size", "got 2.0 (float)"),
        ({"world_size": 0}, "world_size", "got 0"),
        ({}, "world_size", "world_size is required"),
        ({"world_size": 2, "required_ranks": [5]}, "required_ranks", "from 0 to 1"),
        ({"world_size": 2, "required_ranks": []}, "required_ranks", "at least one rank"),
        ({"world_size": 2, "required_ranks": [0, 1.0]}, "required_ranks[1]", "expected `int`"),
        ({"world_size": 2, "required_ranks": 3}, "required_ranks", "must be ranks"),
        ({"world_size": 2, "timeout": math.nan}, "timeout", "got nan"),
        ({"world_size": 2, "period": 1e-12}, "period", "from 0.001 to 86400, got 1e-12"),
        ({"world_size": 2, "drain_timeout": math.nan}, "drain_timeout", "got nan"),
        ({"world_size": 2, "drain_timeout": 0.0}, "drain_timeout", "from 0.1 to 604800"),
    ],
)
@pytest.mark.anyio
async def test_open_run_refuses_what_would_fail_later_with_a_plain_error(
    keywords: dict[str, Any], option: str, words: str
) -> None:
    """Raised by ``open_run`` itself, on either backend: ``except ValueError`` (or
    ``TypeError``) catches it, never an ``ExceptionGroup`` from inside the run."""
    with pytest.raises((ValueError, TypeError)) as info:
        open_run(**keywords)
    assert not isinstance(info.value, BaseExceptionGroup)
    assert getattr(info.value, "option", None) == option
    assert words in str(info.value)


def test_an_unknown_option_is_a_type_error_naming_it() -> None:
    with pytest.raises(TypeError, match="perod"):
        open_run(world_size=2, perod=2.0)  # type: ignore[call-arg]
    with pytest.raises(TypeError, match="perod"):
        EventBus(perod=2.0)  # type: ignore[call-arg]


def test_options_are_checked_however_they_are_built() -> None:
    with pytest.raises(OptionError, match="period"):
        BusOptions(period=math.nan)
    with pytest.raises(OptionError, match="period"):
        msgspec.structs.replace(BusOptions(), period=-1.0)
    with pytest.raises(OptionError, match="required_ranks"):
        RunOptions(world_size=2, required_ranks=(2,))
    with pytest.raises(msgspec.ValidationError, match="period"):
        msgspec.json.decode(b'{"period": 0}', type=BusOptions)
    base = RunOptions(world_size=4, period=5.0)
    assert RunOptions.build(base, timeout=1).timeout == 1.0
    assert isinstance(EventBus(base).options, RunOptions)


def test_the_defaults_are_written_once() -> None:
    """Every entry point starts from the struct's defaults: no second copy to drift."""
    bus = BusOptions()
    run = open_run(world_size=1).options
    adapter = AdapterOptions()
    for name in msgspec.structs.fields(BusOptions):
        if name.name == "drain_timeout":
            continue  # a run's end has its own floor, same default
        assert getattr(run, name.name) == getattr(bus, name.name) == getattr(adapter, name.name)
    assert EventBus().options == bus


def test_subscribe_and_callbacks_take_their_options_through_the_same_checks() -> None:
    bus = EventBus()
    cases: list[tuple[dict[str, Any], str]] = [
        ({"timeout": math.nan}, "timeout"),
        ({"timeout": 0}, "timeout"),
        ({"budget": math.inf}, "budget"),
        ({"max_faults": 0}, "max_faults"),
        ({"max_faults": 1.5}, "max_faults"),
        ({"buffer": 0}, "buffer"),
        ({"buffer": math.nan, "delivery": "lane"}, "buffer"),
    ]
    for keywords, option in cases:
        with pytest.raises((OptionError, OptionTypeError)) as info:
            bus.subscribe(Report, lambda e: None, **keywords)
        assert getattr(info.value, "option", None) == option


def test_a_callbacks_own_deadline_is_checked_naming_the_callback() -> None:
    from handlers import UserCallback

    class Slow(UserCallback):
        timeout = math.nan

        def after_report(self, run_context: Any, metrics: Any, checkpoint: Any) -> None:
            pass

    with pytest.raises(OptionError, match=r"<locals>.Slow: timeout must be a number of seconds"):
        open_run(world_size=1, callbacks=[Slow()])


def test_the_bench_workload_is_checked_before_anything_runs() -> None:
    cases: list[tuple[dict[str, Any], str]] = [
        ({"duration": 1e308}, "duration"),
        ({"rate": math.inf}, "rate"),
        ({"rate": 0}, "rate"),
        ({"world_size": 200_000}, "world_size"),
        ({"world_size": 100_000, "rate": 1000.0, "duration": 100.0}, "duration"),
    ]
    for keywords, option in cases:
        with pytest.raises((OptionError, OptionTypeError)) as info:
            Workload(**keywords)
        assert getattr(info.value, "option", None) == option
    with pytest.raises(OptionError, match="repeats"):
        run_bench(lambda: [], synthetic_events(Workload(duration=1)), repeats=0)


def test_each_range_is_said_in_words() -> None:
    types = {field.name: field.type for field in msgspec.structs.fields(RunOptions)}
    assert range_of(types["world_size"]) == "a whole number of ranks from 1 to 131,072"
    described = RunOptions.describe()
    assert described["period"] == "a number of seconds from 0.001 to 86400; default 2.0"
    assert described["budget"] == "a share of a period more than 0, at most 1; default 0.05"
    assert "or None" in described["required_ranks"]


def test_the_readme_table_says_each_range_as_the_options_do() -> None:
    """The docs list every option of ``open_run`` with the range its struct declares."""
    guide = Path(__file__).resolve().parent.parent / "docs" / "guides" / "async-trainer.md"
    readme = guide.read_text()
    table = readme.split("<!-- options table:", 1)[1].split("\n\n", 1)[0]
    rows = {}
    for line in table.splitlines()[3:]:
        name, words, default = (cell.strip() for cell in line.strip("|").split("|"))
        rows[name.strip("`")] = (words, default)
    fields = {field.name: field for field in msgspec.structs.fields(RunOptions)}
    assert set(rows) == set(fields)
    for name, (words, default) in rows.items():
        field = fields[name]
        assert words == range_of(field.type), name
        assert default == ("required" if field.required else repr(field.default)), name


def test_option_errors_survive_pickling_as_ray_ships_them() -> None:
    import pickle

    from handlers import ReportError

    for error in (
        OptionError("period", "period must be ..."),
        OptionTypeError("buffer", "buffer must be ..."),
        ReportError(1, "metrics['loss']", "a Tensor is not a JSON value"),
    ):
        back = pickle.loads(pickle.dumps(error))
        assert type(back) is type(error) and str(back) == str(error)
        assert vars(back) == vars(error)
