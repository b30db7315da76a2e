"""Cost of ``eventbus report``: a recorded run's log made into its HTML page.

The log is a synthetic run as our runtime records one (``write_run_log``):
``RunStarted``; rounds of ``world_size`` ``Report``s, each followed by its
``RoundGathered``; a ``CheckpointSaved`` and ``StateSnapshotted`` every 50
rounds; a ``HealthCheckTick`` and ``BudgetReport`` (8 handlers) every 400
events; a worker failure and restart near the middle, two callback faults;
``RunFinished``. Written 100,000 events at a time, never all in memory.

- *report*: ``digest_log`` + ``run_report`` + writing the page, for a log of
  1 million events (target <= 10 s). Its peer, timed in the same run, the
  same way, over the same warm file and interleaved with it (read, report,
  read, report, ...): a plain ``for _ in LogReader(path): pass``, the floor of
  any pass over the log. Median of the repeats, and the paired ratio.
  ``--quick`` scales from 200,000 events and says so.
- *memory*: peak RSS (``VmHWM``) of a fresh process making the report of a
  10-million-event log (target <= 200 MB; ``--quick``: 1 million, same
  target), beside a fresh process only streaming it (the interpreter, this
  script's imports and the reader); and the page's size (target <= 4 MB,
  whatever the log's length).

The big log takes ~2.4 GB under the temporary directory (``TMPDIR``); the
free space is checked first and the log deleted at the end.

    python benchmarks/bench_report.py [--events 1000000] [--repeat 3]
        [--memory-events 10000000] [--quick] [--json]
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from itertools import islice
from pathlib import Path
from typing import Any

from _harness import figure, peak_rss_mb, print_targets, spread, target

from adapters.report import run_report
from adapters.report._digest import digest_log
from eventbus import (
    BudgetReport,
    CheckpointSaved,
    Event,
    HandlerFailed,
    HealthCheckTick,
    Report,
    RoundGathered,
    RunFinished,
    RunStarted,
    StateSnapshotted,
    TrainRunContext,
    WorkerFailure,
    WorkerGroupRestarted,
)
from eventbus._events import HandlerUsage
from eventbus.log import LogReader, LogRecorder

REPORT_TARGET_S = 10.0
MEMORY_TARGET_MB = 200.0
PAGE_TARGET_MB = 4.0
#: Events generated and written at a time.
CHUNK = 100_000
#: Bus seconds between two events, and of a health-check period (so ~400 events each).
EVENT_S = 1e-3
PERIOD_S = 0.4
CHECKPOINT_EVERY = 50
RUN_ID = "bench-report"
METRIC_NAMES = ("loss", "lr", "accuracy", "grad_norm", "tokens_per_s", "eval/loss", "weight_norm")
#: The handlers of a real run's bus: the gathering, 6 callbacks, the recorder's tap.
HANDLERS = (
    ("handlers.gathering.Gathering.on_report", "report", 18e-6),
    ("examples.demo_trainer.EarlyStopping.after_report", "round", 40e-6),
    ("examples.demo_trainer.MetricsLogger.after_report", "round", 120e-6),
    ("examples.demo_trainer.CheckpointKeeper.after_report", "round", 60e-6),
    ("examples.demo_trainer.WandbLogger.after_report", "round", 300e-6),
    ("examples.demo_trainer.ProgressBar.after_report", "round", 25e-6),
    ("examples.demo_trainer.LrMonitor.after_report", "round", 15e-6),
    ("eventbus.log.LogRecorder.record_many", "event", 1.5e-6),
)
FAILING_HANDLER = HANDLERS[4][0]


def fake_traceback(frames: int, error: str) -> str:
    """A traceback's text, about ``frames`` * 200 characters."""
    lines = ["Traceback (most recent call last):"]
    for i in range(frames):
        lines.append(
            f'  File "/opt/venv/lib/python3.12/site-packages/trainer/step_{i}.py", '
            f"line {40 + 7 * i}, in train_step_{i}"
        )
        lines.append(f"    loss = model(batch_{i}).loss  # shape (batch, seq, vocab)")
        lines.append("    ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^")
    lines.append(error)
    return "\n".join(lines) + "\n"


