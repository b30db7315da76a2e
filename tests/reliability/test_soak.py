"""Soak: a long run with the built-in callbacks, an event log and a state store.

Four ranks report flat out; the run carries the reports, the rounds
gathered from them and the derived events through ``BestCheckpoints``,
``EarlyStopping``, ``MetricsLogger`` and ``ProgressDisplay``, records every
event (to ``/dev/null``: the cost is the encoding) and snapshots the
callbacks' states at every checkpoint. The run is cut in ten slices; each
slice's resident memory and cost per event must stay flat.

Normal run: 160 000 reports (200 000 events), memory checked loosely (the last slice may not
hold 20 MB more than the first). ``--soak``: 10 million events, the same
check, and the per-slice figures printed.
"""

from __future__ import annotations

import os
import resource
import time
from pathlib import Path

import anyio
import anyio.lowlevel
import pytest

from eventbus.log import LogRecorder
from eventbus.state import StateStore
from handlers import BestCheckpoints, EarlyStopping, MetricsLogger, ProgressDisplay, open_run

from ._figures import FIGURES

pytestmark = pytest.mark.anyio

SLICES = 10
WORLD = 4
NORMAL_REPORTS = 160_000
#: Reports for about 10 million events on the bus (a round of 4 reports makes ~5 events more).
SOAK_REPORTS = 8_000_000
CHECKPOINT_EVERY = 500  # rounds
RSS_FLAT = 20 * 2**20


def rss() -> int:
    pages = int(Path("/proc/self/statm").read_text().split()[1])
    return pages * resource.getpagesize()


async def soak_run(reports: int, tmp_path: Path) -> list[tuple[int, float, int]]:
    """(events on the bus, seconds, resident bytes) at the end of each slice."""
    with open(os.devnull, "w") as sink:  # noqa: ASYNC230 (opening /dev/null does not block)
        callbacks = [
            BestCheckpoints("loss", k=3),
            EarlyStopping("loss", patience=10**9),
            MetricsLogger(every=10**6),
            ProgressDisplay(stream=sink, interval=1.0, tty=False),
        ]
        run = open_run(world_size=WORLD, callbacks=callbacks, name="soak", period=2.0)
        recorder = LogRecorder(os.devnull, fsync="never")
        recorder.attach(run.bus)
        store = StateStore(tmp_path / "state")
        store.register(callbacks)
        store.attach(run.bus)
        rounds = reports // WORLD
        per_slice = rounds // SLICES
        slices: list[tuple[int, float, int]] = []
        async with run:
            reporters = [run.reporter(rank) for rank in range(WORLD)]
            start = time.perf_counter()
            for r in range(per_slice * SLICES):
                name = f"ckpt-{r // CHECKPOINT_EVERY % 3}"
                checkpoint = str(store.root / name) if r % CHECKPOINT_EVERY == 0 else None
                for reporter in reporters:
                    await reporter.report({"loss": 1.0 / (r + 1), "step": r}, checkpoint)
                if (r + 1) % per_slice == 0:
                    await run.bus.wait_idle()
                    slices.append((run.bus.stats().published, time.perf_counter() - start, rss()))
                elif r % 64 == 0:
                    await anyio.lowlevel.checkpoint()
        recorder.close()
    assert run.result is not None and run.result.rounds == per_slice * SLICES
    assert run.bus.stats().abandoned == 0
    assert store.load(store.root / "ckpt-0").states
    return slices


@pytest.mark.skipif(not Path("/proc/self/statm").exists(), reason="reads /proc for memory")
async def test_soak_memory_and_cost_stay_flat(
    tmp_path: Path, soak: bool, anyio_backend: str
) -> None:
    slices = await soak_run(SOAK_REPORTS if soak else NORMAL_REPORTS, tmp_path)
    events = [b[0] - a[0] for a, b in zip([(0, 0.0, 0), *slices], slices, strict=False)]
    seconds = [b[1] - a[1] for a, b in zip([(0, 0.0, 0), *slices], slices, strict=False)]
    per_event_us = [s / e * 1e6 for s, e in zip(seconds, events, strict=True)]
    growth = slices[-1][2] - slices[0][2]
    if soak:
        print(f"\nsoak ({anyio_backend}): {slices[-1][0]} events in {slices[-1][1]:.1f} s")
        for n, (count, cost, (_, _, resident)) in enumerate(
            zip(events, per_event_us, slices, strict=True)
        ):
            print(
                f"  slice {n}: {count} events, {cost:.2f} us/event, RSS {resident / 2**20:.1f} MB"
            )
    assert growth < RSS_FLAT, [s[2] for s in slices]
    FIGURES.add(
        "soak" if soak else "soak_small",
        runs=1,
        events_checked=slices[-1][0],
        lost=0,
        max_rss_growth_mb=round(growth / 2**20, 2),
        max_cost_ratio_last_to_first=round(per_event_us[-1] / per_event_us[0], 2),
        **{f"us_per_event_{anyio_backend}": round(sum(seconds) / slices[-1][0] * 1e6, 2)},
    )
