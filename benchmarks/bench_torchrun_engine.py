"""What ``open_run(engine=TorchrunEngine())`` costs a torchrun DDP job, against plain DDP.

``torchrun --standalone --nproc-per-node 2`` (CPU, gloo), the same step in
both conditions: a small MLP (``--hidden`` wide, batch 64, one torch
thread) under ``DistributedDataParallel`` (an all-reduce per step), one
report per step, a checkpoint (the model's ``state_dict``) every
``--save-every`` steps.

- ``plain``: DDP with hand-written reporting: each rank appends its step's
  metrics to a JSONL file, rank 0 saves the checkpoint into the run folder;
- ``ours``: the same loop as ``async def train(reporter)``:
  ``reporter.report(metrics, checkpoint=...)`` every step (rank 0 names the
  checkpoint folder), ``reporter.should_stop`` read every step; rank 0 hosts
  the run with ``MetricsLogger`` (the same JSONL lines), ``BestCheckpoints``,
  ``EarlyStopping`` (never stopping), the event log and ``state_dir``.

The conditions alternate, job by job (``--pairs`` of each; the order swaps
every pair). Each rank times its steps after ``--warmup`` untimed ones; a
job's figure is the mean of its ranks' steps/s. Reported: steps/s per
condition and the % lost, pair by pair (median and range); and each rank's
CPU time per step (every thread of the process) and what the engine adds to
it, pair by pair: on a machine shared with other work, steps/s swing with
the load, while CPU time per step says what the engine itself costs.

    python benchmarks/bench_torchrun_engine.py [--quick] [--json] [--pairs N] [--steps N]
        [--hidden N] [--save-every N]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

WORKERS = 2
BATCH = 64
TARGET_LOST_PCT = 2.0


class Steps:
    """The DDP step both conditions run, and the timing of a rank's steps."""

    def __init__(self, config: dict[str, Any]) -> None:
        import torch
        import torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel

        torch.set_num_threads(1)
        dist.init_process_group("gloo")  # the user's own group: the engine does not touch it
        self.rank = dist.get_rank()
        torch.manual_seed(self.rank)
        hidden = config["hidden"]
        model = torch.nn.Sequential(
            torch.nn.Linear(64, hidden),
            torch.nn.ReLU(),
            torch.nn.Linear(hidden, hidden),
            torch.nn.ReLU(),
            torch.nn.Linear(hidden, 1),
        )
        self.torch = torch
        self.model = DistributedDataParallel(model)
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.01)
        self.inputs = torch.randn(BATCH, 64)
        self.targets = torch.randn(BATCH, 1)
        self.config = config
        self.started = 0.0
        self.cpu_started = 0.0

    def step(self) -> float:
        self.optimizer.zero_grad()
        loss = self.torch.nn.functional.mse_loss(self.model(self.inputs), self.targets)
        loss.backward()
        self.optimizer.step()
        return float(loss.item())

    def checkpoint(self, step: int) -> str | None:
        """Rank 0 saves the model at a checkpoint step (into its folder); else None."""
        if self.rank != 0 or (step + 1) % self.config["save_every"]:
            return None
        folder = Path(self.config["out"], "saved", f"step_{step:06d}")
        folder.mkdir(parents=True, exist_ok=True)
        self.torch.save(self.model.module.state_dict(), folder / "model.pt")
        return str(folder)

    def timing(self, step: int) -> None:
        if step + 1 == self.config["warmup"]:
            self.started, self.cpu_started = time.perf_counter(), time.process_time()
        elif step + 1 == self.config["steps"]:
            timed = self.config["steps"] - self.config["warmup"]
            rate = timed / (time.perf_counter() - self.started)
            cpu_ms = (time.process_time() - self.cpu_started) / timed * 1000
            figures = {"rate": rate, "cpu_ms": cpu_ms}
            Path(self.config["out"], f"rank{self.rank}.json").write_text(json.dumps(figures))


def plain(config: dict[str, Any]) -> None:
    steps = Steps(config)
    with Path(config["out"], f"metrics-{steps.rank}.jsonl").open("a") as lines:
        for step in range(config["steps"]):
            loss = steps.step()
            steps.checkpoint(step)
            lines.write(json.dumps({"rank": steps.rank, "step": step, "loss": loss}) + "\n")
            lines.flush()
            steps.timing(step)


