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
  checkpoint folder, saved into the run's ``state_dir``: the run keeps it
  there, nothing is copied), ``reporter.should_stop`` read every step; rank 0 hosts
  the run with ``MetricsLogger`` (the same JSONL lines), ``BestCheckpoints``,
  ``EarlyStopping`` (never stopping), the event log and ``state_dir``. The
  last step ends with ``reporter.sync()``: the timing takes in the run's work
  on every round (rank 0's callbacks run at each of its worker's reports).

The conditions alternate, job by job (``--pairs`` of each; the order swaps
every pair). Each rank times its steps after ``--warmup`` untimed ones; a
job's figure is the mean of its ranks' steps/s. Reported: steps/s per
condition and the % lost, pair by pair (median and range); and, per step,
what the engine adds to plain DDP's figures, pair by pair: each rank's CPU
time (every thread of the process), torchrun's agent's (it hosts the c10d
store), and each rank's time between two DDP steps, wall and main-thread
CPU (the other rank waits for it at the next all-reduce). On a machine
shared with other work, steps/s swing with the load; the time between steps
says what the engine itself costs.

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
        self.dist = dist
        self.model = DistributedDataParallel(model)
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.01)
        self.inputs = torch.randn(BATCH, 64)
        self.targets = torch.randn(BATCH, 1)
        self.config = config
        #: Wall and main-thread CPU seconds: in the DDP steps so far, and at the warmup's
        #: end (process, main thread, agent, in the steps).
        self.in_steps = [0.0, 0.0]
        self.started: dict[str, float] = {}

    def step(self) -> float:
        wall, cpu = time.perf_counter(), time.thread_time()
        self.optimizer.zero_grad()
        loss = self.torch.nn.functional.mse_loss(self.model(self.inputs), self.targets)
        loss.backward()
        self.optimizer.step()
        self.in_steps[0] += time.perf_counter() - wall
        self.in_steps[1] += time.thread_time() - cpu
        return float(loss.item())

    def checkpoint(self, step: int, root: Path) -> str | None:
        """Rank 0 saves the model at a checkpoint step (into a folder under ``root``);
        else None."""
        if self.rank != 0 or (step + 1) % self.config["save_every"]:
            return None
        folder = root / f"step_{step:06d}"
        folder.mkdir(parents=True, exist_ok=True)
        self.torch.save(self.model.module.state_dict(), folder / "model.pt")
        return str(folder)

    def timing(self, step: int) -> None:
        if step + 1 == self.config["warmup"]:
            self.started = self.clocks()
        elif step + 1 == self.config["steps"]:
            timed = self.config["steps"] - self.config["warmup"]
            ms = {k: (v - self.started[k]) / timed * 1000 for k, v in self.clocks().items()}
            figures = {
                "rate": 1000 / ms["wall"],
                "cpu_ms": ms["cpu"],
                "between_ms": ms["wall"] - ms["wall_in_steps"],
                "between_cpu_ms": ms["main"] - ms["main_in_steps"],
                "agent_ms": ms["agent"],
            }
            Path(self.config["out"], f"rank{self.rank}.json").write_text(json.dumps(figures))

    def end(self) -> None:
        """Leave the group together: a rank that destroys it while the other still uses it
        (or one left to the exit) may abort the other (gloo: ``terminate called``)."""
        self.dist.barrier()
        self.dist.destroy_process_group()

    def clocks(self) -> dict[str, float]:
        return {
            "wall": time.perf_counter(),
            "cpu": time.process_time(),
            "main": time.thread_time(),
            "agent": agent_cpu_s(),
            "wall_in_steps": self.in_steps[0],
            "main_in_steps": self.in_steps[1],
        }