class RunLog:
    """The events of one synthetic run, stamped (``seq`` 0.., ``time`` 1 ms apart)."""

    def __init__(self, events: int, *, world_size: int = 4, metrics: int = 4, seed: int = 0):
        if events < 2:
            raise ValueError(f"a run log has at least 2 events (start, finish), got {events}")
        self.events = events
        self.world_size = world_size
        self.names = [
            METRIC_NAMES[i] if i < len(METRIC_NAMES) else f"metric_{i}" for i in range(metrics)
        ]
        self.rng = random.Random(seed)
        self.seq = 0
        self.rounds = max(1, events // (world_size + 1))  # about how many the run will have
        self.context = TrainRunContext(
            run_id=RUN_ID,
            name="llama-ft",
            world_size=world_size,
            config={"lr": 3e-4, "batch_size": 32, "epochs": 3, "model": "llama-7b"},
            start_time=1.7e9,
        )
        self.period = 0
        self.period_end = 1.0 + PERIOD_S
        self.reports_in_period = 0
        self.rounds_in_period = 0
        self.events_in_period = 0
        self.faults_pending = 0

    def _stamp(self) -> tuple[int, float]:
        seq = self.seq
        self.seq = seq + 1
        return seq, 1.0 + seq * EVENT_S

    def started(self) -> RunStarted:
        seq, at = self._stamp()
        return RunStarted(
            run_id=RUN_ID,
            name=self.context.name,
            world_size=self.world_size,
            config=dict(self.context.config),
            storage="/checkpoints/llama-ft",
            wall_time=1.7e9,
            seq=seq,
            time=at,
        )

    def finished(self) -> RunFinished:
        seq, at = self._stamp()
        return RunFinished(run_id=RUN_ID, status="finished", seq=seq, time=at)

    def _metrics(self, r: int) -> list[dict[str, float]]:
        """Each rank's metrics of round ``r``: a decaying loss, warmup then cosine lr..."""
        rng = self.rng
        progress = r / self.rounds
        decay = math.exp(-4.0 * progress)
        warm = 0.02
        lr = 3e-4 * (
            progress / warm
            if progress < warm
            else 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))
        )
        out = []
        for rank in range(self.world_size):
            spike = 6.0 if rng.random() < 2e-4 else 1.0
            values = {
                "loss": (0.3 + 2.2 * decay) * (1.0 + 0.06 * (rng.random() - 0.5)) * spike,
                "lr": lr,
                "accuracy": 0.95 - 0.6 * decay + 0.02 * (rng.random() - 0.5) - 0.001 * rank,
                "grad_norm": (1.0 + 0.8 * decay + 0.3 * rng.random()) * spike * spike,
                "tokens_per_s": 41_000.0 + 2_000.0 * rng.random(),
                "eval/loss": 0.35 + 2.1 * decay,
                "weight_norm": 180.0 + 20.0 * progress,
            }
            out.append(
                {name: values.get(name, rng.random()) for name in self.names}
                if len(self.names) != 4
                else {name: values[name] for name in METRIC_NAMES[:4]}
            )
        return out

    def _health(self, at: float) -> Iterator[Event]:
        """A period's tick and budget report, if the period is over."""
        if at < self.period_end:
            return
        rng = self.rng
        start, end = self.period_end - PERIOD_S, self.period_end
        period = self.period
        self.period += 1
        self.period_end += PERIOD_S
        seq, now = self._stamp()
        yield HealthCheckTick(period=period, start=start, end=end, seq=seq, time=now)
        budget = 0.1 * PERIOD_S
        usages = []
        total = 0.0
        for name, per, mean in HANDLERS:
            calls = {
                "report": self.reports_in_period,
                "round": self.rounds_in_period,
                "event": self.events_in_period,
            }[per]
            if not calls:
                continue
            took = mean * calls * (0.7 + 0.6 * rng.random())
            longest = took / calls * (2.0 + 8.0 * rng.random())
            # Now and then a callback runs past its 50 ms deadline, or is coalesced.
            timeouts = 1 if per == "round" and rng.random() < 0.002 else 0
            skipped = int(calls * 0.3) if per == "round" and rng.random() < 0.005 else 0
            faults = self.faults_pending if name == FAILING_HANDLER else 0
            if timeouts:
                longest = 0.05 + 0.02 * rng.random()
                took += longest
            total += took
            usages.append(
                HandlerUsage(
                    handler=name,
                    calls=calls,
                    total=took,
                    max=longest,
                    timeouts=timeouts,
                    faults=faults,
                    skipped=skipped,
                    budget=budget,
                    over_budget=took > budget,
                )
            )
        self.faults_pending = 0
        self.reports_in_period = self.rounds_in_period = self.events_in_period = 0
        seq, now = self._stamp()
        yield BudgetReport(
            period=period,
            start=start,
            end=end,
            budget=budget,
            total=total,
            fraction=total / PERIOD_S,
            handlers=tuple(usages),
            over_budget=tuple(u.handler for u in usages if u.over_budget),
            seq=seq,
            time=now,
        )

    def body(self) -> Iterator[Event]:
        """Everything between the start and the finish, as long as asked for."""
        world = self.world_size
        ranks = tuple(range(world))
        failure_at = self.events // 2
        faults_at = [self.events // 3, 2 * self.events // 3]
        r = 0
        while True:
            yield from self._health(1.0 + self.seq * EVENT_S)
            if failure_at >= 0 and self.seq >= failure_at:
                failure_at = -1
                seq, at = self._stamp()
                yield WorkerFailure(
                    run_id=RUN_ID,
                    rank=2 % world,
                    error_type="torch.OutOfMemoryError",
                    message="CUDA out of memory. Tried to allocate 2.00 GiB (GPU 2; 79.15 GiB "
                    "total capacity; 75.20 GiB already allocated)",
                    traceback=fake_traceback(10, "torch.OutOfMemoryError: CUDA out of memory."),
                    retryable=True,
                    seq=seq,
                    time=at,
                )
                seq, at = self._stamp()
                yield WorkerGroupRestarted(run_id=RUN_ID, world_size=world, seq=seq, time=at)
            metrics = self._metrics(r)
            for rank in ranks:
                seq, at = self._stamp()
                yield Report(
                    run_id=RUN_ID,
                    rank=rank,
                    world_size=world,
                    index=r,
                    metrics=metrics[rank],
                    seq=seq,
                    time=at,
                )
            seq, at = self._stamp()
            yield RoundGathered(
                context=self.context, round=r, ranks=ranks, metrics=metrics, seq=seq, time=at
            )
            self.reports_in_period += world
            self.rounds_in_period += 1
            self.events_in_period += world + 1
            if faults_at and self.seq >= faults_at[0]:
                faults_at.pop(0)
                self.faults_pending += 1
                seq, at = self._stamp()
                yield HandlerFailed(
                    handler=FAILING_HANDLER,
                    event_seq=seq - 1,
                    event_type="RoundGathered",
                    error_type="ConnectionError",
                    message="wandb.ai: HTTPSConnectionPool: Max retries exceeded (timed out)",
                    traceback=fake_traceback(5, "ConnectionError: Max retries exceeded"),
                    seq=seq,
                    time=at,
                )
            if r % CHECKPOINT_EVERY == CHECKPOINT_EVERY - 1:
                checkpoint = f"/checkpoints/llama-ft/checkpoint-{r:07d}"
                seq, at = self._stamp()
                yield CheckpointSaved(
                    run_id=RUN_ID,
                    checkpoint=checkpoint,
                    index=r,
                    ranks=ranks,
                    metrics=metrics[0],
                    seq=seq,
                    time=at,
                )
                seq, at = self._stamp()
                yield StateSnapshotted(
                    run_id=RUN_ID,
                    checkpoint=checkpoint,
                    path=f"{checkpoint}/eventbus-state.json",
                    keys=("EarlyStopping", "CheckpointKeeper", "LrMonitor"),
                    seq=seq,
                    time=at,
                )
            r += 1


def write_run_log(
    path: str | os.PathLike[str],
    events: int,
    *,
    world_size: int = 4,
    metrics: int = 4,
    seed: int = 0,
) -> int:
    """Write a synthetic run of exactly ``events`` events to ``path`` (``CHUNK`` at a
    time); returns how many were written."""
    run = RunLog(events, world_size=world_size, metrics=metrics, seed=seed)
    body = run.body()
    written = 0
    with LogRecorder(path, run_id=RUN_ID, fsync="never", batch_bytes=1 << 20) as recorder:
        recorder.write_many([run.started()])
        written += 1
        while written < events - 1:
            chunk = list(islice(body, min(CHUNK, events - 1 - written)))
            recorder.write_many(chunk)
            written += len(chunk)
        recorder.write_many([run.finished()])
        written += 1
    return written


# --- the timed runs -----------------------------------------------------------------------


def plain_read(path: Path) -> float:
    """Seconds for the floor: every event decoded, nothing done with it."""
    start = time.perf_counter()
    with LogReader(path) as reader:
        for _ in reader:
            pass
    return time.perf_counter() - start


def make_report(path: Path, page_path: Path) -> tuple[float, float, float, int]:
    """What ``eventbus report`` does: (digest s, render s, write s, page bytes)."""
    start = time.perf_counter()
    digest = digest_log(path)
    digested = time.perf_counter()
    page = run_report(digest)
    rendered = time.perf_counter()
    data = page.encode()
    page_path.write_bytes(data)
    written = time.perf_counter()
    return digested - start, rendered - digested, written - rendered, len(data)


def measure_report(n: int, repeat: int, tmp: Path) -> dict[str, Any]:
    log, page_path = tmp / "report.evlog", tmp / "report.html"
    started = time.perf_counter()
    written = write_run_log(log, n)
    write_s = time.perf_counter() - started
    plain_read(log)  # warm: both are timed over a file in the page cache
    reads: list[float] = []
    reports: list[float] = []
    parts: list[tuple[float, float, float]] = []
    page_bytes = 0
    for _ in range(repeat):
        gc.collect()
        reads.append(plain_read(log))
        gc.collect()
        digest_s, render_s, out_s, page_bytes = make_report(log, page_path)
        reports.append(digest_s + render_s + out_s)
        parts.append((digest_s, render_s, out_s))
    per_million = 1e6 / written
    log_bytes = log.stat().st_size
    log.unlink()
    page_path.unlink()
    return {
        "events": written,
        "repeat": repeat,
        "log_mb": round(log_bytes / 2**20, 1),
        "bytes_per_event": round(log_bytes / written, 1),
        "write_log_s": round(write_s, 2),
        "report_s": spread(reports, digits=2),
        "report_s_per_million": spread(reports, per_million, digits=2),
        "read_s_per_million": spread(reads, per_million, digits=2),
        "x_plain_read": spread([o / f for o, f in zip(reports, reads, strict=True)], digits=2),
        "digest_s_per_million": spread([p[0] for p in parts], per_million, digits=2),
        "render_s": spread([p[1] for p in parts], digits=3),
        "write_page_s": spread([p[2] for p in parts], digits=3),
        "page_mb": round(page_bytes / 2**20, 3),
    }


def child(*args: str) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, __file__, *args], capture_output=True, text=True, check=True
    )
    figures: dict[str, Any] = json.loads(done.stdout)
    return figures


