"""Options in one frozen struct, each field's range declared once and checked when built
(the public face is ``eventbus.options``)."""

from __future__ import annotations

import contextvars
import re
from typing import Annotated, Any, Self, TypedDict

import msgspec
import msgspec.inspect as mi
from msgspec import Meta

MAX_SECONDS = 7 * 24 * 3600.0
#: Shorter periods would spend the bus on its own reports.
MIN_PERIOD = 0.001
MAX_PERIOD = 24 * 3600.0
MAX_BUFFER = 1 << 20

_SECONDS = "number of seconds"

Seconds = Annotated[float, Meta(gt=0, le=MAX_SECONDS, description=_SECONDS)]

WaitSeconds = Annotated[float, Meta(ge=0, le=MAX_SECONDS, description=_SECONDS)]

PeriodSeconds = Annotated[float, Meta(ge=MIN_PERIOD, le=MAX_PERIOD, description=_SECONDS)]

Share = Annotated[float, Meta(gt=0, le=1, description="share of a period")]

Buffer = Annotated[int, Meta(ge=1, le=MAX_BUFFER, description="whole number of events")]

Count = Annotated[int, Meta(ge=1, le=2**31 - 1)]

Faults = Annotated[int, Meta(ge=1, le=1_000_000, description="whole number of faults")]

Probation = Annotated[int, Meta(ge=1, le=1_000_000, description="whole number of periods")]
#: A callback over budget in every period costs at most one period in four; one over
#: budget once is soon back.
DEFAULT_PROBATION = 3

StallPeriods = Annotated[
    int, Meta(ge=1, le=1_000_000, description="whole number of health-check periods")
]


class _NamesOption(Exception):
    """An error about one option: ``option`` names it (``period``, ``required_ranks[0]``)."""

    def __init__(self, option: str, message: str) -> None:
        super().__init__(message)
        self.option = option

    def __reduce__(self) -> tuple[Any, ...]:  # pickled whole (Ray ships exceptions)
        return type(self), (self.option, str(self))


class OptionError(_NamesOption, ValueError):
    """An option out of its range."""


class OptionTypeError(_NamesOption, TypeError):
    """An option of the wrong type."""


def _number(value: float | int) -> str:
    return f"{value:g}" if isinstance(value, float) else f"{value:,}"


def range_of(annotation: Any) -> str:
    """In words, what ``annotation`` admits: ``a number of seconds from 0.001 to 86400``."""
    return _words(mi.type_info(annotation))


def _words(info: mi.Type) -> str:
    unit = ""
    if isinstance(info, mi.Metadata):
        unit = (info.extra_json_schema or {}).get("description", "")
        info = info.type
    if isinstance(info, mi.FloatType | mi.IntType):
        if unit:
            kind = f"a {unit}"
        else:
            kind = "a number" if isinstance(info, mi.FloatType) else "an integer"
        if info.ge is not None and info.le is not None:
            return f"{kind} from {_number(info.ge)} to {_number(info.le)}"
        bounds = []
        if info.ge is not None:
            bounds.append(f"at least {_number(info.ge)}")
        elif info.gt is not None:
            bounds.append(f"more than {_number(info.gt)}")
        if info.le is not None:
            bounds.append(f"at most {_number(info.le)}")
        elif info.lt is not None:
            bounds.append(f"below {_number(info.lt)}")
        return " ".join([kind, ", ".join(bounds)]).rstrip()
    if isinstance(info, mi.LiteralType):
        return "one of " + ", ".join(repr(value) for value in info.values)
    if isinstance(info, mi.BoolType):
        return "True or False"
    if isinstance(info, mi.UnionType):
        words = [_words(t) for t in info.types if not isinstance(t, mi.NoneType)]
        nullable = any(isinstance(t, mi.NoneType) for t in info.types)
        return " or ".join(words + (["None"] if nullable else []))
    if isinstance(info, mi.VarTupleType | mi.ListType):
        return f"a list, each {_words(info.item_type)}"
    return type(info).__name__.removesuffix("Type").lower()


#: msgspec's wording for a value of another type: ``Expected `int`, got `float```.
_WRONG_TYPE = re.compile(r"Expected `[^`]+`, got `[^`]+`")
_MISSING = re.compile(r"Object missing required field `([^`]+)`")
_AT = re.compile(r" - at `\$((?:\.[A-Za-z_][A-Za-z0-9_]*|\[\d+\])*)`$")


