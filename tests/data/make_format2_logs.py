"""Write ``format2-run.evlog`` and ``format2-run.jsonl``: a run's logs as format 2 wrote them.

The files beside this script were written by this script running against the code
of commit 3ec6167 (format version 2, where every ``RoundGathered`` record holds its
whole run context), before the format changed, and are kept as they are: the tests
read them to check that the logs written before the change still read, round for
round, as logs written now. Rerunning it against today's code writes today's format,
so do not rerun it to refresh them:

    PYTHONPATH=<a checkout of 3ec6167> python tests/data/make_format2_logs.py OUT_DIR

The run: world size 4, a config of 20 keys, 5 metrics per report, a checkpoint every
4 rounds, one NaN gradient norm, rank 2 failing once (the group restarts from its
latest checkpoint), 12 rounds; then the run resumed from its checkpoint of round 7
for 14 rounds, appending to the same log (so rounds 8 to 11 of the first part are
rolled back).
"""

from __future__ import annotations

import json
import math
import os
import sys
from pathlib import Path
from typing import Any

import anyio

from handlers import EarlyStopping, Reporter, UserCallback, open_run

CONFIG: dict[str, Any] = {
    "model": "llama-3-8b",
    "dataset": "c4/en",
    "seed": 1234,
    "lr": 3e-4,
    "lr_schedule": "cosine",
    "warmup_steps": 2000,
    "weight_decay": 0.1,
    "beta1": 0.9,
    "beta2": 0.95,
    "eps": 1e-8,
    "batch_size": 512,
    "micro_batch_size": 4,
    "seq_len": 4096,
    "grad_clip": 1.0,
    "precision": "bf16",
    "zero_stage": 3,
    "activation_checkpointing": True,
    "checkpoint_every": 4,
    "eval_every": 1000,
    "tags": ["ablation", "long-context"],
}


class Noop(UserCallback):
    def after_report(self, run_context, metrics, checkpoint):  # type: ignore[no-untyped-def]
        pass


async def one_run(log: Path, out: Path, *, steps: int, fail: bool, resume: Path | None) -> None:
    async def train(reporter: Reporter) -> None:
        step = 0
        if reporter.latest_checkpoint is not None:  # restarted or resumed: from its checkpoint
            saved = Path(reporter.latest_checkpoint, f"rank_{reporter.rank}.json").read_text()  # noqa: ASYNC240
            step = json.loads(saved)["step"] + 1
        while step < steps and not reporter.should_stop:
            if fail and reporter.rank == 2 and reporter.attempt == 0 and step == 6:
                raise RuntimeError("simulated failure")
            checkpoint = None
            if step % 4 == 3:
                folder = out / f"step_{step:04d}"
                folder.mkdir(exist_ok=True)
                (folder / f"rank_{reporter.rank}.json").write_text(json.dumps({"step": step}))
                checkpoint = str(folder)
            loss = 2.0 / (1 + step) + 0.01 * reporter.rank
            metrics = {
                "loss": loss,
                "lr": 3e-4 * (step + 1) / 12,
                "grad_norm": math.nan if (step, reporter.rank) == (5, 0) else 1.5 - 0.05 * step,
                "tokens_per_s": 41000.0 + 10 * reporter.rank,
                "step": step,
            }
            await reporter.report(metrics, checkpoint=checkpoint)
            step += 1
            await anyio.sleep(0.001 * (1 + reporter.rank))

    async with open_run(
        world_size=4,
        callbacks=[Noop(), EarlyStopping("loss", patience=100)],
        name="format2",
        run_id="format2-run",
        config=CONFIG,
        storage=out,
        state_dir=out,
        log=log,
        period=0.05,
        resume_from=resume,
    ) as run:
        await run.workers(train, max_restarts=1)


async def main(target: Path) -> None:
    os.chdir(target)  # the checkpoints' paths in the logs are relative: run.evlog.d/...
    for suffix in (".evlog", ".jsonl"):
        out = Path(f"run{suffix}.d")
        out.mkdir(parents=True, exist_ok=True)  # noqa: ASYNC240
        log = Path(f"format2-run{suffix}")
        await one_run(log, out, steps=12, fail=True, resume=None)
        await one_run(log, out, steps=14, fail=False, resume=out / "step_0007")


if __name__ == "__main__":
    anyio.run(main, Path(sys.argv[1]))