def disk_needed(m: int, tmp: Path) -> int:
    """Bytes a log of ``m`` events takes (from a sample's bytes per event), with room."""
    sample = tmp / "sample.evlog"
    n = write_run_log(sample, 20_000)
    per_event = sample.stat().st_size / n
    sample.unlink()
    return int(per_event * m * 1.1) + 64 * 2**20


def check_disk(m: int, tmp: Path) -> None:
    needed, free = disk_needed(m, tmp), shutil.disk_usage(tmp).free
    if free < needed:
        sys.exit(
            f"bench_report.py: not enough disk space in {tmp} for the memory check: a log of "
            f"{m:,} events needs about {needed / 2**30:.1f} GB, {free / 2**30:.1f} GB is free "
            "(point TMPDIR at a roomier disk, or pass --memory-events)"
        )


def measure_memory(m: int, tmp: Path) -> dict[str, Any]:
    log, page_path = tmp / "memory.evlog", tmp / "memory.html"
    started = time.perf_counter()
    written = write_run_log(log, m)
    write_s = time.perf_counter() - started
    try:
        report = child("--report-rss", str(log), str(page_path))
        read = child("--read-rss", str(log))
        log_mb = round(log.stat().st_size / 2**20, 1)
    finally:
        log.unlink(missing_ok=True)
        page_path.unlink(missing_ok=True)
    return {
        "events": written,
        "log_mb": log_mb,
        "write_log_s": round(write_s, 2),
        "report": report,
        "read": read,
    }