def _option_error(
    error: msgspec.ValidationError, values: dict[str, Any], types: dict[str, Any], *, lone: bool
) -> OptionError | OptionTypeError:
    """msgspec's ``Expected `float` > 0.0 - at `$.period``` as a sentence naming the option;
    ``lone``: one value was checked (msgspec's path is inside it)."""
    if isinstance(error.__cause__, OptionError | OptionTypeError):
        return error.__cause__  # a check across fields, raised by a ``__post_init__``
    message = str(error)
    at = _AT.search(message)
    path = at[1] if at is not None else ""
    what = message[: at.start()] if at is not None else message
    if lone:
        (name,) = values
        inner = path
    else:
        path = path.lstrip(".")
        name = re.split(r"[.\[]", path, maxsplit=1)[0]
        inner = path[len(name) :]
    option = f"{name}{inner}"
    value = values.get(name)
    if inner or name not in types:  # an item of a list, say: msgspec's words
        words = f"{option}: {what[0].lower()}{what[1:]}"
        if _WRONG_TYPE.match(what):
            return OptionTypeError(option, f"{words} (in {value!r})")
        return OptionError(option, f"{words}, got {value!r}")
    if _WRONG_TYPE.match(what):
        expected = range_of(types[name])
        got = type(value).__name__
        return OptionTypeError(option, f"{option} must be {expected}, got {value!r} ({got})")
    return OptionError(option, f"{option} must be {range_of(types[name])}, got {value!r}")


#: Where the options are listed, for a user who named one that is not there.
_OPTIONS_PAGE = "docs/guides/async-trainer.md#options"


def checked(name: str, value: Any, annotation: Any) -> Any:
    """``value`` if ``annotation`` admits it (converted as msgspec converts), else
    ``OptionError`` (or ``TypeError``) naming ``name``: for options taken one by one."""
    try:
        return msgspec.convert(value, annotation)
    except msgspec.ValidationError as exc:
        raise _option_error(exc, {name: value}, {name: annotation}, lone=True) from None


#: Set while ``__post_init__`` has msgspec check a copy of an instance (which runs it again).
_checking: contextvars.ContextVar[bool] = contextvars.ContextVar("_checking", default=False)


class Options(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """A frozen set of options, checked against the ranges of its fields when built."""

    def __post_init__(self) -> None:
        if _checking.get():
            return  # built by msgspec below, or by ``build``: checked there
        values = msgspec.structs.asdict(self)
        token = _checking.set(True)
        try:
            msgspec.convert(values, type(self))
        except msgspec.ValidationError as exc:
            raise _option_error(exc, values, _field_types(type(self)), lone=False) from None
        finally:
            _checking.reset(token)

    @classmethod
    def build(cls, options: Self | None = None, /, **keywords: Any) -> Self:
        """``options`` (the defaults if ``None``) with ``keywords`` changed, checked and
        converted as msgspec converts; a subclass stays one."""
        if options is not None and not isinstance(options, cls):
            raise TypeError(f"options must be a {cls.__name__}, got {options!r}")
        target = cls if options is None else type(options)
        fields = _field_types(target)
        unknown = sorted(set(keywords) - set(fields))
        if unknown:
            raise TypeError(
                f"unexpected option(s): {', '.join(unknown)} (the {cls.__name__} options are "
                f"listed in {_OPTIONS_PAGE})"
            )
        values = {**(msgspec.structs.asdict(options) if options is not None else {}), **keywords}
        token = _checking.set(True)
        try:
            return msgspec.convert(values, target)
        except msgspec.ValidationError as exc:
            missing = _MISSING.match(str(exc))
            if missing is not None:
                raise OptionTypeError(missing[1], f"{missing[1]} is required") from None
            raise _option_error(exc, values, fields, lone=False) from None
        finally:
            _checking.reset(token)

    @classmethod
    def describe(cls) -> dict[str, str]:
        """Each option's range in words, with its default: what the docs list."""
        described = {}
        for field in msgspec.structs.fields(cls):
            default = "" if field.required else f"; default {field.default!r}"
            described[field.name] = f"{range_of(field.type)}{default}"
        return described


def _field_types(cls: type[Options]) -> dict[str, Any]:
    return {field.name: field.type for field in msgspec.structs.fields(cls)}


class BusOptions(Options, frozen=True, kw_only=True):
    """How an ``EventBus`` runs; ``EventBus(period=...)`` builds one from keywords.

    Attributes:
        buffer: events the inbox (and a lane without its own size) holds before
            ``publish`` waits.
        timeout: the default deadline of one handler call, in real seconds.
        period: the health-check period, seconds on the bus's clock.
        budget: the share of a period that all handlers may use together.
        drain_timeout: how long closing waits for delivery, seconds.
        stall_periods: whole periods without a report, while others report, after
            which a rank has stalled (a hung worker). ``None`` (default): not watched,
            since a rank may rightly go quiet (an evaluation on rank 0 alone).
    """

    buffer: Buffer = 1024
    timeout: Seconds = 30.0
    period: PeriodSeconds = 2.0
    budget: Share = 0.05
    drain_timeout: WaitSeconds = 10.0
    stall_periods: StallPeriods | None = None


class BusKeywords(TypedDict, total=False):
    """``BusOptions`` as keyword arguments (for type checkers: a misspelt option fails)."""

    buffer: int
    timeout: float
    period: float
    budget: float
    drain_timeout: float
    stall_periods: int | None
