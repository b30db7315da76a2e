"""Bounded text made from anything (a hostile ``__str__``, a megabyte traceback, lone
surrogates), for fault paths and logs: it never raises, but for an interrupt."""

from __future__ import annotations

import traceback

from ._faults import FATAL

__all__ = ["MAX_MESSAGE", "MAX_TRACEBACK", "clip", "describe", "format_traceback", "safe_str"]

#: Longest message kept from an exception.
MAX_MESSAGE = 4096
#: Longest traceback text kept.
MAX_TRACEBACK = 32768


def clip(text: str, limit: int) -> str:
    """At most ``limit`` characters, always encodable as UTF-8 (lone surrogates escaped)."""
    if len(text) > limit:
        text = text[: max(0, limit - 1)] + "…"
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def safe_str(exc: BaseException) -> str:
    """``str(exc)``, bounded, whatever the exception's ``__str__`` does."""
    try:
        text = str(exc)
    except FATAL:
        raise
    except BaseException as inner:  # a hostile __str__ may raise anything
        text = f"<str() of {type(exc).__qualname__} raised {type(inner).__qualname__}>"
    return clip(text, MAX_MESSAGE)


def describe(exc: BaseException) -> str:
    """``Type: message`` (``Type`` alone for an empty message), for one-line reports."""
    message = safe_str(exc)
    return f"{type(exc).__qualname__}: {message}" if message else type(exc).__qualname__


def format_traceback(exc: BaseException) -> str:
    """The traceback text of ``exc``, bounded."""
    try:
        text = "".join(traceback.format_exception(exc))
    except FATAL:
        raise
    except BaseException:  # formatting calls the exception's own methods
        text = f"{describe(exc)} (traceback could not be formatted)"
    return clip(text, MAX_TRACEBACK)
