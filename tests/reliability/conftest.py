"""Options and shared fixtures of the reliability suite.

``--soak`` (or ``RELIABILITY_SOAK=1``) turns on the long runs. pytest reads
options only from conftests it loads at start-up, and it loads this one then
only when the command names this folder (``pytest tests/reliability --soak``);
the environment variable works from any command line.

``RELIABILITY_FIGURES=path.json`` writes the figures the tests measured
(runs, faults injected, events checked, lost) to ``path.json`` at the end of
the session: ``FIGURES.md`` is made from such a file.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from ._figures import FIGURES


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--soak",
        action="store_true",
        default=False,
        help="reliability suite: run the long soak sizes (10 million events)",
    )


@pytest.fixture(scope="session")
def soak(request: pytest.FixtureRequest) -> bool:
    """Whether the long sizes run (``--soak`` or ``RELIABILITY_SOAK=1``)."""
    return bool(request.config.getoption("--soak", default=False)) or (
        os.environ.get("RELIABILITY_SOAK", "") not in ("", "0")
    )


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    target = os.environ.get("RELIABILITY_FIGURES")
    if target and FIGURES.entries:
        FIGURES.write(Path(target))
