"""``eventbus report``: a recorded run (or two, side by side) as one self-contained HTML
page that fetches nothing (docs/report.md)."""

from ._compare import comparison_report
from ._run_page import run_report

__all__ = [
    "comparison_report",
    "run_report",
]