def ours(config: dict[str, Any]) -> None:
    import logging

    import anyio
    import structlog

    from adapters.torchrun import TorchrunEngine
    from handlers import BestCheckpoints, EarlyStopping, MetricsLogger, Reporter, open_run

    steps = Steps(config)

    async def train(reporter: Reporter) -> None:
        for step in range(config["steps"]):
            loss = steps.step()
            metrics = {"rank": reporter.rank, "step": step, "loss": loss}
            await reporter.report(metrics, checkpoint=steps.checkpoint(step))
            steps.timing(step)
            if reporter.should_stop:
                return

    async def main() -> None:
        out = Path(config["out"])
        stream = (out / "metrics.jsonl").open("a")
        wrapper: Any = structlog.make_filtering_bound_logger(logging.INFO)
        lines = wrapper(structlog.WriteLogger(stream), [structlog.processors.JSONRenderer()], {})
        callbacks = [
            EarlyStopping("loss", patience=10**6),
            BestCheckpoints("loss", k=3),
            MetricsLogger(logger=lines),
        ]
        async with open_run(
            world_size=WORKERS,
            callbacks=callbacks,
            state_dir=out / "run",
            log=out / "events.evlog",
            engine=TorchrunEngine(),
        ) as run:
            await run.workers(train)

    anyio.run(main)


def job(condition: str, config: dict[str, Any], out: Path) -> tuple[float, list[float]]:
    """One torchrun job of ``condition``: the mean of its ranks' steps/s, and each
    rank's CPU time per step (ms, every thread of the process)."""
    out.mkdir(parents=True)
    (out / "config.json").write_text(json.dumps({**config, "out": str(out)}))
    command = [
        str(Path(sys.executable).with_name("torchrun")),
        "--standalone",
        "--nproc-per-node",
        str(WORKERS),
        __file__,
        "--worker",
        condition,
        str(out / "config.json"),
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "LOGLEVEL": "ERROR"}
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"{condition} job failed:\n{done.stdout[-2000:]}{done.stderr[-3000:]}")
    figures = [json.loads((out / f"rank{rank}.json").read_text()) for rank in range(WORKERS)]
    return float(statistics.mean(f["rate"] for f in figures)), [f["cpu_ms"] for f in figures]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--pairs", type=int)
    parser.add_argument("--steps", type=int)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--save-every", type=int, default=50)
    parser.add_argument("--worker", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        condition, path = args.worker
        (plain if condition == "plain" else ours)(json.loads(Path(path).read_text()))
        return
    import tempfile

    sys.path.insert(0, str(Path(__file__).parent))
    from _harness import figure, print_targets, spread, target

    pairs = args.pairs or (2 if args.quick else 4)
    total = args.steps or (600 if args.quick else 2000)
    config = {
        "steps": total,
        "warmup": total // 10,
        "hidden": args.hidden,
        "save_every": args.save_every,
    }
    rates: dict[str, list[float]] = {"plain": [], "ours": []}
    cpu: dict[str, list[list[float]]] = {"plain": [], "ours": []}
    lost: list[float] = []
    added: list[list[float]] = [
        [] for _ in range(WORKERS)
    ]  # CPU ms per step the engine adds, per rank
    with tempfile.TemporaryDirectory() as scratch:
        for pair in range(pairs):
            order = ("plain", "ours") if pair % 2 == 0 else ("ours", "plain")
            got = {c: job(c, config, Path(scratch, f"{pair}-{c}")) for c in order}
            for condition, (rate, cpu_ms) in got.items():
                rates[condition].append(rate)
                cpu[condition].append(cpu_ms)
            lost.append((1 - got["ours"][0] / got["plain"][0]) * 100)
            for rank in range(WORKERS):
                added[rank].append(got["ours"][1][rank] - got["plain"][1][rank])
    lost_pct = spread(lost)
    rows = [
        target(
            "torchrun engine: steps/s lost to plain DDP",
            lost_pct["median"],
            TARGET_LOST_PCT,
            "%",
            peer="plain DDP, hand-written reporting",
        )
    ]
    per_condition = {c: spread(v) for c, v in rates.items()}
    cpu_per_step = {
        c: [spread([v[r] for v in cpu[c]], digits=2) for r in range(WORKERS)] for c in cpu
    }
    cpu_added = [spread(a, digits=2) for a in added]
    result: dict[str, Any] = {
        "config": config,
        "pairs": pairs,
        "steps_per_s": per_condition,
        "cpu_ms_per_step": cpu_per_step,
        "cpu_ms_added": cpu_added,
        "lost_pct": lost_pct,
        "targets": rows,
    }
    if args.json:
        print(json.dumps(result))
        return
    for condition, values in per_condition.items():
        ranks = ", ".join(f"rank {r} {v['median']}" for r, v in enumerate(cpu_per_step[condition]))
        print(
            f"{condition:6} {values['median']} steps/s ({values['min']}-{values['max']}); "
            f"CPU ms per step: {ranks}"
        )
    print(f"lost:  {lost_pct['median']}% ({lost_pct['min']}-{lost_pct['max']}), pair by pair")
    for rank, values in enumerate(cpu_added):
        print(f"CPU ms per step the engine adds on rank {rank}: {figure(values)}")
    print_targets(rows)


if __name__ == "__main__":
    main()