# --- in a fresh process ---------------------------------------------------------------------


def report_rss(path: str, page_path: str) -> None:
    """In a fresh process: the report of the log, peak RSS before and after."""
    before = peak_rss_mb()
    digest_s, render_s, out_s, page_bytes = make_report(Path(path), Path(page_path))
    print(
        json.dumps(
            {
                "peak_rss_mb_before": round(before, 1),
                "peak_rss_mb": round(peak_rss_mb(), 1),
                "page_mb": round(page_bytes / 2**20, 3),
                "seconds": round(digest_s + render_s + out_s, 2),
            }
        )
    )


def read_rss(path: str) -> None:
    """In a fresh process: the plain read of the log, peak RSS before and after."""
    before = peak_rss_mb()
    seconds = plain_read(Path(path))
    print(
        json.dumps(
            {
                "peak_rss_mb_before": round(before, 1),
                "peak_rss_mb": round(peak_rss_mb(), 1),
                "seconds": round(seconds, 2),
            }
        )
    )


# --- output -----------------------------------------------------------------------------------


def targets_of(results: dict[str, Any]) -> list[dict[str, Any]]:
    rep, mem = results["report"], results["memory"]
    scaled = rep["events"] != 1_000_000
    report_name = (
        f"report of a log (s per 1M events, from {rep['events'] // 1000}k)"
        if scaled
        else "report of a log of 1M events (s)"
    )
    read_peer = (
        f"LogReader loop {rep['read_s_per_million']['median']:.2f} s per 1M "
        f"(report {rep['x_plain_read']['median']:.2f}x)"
    )
    big = f"{mem['events']:,} events"
    return [
        target(
            report_name, rep["report_s_per_million"]["median"], REPORT_TARGET_S, "s", peer=read_peer
        ),
        target(
            f"peak RSS making the report of {big} (MB)",
            mem["report"]["peak_rss_mb"],
            MEMORY_TARGET_MB,
            "MB",
            peer=f"LogReader loop {mem['read']['peak_rss_mb']} MB",
        ),
        target(
            f"report page size, {big} (MB)",
            mem["report"]["page_mb"],
            PAGE_TARGET_MB,
            "MB",
            peer=f"{rep['events']:,} events: {rep['page_mb']} MB",
        ),
    ]


