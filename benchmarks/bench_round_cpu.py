"""The CPU a local run spends per round: what ``open_run`` adds to a training loop.

Two anyio tasks (the workers) each make ``--steps`` steps of nothing but a report:
``await reporter.report({"loss": x, "step": i})``, then ``reporter.should_stop`` read,
then a yield to the other task. The run has ``EarlyStopping`` (never stopping),
``BestCheckpoints``, ``MetricsLogger`` (a JSONL file through structlog), the event
log and a ``state_dir``: what rank 0 of ``bench_torchrun_engine.py`` hosts, without
the transport. ``plain`` is the same loop without the run, reporting by hand as
``bench_torchrun_engine.py``'s ``plain`` does (each step's line appended to a JSONL
file and flushed, a flag read, the yield). Conditions:

- ``run``: no checkpoints;
- ``run-sync``: the same, each report followed by ``await reporter.sync()`` (as
  data-parallel ranks meet at every step, and torchrun's rank 0 waits for each round);
- ``run-ckpt``: rank 0 saves a small file into the state dir every ``--save-every``
  steps and reports it (a snapshot of the callbacks' states each time).

Reported: the process's CPU time (``time.process_time``) per round, median over
``--repeat`` runs (the conditions interleaved), and what the run adds to ``plain``.
``--profile`` prints a cProfile of one ``run`` (or ``--profile run-ckpt``), by tottime.

    python benchmarks/bench_round_cpu.py [--steps 5000] [--repeat 3] [--save-every 50]
        [--profile [run|run-sync|run-ckpt]] [--json]
"""

from __future__ import annotations

import argparse
import cProfile
import json
import logging
import pstats
import statistics
import sys
import tempfile
import time
from pathlib import Path

import anyio
import anyio.lowlevel
from _harness import engine_callbacks

from eventbus import configure_logging
from handlers import Reporter, open_run

WORKERS = 2
CONDITIONS = ("plain", "run", "run-sync", "run-ckpt")


async def plain(steps: int, out: Path, save_every: int) -> int:
    stop = False

    async def worker(rank: int) -> None:
        with (out / f"metrics-{rank}.jsonl").open("a") as lines:
            for step in range(steps):
                metrics = {"rank": rank, "step": step, "loss": 1.0 / (step + 1)}
                lines.write(json.dumps(metrics) + "\n")
                lines.flush()
                if stop:
                    return
                await anyio.lowlevel.checkpoint()

    async with anyio.create_task_group() as group:
        for rank in range(WORKERS):
            group.start_soon(worker, rank)
    return steps


async def through_run(steps: int, out: Path, save_every: int, sync: bool = False) -> int:
    saved = out / "run" / "saved"

    async def train(reporter: Reporter) -> None:
        for step in range(steps):
            checkpoint = None
            if save_every and reporter.rank == 0 and (step + 1) % save_every == 0:
                checkpoint = saved / f"step-{step}"
                checkpoint.mkdir(parents=True)
                (checkpoint / "model.pt").write_bytes(b"w" * 64)
            await reporter.report({"loss": 1.0 / (step + 1), "step": step}, checkpoint=checkpoint)
            if sync:
                await reporter.sync()
            if reporter.should_stop:
                return
            await anyio.lowlevel.checkpoint()

    with (out / "metrics.jsonl").open("a") as stream:
        callbacks = engine_callbacks(stream)
        async with open_run(
            world_size=WORKERS,
            callbacks=callbacks,
            state_dir=out / "run",
            log=out / "events.evlog",
        ) as run:
            await run.workers(train)
    rounds = run.result.rounds
    assert rounds == steps, (rounds, steps)
    return rounds


def once(condition: str, steps: int, save_every: int) -> tuple[float, int]:
    """CPU seconds of one ``condition``, and its rounds."""
    with tempfile.TemporaryDirectory() as folder:
        out = Path(folder)
        every = save_every if condition == "run-ckpt" else 0
        start = time.process_time()
        if condition == "plain":
            rounds = anyio.run(plain, steps, out, every)
        else:
            rounds = anyio.run(through_run, steps, out, every, condition == "run-sync")
        return time.process_time() - start, rounds


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--steps", type=int, default=5000, help="reports per worker")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--save-every", type=int, default=50)
    parser.add_argument("--profile", nargs="?", const="run", choices=CONDITIONS[1:])
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    configure_logging(logging.ERROR)  # the run's end and budget lines: not what is measured
    if args.profile:
        profile = cProfile.Profile()
        profile.enable()
        once(args.profile, args.steps, args.save_every)
        profile.disable()
        pstats.Stats(profile).sort_stats("tottime").print_stats(40)
        return 0
    us: dict[str, list[float]] = {c: [] for c in CONDITIONS}
    for _ in range(args.repeat):
        for condition in CONDITIONS:
            seconds, rounds = once(condition, args.steps, args.save_every)
            us[condition].append(seconds / rounds * 1e6)
    median = {c: statistics.median(v) for c, v in us.items()}
    added = {c: median[c] - median["plain"] for c in CONDITIONS[1:]}
    if args.json:
        json.dump({"steps": args.steps, "us_per_round": median, "added_us": added}, sys.stdout)
        print()
        return 0
    print(
        f"Python {sys.version.split()[0]}, {WORKERS} workers x {args.steps} reports, "
        f"CPU µs per round, median of {args.repeat} (min-max)"
    )
    for condition in CONDITIONS:
        values = us[condition]
        extra = f"  (+{added[condition]:.1f} over plain)" if condition in added else ""
        print(
            f"{condition:>9}: {median[condition]:7.1f} ({min(values):.1f}-{max(values):.1f}){extra}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
