"""``eventbus report``: a recorded run as one self-contained HTML page.

``run_report`` reads a log once, in bounded memory, and makes its page
(``comparison_report`` puts two runs side by side). The page is one file
that fetches nothing: charts by a vendored uPlot, drawn from the data the
page carries.
"""

from ._compare import comparison_report
from ._run_page import run_report

__all__ = [
    "comparison_report",
    "run_report",
]