def print_table(results: dict[str, Any]) -> None:
    rep, mem = results["report"], results["memory"]
    print(
        f"log: {rep['events']:,} events of a run at world size 4, {rep['bytes_per_event']} bytes "
        f"per record ({rep['log_mb']} MB, written in {rep['write_log_s']} s); median (min-max) "
        f"of {rep['repeat']} interleaved runs  (pid {os.getpid()})"
    )
    print(
        f"report:       {figure(rep['report_s'], ' s')} = "
        f"{figure(rep['report_s_per_million'], ' s')} per 1M events = "
        f"{figure(rep['x_plain_read'], 'x')} the plain read"
    )
    print(
        f"  of which:   digest {figure(rep['digest_s_per_million'], ' s')} per 1M, render "
        f"{figure(rep['render_s'], ' s')}, write {figure(rep['write_page_s'], ' s')}; page "
        f"{rep['page_mb']} MB"
    )
    print(f"plain read:   {figure(rep['read_s_per_million'], ' s')} per 1M events (LogReader loop)")
    report, read = mem["report"], mem["read"]
    print(
        f"memory:       {mem['events']:,} events ({mem['log_mb']} MB log, written in "
        f"{mem['write_log_s']} s): report peak RSS {report['peak_rss_mb']} MB (before "
        f"{report['peak_rss_mb_before']} MB, {report['seconds']} s), page {report['page_mb']} MB; "
        f"plain read peak RSS {read['peak_rss_mb']} MB ({read['seconds']} s)"
    )
    print_targets(targets_of(results))
    print(f"({results['seconds']:.0f} s in all)")


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--memory-events", type=int, default=10_000_000)
    parser.add_argument(
        "--quick", action="store_true", help="200,000 events, 1 repeat, memory 1,000,000"
    )
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.add_argument("--report-rss", nargs=2, help=argparse.SUPPRESS)
    parser.add_argument("--read-rss", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.report_rss:
        report_rss(*args.report_rss)
        return 0
    if args.read_rss:
        read_rss(args.read_rss)
        return 0
    if args.quick:
        args.events, args.repeat, args.memory_events = 200_000, 1, 1_000_000
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="bench_report") as tmp:
        check_disk(args.memory_events, Path(tmp))
        results: dict[str, Any] = {"report": measure_report(args.events, args.repeat, Path(tmp))}
        results["memory"] = measure_memory(args.memory_events, Path(tmp))
    results["seconds"] = round(time.perf_counter() - started, 1)
    if args.json:
        results["python"] = sys.version.split()[0]
        results["targets"] = targets_of(results)
        json.dump(results, sys.stdout, indent=2)
        print()
        return 0
    print_table(results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
