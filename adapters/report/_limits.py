"""What a log may cost a report, hostile logs included: every cap, in one place. Past a cap,
the rest is counted on the page, never silently dropped."""

from __future__ import annotations

#: Buckets per chart: at most twice as many points per line, whatever the log's length.
BUCKETS = 256
#: Metrics charted; the names of the rest are listed, up to ``MAX_NAMES``.
MAX_METRICS = 16
MAX_NAMES = 50
#: Ranks drawn a line each; a wider run is drawn as a band around the mean.
MAX_RANK_LINES = 8
#: Distinct ranks remembered (for counts per rank).
MAX_RANKS_TRACKED = 4096
#: Markers of one kind (checkpoints, restarts...) kept, and drawn on a chart.
MAX_MARKERS = 200
MAX_DRAWN = 100
#: Handlers tracked one by one (the rest are added up as one), and drawn on the chart.
MAX_HANDLERS = 64
COST_LINES = 8
#: Disabled or coalescing spans kept.
MAX_SPANS = 200
#: Handlers whose state is followed, for the cause of their skipped deliveries.
MAX_STATES = 1024
#: Worker failures and callback faults listed with their text.
MAX_LISTED = 100
#: Restores, rejected reports and unsaved states listed.
MAX_RESTORES = 20
#: Longest name (metric, handler, run, checkpoint), message and traceback kept.
MAX_NAME = 200
MAX_MESSAGE = 2_000
MAX_TRACEBACK = 16_000
#: Longest label of a marker or a span (drawn on the chart, listed under it).
MAX_LABEL = 120
#: Bytes the log's long texts may take on a page, escaped, in all (``Document.text``),
#: and how many characters each keeps once that is spent.
TEXT_BUDGET = 1_000_000
SHORT_TEXT = 100


def clip(text: str, limit: int = MAX_NAME) -> str:
    """``text`` within about ``limit`` characters: its start and end, the middle cut."""
    if len(text) <= limit:
        return text
    keep = limit // 2
    return f"{text[:keep]} ... [{len(text) - 2 * keep} characters cut] ... {text[-keep:]}"
