"""``eventbus report``: a recorded run as one self-contained HTML page.

``digest_log`` reads a log once, in bounded memory, into a ``RunDigest``;
``run_report`` makes its page (``comparison_report`` puts two runs side by
side). The page is one file that fetches nothing: charts by a vendored
uPlot, drawn from the data the page carries.
"""

from ._bench_page import BENCH_HEADERS, bench_report
from ._compare import comparison_report
from ._digest import RunDigest, digest_log
from ._run_page import run_report
from ._series import SeriesGroup, align

__all__ = [
    "BENCH_HEADERS",
    "RunDigest",
    "SeriesGroup",
    "align",
    "bench_report",
    "comparison_report",
    "digest_log",
    "run_report",
]
