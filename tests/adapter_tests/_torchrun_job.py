"""One deterministic job, run by ``test_torchrun.py`` under torchrun and on the local engine.

``python _torchrun_job.py CONFIG.json`` (every torchrun process runs it):
each rank reports ``{"rank", "step", "loss"}`` every step and syncs (unless
``sync`` is false), rank 0 checkpoints every ``save_every`` steps and when
told to (a temporary folder: the run copies it in); a ``StopAfter`` stops
the run after ``stop_after`` rounds; a step takes ``step_s`` seconds at
least, if given. Rank 0 (the run's host) writes ``summary-<attempt>.json``:
status, rounds, failures, the counts of ``before_run``/``after_run``, the
stateful callback's state; every rank writes ``stop-<rank>.json``: the step
at which it saw ``should_stop``.
"""

from __future__ import annotations

import json
import math
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

import anyio
import msgspec
from _callbacks import StopAfter  # beside this script: on the path when torchrun runs it

from eventbus import RunResult, StatefulCallback, TrainRunContext
from handlers import Reporter, UserCallback, open_run


class Recorder(UserCallback):
    """What the hooks received, in this process."""

    def __init__(self) -> None:
        self.rounds: list[list[dict[str, Any]]] = []
        self.exceptions: list[dict[str, list[str]]] = []
        self.before = 0
        self.after = 0

    def before_run(self, run_context: TrainRunContext) -> None:
        self.before += 1

    def after_report(
        self, run_context: TrainRunContext, metrics: list[dict[str, Any]], checkpoint: str | None
    ) -> None:
        # NaN, as it arrived, written so that rounds compare (NaN is unequal to itself).
        self.rounds.append([{k: _nan_named(v) for k, v in m.items()} for m in metrics])

    def after_exception(
        self, run_context: TrainRunContext, worker_exceptions: dict[int, Exception]
    ) -> None:
        self.exceptions.append(
            {str(rank): [type(exc).__name__, str(exc)] for rank, exc in worker_exceptions.items()}
        )

    def after_run(self, run_context: TrainRunContext, result: RunResult) -> None:
        self.after += 1


def _nan_named(value: Any) -> Any:
    return "NaN" if isinstance(value, float) and math.isnan(value) else value


class Counter(UserCallback, StatefulCallback):
    """A stateful callback: the rounds it saw and the last step, across resumes."""

    state_attributes = ("rounds", "last_step", "loss_sum")

    def __init__(self) -> None:
        self.rounds = 0
        self.last_step = -1
        self.loss_sum = 0.0

    def after_report(
        self, run_context: TrainRunContext, metrics: list[dict[str, Any]], checkpoint: str | None
    ) -> None:
        self.rounds += 1
        self.last_step = metrics[0]["step"]
        self.loss_sum += sum(m["loss"] for m in metrics)

    @property
    def for_workers(self) -> dict[str, Any]:
        return {"rounds": self.rounds}


def attempt() -> int:
    return int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))


def deeply_nested_report(run_id: str, nonce: str) -> bytes:
    """A report whose metric is nested past any decoder's stack (no encoder makes it)."""
    head = ["report", run_id, 1, nonce, 0]
    fields = b"".join(msgspec.msgpack.encode(field) for field in head)
    metric = b"\x81" + msgspec.msgpack.encode("a") + b"\x91" * 100_000 + b"\x90"
    return b"\x91\x97" + fields + metric + msgspec.msgpack.encode(None)