def agent_cpu_s() -> float:
    """The CPU time of torchrun's agent (this worker's parent), which hosts the c10d
    store: what the transport costs there is taken from training too."""
    fields = Path(f"/proc/{os.getppid()}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def plain(config: dict[str, Any]) -> None:
    steps = Steps(config)
    with Path(config["out"], f"metrics-{steps.rank}.jsonl").open("a") as lines:
        for step in range(config["steps"]):
            loss = steps.step()
            steps.checkpoint(step, Path(config["out"], "saved"))
            lines.write(json.dumps({"rank": steps.rank, "step": step, "loss": loss}) + "\n")
            lines.flush()
            steps.timing(step)
    steps.end()


def ours(config: dict[str, Any]) -> None:
    import anyio
    from _harness import engine_callbacks

    from adapters.torchrun import TorchrunEngine
    from handlers import Reporter, open_run

    steps = Steps(config)

    async def train(reporter: Reporter) -> None:
        for step in range(config["steps"]):
            loss = steps.step()
            metrics = {"rank": reporter.rank, "step": step, "loss": loss}
            checkpoint = steps.checkpoint(step, Path(config["out"], "run", "saved"))
            await reporter.report(metrics, checkpoint=checkpoint)
            if step + 1 == config["steps"]:  # the timing ends once the run has the rounds
                await reporter.sync()
            steps.timing(step)
            if reporter.should_stop:
                return

    async def main() -> None:
        out = Path(config["out"])
        stream = (out / "metrics.jsonl").open("a")
        callbacks = engine_callbacks(stream)
        async with open_run(
            world_size=WORKERS,
            callbacks=callbacks,
            state_dir=out / "run",
            log=out / "events.evlog",
            engine=TorchrunEngine(),
        ) as run:
            await run.workers(train)

    anyio.run(main)
    steps.end()


def job(condition: str, config: dict[str, Any], out: Path) -> tuple[float, dict[str, float]]:
    """One torchrun job of ``condition``: the mean of its ranks' steps/s, and ms per
    step: each rank's CPU time (every thread of the process) and torchrun's agent's
    (the store's host); each rank's time between two DDP steps (its main thread's
    reporting, rank 0's callbacks and checkpoints: the other rank waits for it at the
    next all-reduce), wall and CPU."""
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
    ms = {f"rank {rank} CPU": f["cpu_ms"] for rank, f in enumerate(figures)}
    ms["torchrun agent CPU"] = figures[0]["agent_ms"]  # one agent for both ranks
    for rank, f in enumerate(figures):
        ms[f"rank {rank} between steps"] = f["between_ms"]
        ms[f"rank {rank} between steps, CPU"] = f["between_cpu_ms"]
    return float(statistics.mean(f["rate"] for f in figures)), ms


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
    per_step: dict[str, dict[str, list[float]]] = {"plain": {}, "ours": {}}
    lost: list[float] = []
    added: dict[str, list[float]] = {}  # ms per step the engine adds, by what, pair by pair
    with tempfile.TemporaryDirectory() as scratch:
        for pair in range(pairs):
            order = ("plain", "ours") if pair % 2 == 0 else ("ours", "plain")
            got = {c: job(c, config, Path(scratch, f"{pair}-{c}")) for c in order}
            for condition, (rate, figures) in got.items():
                rates[condition].append(rate)
                for what, ms in figures.items():
                    per_step[condition].setdefault(what, []).append(ms)
            lost.append((1 - got["ours"][0] / got["plain"][0]) * 100)
            for what, ms in got["ours"][1].items():
                added.setdefault(what, []).append(ms - got["plain"][1][what])
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
    ms_per_step = {
        c: {what: spread(ms, digits=3) for what, ms in figures.items()}
        for c, figures in per_step.items()
    }
    ms_added = {what: spread(ms, digits=3) for what, ms in added.items()}
    result: dict[str, Any] = {
        "config": config,
        "pairs": pairs,
        "steps_per_s": per_condition,
        "ms_per_step": ms_per_step,
        "ms_added": ms_added,
        "lost_pct": lost_pct,
        "targets": rows,
    }
    if args.json:
        print(json.dumps(result))
        return
    for condition, values in per_condition.items():
        print(f"{condition:6} {figure(values)} steps/s")
    print(f"lost:  {figure(lost_pct, '%')}, pair by pair")
    print("ms per step: plain DDP's (median), what the engine adds (median, pair-by-pair range)")
    for what, v in ms_added.items():
        plain_ms = ms_per_step["plain"][what]["median"]
        pairs_range = f"{v['min']:+.3f} to {v['max']:+.3f}"
        print(f"  {what:26} {plain_ms:6.3f}  {v['median']:+.3f} ({pairs_range})")
    print_targets(rows)


if __name__ == "__main__":
    main()