def make_train(config: dict[str, Any]) -> Any:
    out = Path(config["out"])
    fail = config.get("fail")

    async def train(reporter: Reporter) -> None:
        rank = reporter.rank
        if config.get("hostile") and rank == 1:
            hostile(config["name"], reporter)
        start = 0
        if reporter.latest_checkpoint is not None:
            start = saved_step(reporter.latest_checkpoint) + 1
        for step in range(start, config["steps"]):
            if fail and [rank, step, attempt()] == fail:
                raise RuntimeError(f"rank {rank} broke at step {step}")
            metrics = {"rank": rank, "step": step, "loss": round(1 / (step + 1) + rank, 6)}
            # What JSON or UTF-8 has not: each must arrive as it was sent, from every rank.
            metrics |= {"diverged": float("nan"), "bound": float("inf") * (1 - 2 * rank)}
            if step == 2 and config.get("undecodable"):  # UTF-8 has no lone surrogate
                metrics[os.fsdecode(b"undecodable-\xff")] = step
            metrics["seen"] = reporter.from_callbacks.get("Counter", {}).get("rounds", -1)
            if config.get("step_s"):
                await anyio.sleep(config["step_s"])
            saves = (step + 1) % config["save_every"] == 0 or reporter.should_checkpoint
            if rank == 0 and saves:
                with tempfile.TemporaryDirectory() as folder:
                    save_step(folder, step)
                    await reporter.report(metrics, checkpoint=folder)
            else:
                await reporter.report(metrics)
            if config.get("sync", True):
                await reporter.sync()
            if reporter.should_stop:
                (out / f"stop-{rank}.json").write_text(json.dumps(step))
                return

    return train


def save_step(folder: str, step: int) -> None:
    Path(folder, "step.json").write_text(json.dumps(step))


def saved_step(checkpoint: str) -> int:
    step: int = json.loads(Path(checkpoint, "step.json").read_text())
    return step


def hostile(name: str, reporter: Reporter) -> None:
    """What is not the run's, pushed into rank 0's inbox before this rank's reports."""
    from adapters._torchrun_engine import _inbox, _Link

    link = _Link.connect(name)
    inbox = _inbox(link.store.get("host").decode())
    nonce = reporter.nonce  # type: ignore[attr-defined]
    run_id = reporter.run_id  # type: ignore[attr-defined]
    for raw in (
        b"\xc1 not a message",
        msgspec.msgpack.encode([["report", "x"]]),
        msgspec.msgpack.encode([["report", "another-run", 1, nonce, 0, {"step": 0}, None]]),
        msgspec.msgpack.encode([["report", run_id, 7, nonce, 0, {"step": 0}, None]]),
        msgspec.msgpack.encode([["ended", run_id, 1, "not-this-attempt"]]),
        deeply_nested_report(run_id, nonce),
    ):
        link.store.queue_push(inbox, raw)


async def run_job(config: dict[str, Any], engine: Any = None) -> dict[str, Any] | None:
    """The job on ``engine`` (``None``: the local one); the summary, where the run is."""
    out = Path(config["out"])
    recorder, counter = Recorder(), Counter()
    (out / "run").mkdir(exist_ok=True)
    run = open_run(
        world_size=2,
        name=config["name"],
        callbacks=[recorder, counter, StopAfter(config["stop_after"])],
        state_dir=out / "run",
        resume_from=out / "run",
        log=out / "events.jsonl",
        engine=engine,
        period=0.5,
    )
    error: BaseException | None = None
    try:
        async with run:
            await run.workers(make_train(config))
    except (Exception, SystemExit) as exc:  # Preempted is a SystemExit
        error = exc
    if not run.hosted or run.status is None:  # not this process's run, or it never started
        if error is not None:
            raise error
        return None
    summary = {
        "status": run.status,
        "rounds": recorder.rounds,
        "exceptions": recorder.exceptions,
        "before": recorder.before,
        "after": recorder.after,
        "state": dict(counter.state()["attributes"]),
        "result": {k: getattr(run.result, k) for k in ("rounds", "reports", "failures")},
        "stopped": run.result.stopped_by is not None,
    }
    (out / f"summary-{attempt()}.json").write_text(json.dumps(summary))
    if error is not None:
        raise error
    return summary


def main() -> None:
    config = json.loads(Path(sys.argv[1]).read_text())
    from adapters.torchrun import TorchrunEngine

    anyio.run(run_job, config, TorchrunEngine(), backend=config.get("backend", "asyncio"))


if __name__ == "__main__":
    main()
