"""One condition of ``bench_trainer_overhead.py``, trained in slices while it holds the baton.

Run by that benchmark, one process per condition, never by hand:

    python benchmarks/_trainer_slices.py CONDITION [--slice N] [--warmup W] ...

The process builds its trainer (a tiny BERT on the CPU, one torch thread),
says ``{"ready": ...}`` on its result channel, then waits for a line on
stdin: ``go`` trains one slice (``warmup`` steps untimed, then ``slice -
warmup`` steps timed) and answers with one JSON line of that slice's
figures; ``stop`` ends training (the run ends as usual) and answers
``{"done": ...}``. Only the process holding the baton trains, so the
conditions share the machine slice by slice, never at once.

Conditions (``CONDITIONS``):

- Hugging Face ``Trainer``, ``logging_steps=1``, a save every ``save_steps``:
  ``none`` (no callback of ours or yours), ``hand`` (four hand-written
  ``TrainerCallback``s: early stopping on the logged loss, the k best
  checkpoints by loss, a JSONL metrics file, a trivial one), ``ours``
  (``EventBusCallback`` carrying ``EarlyStopping``, ``BestCheckpoints``,
  ``MetricsLogger`` writing the same JSONL file, a trivial ``UserCallback``,
  with the event log and state snapshots at every save; its bus stepped in
  the Trainer's hooks, the default), and variants of ``ours`` to take its
  cost apart (``ours-thread``: the bus in a thread of its own, as before
  issue 24; ``ours-bare``: one trivial callback, no log, no state;
  ``ours-nolog``; ``ours-nostate``; ``ours-console``: ``MetricsLogger()``
  with its default logger, to stderr; ``ours-nostopper``: the early stopping's
  work in a callback without ``should_stop``, so no hook waits for it: what
  exact stops cost; ``ours-evalstop``: ``EarlyStopping("eval_loss")``, HF's
  usual metric, which the training logs lack, so its ``stops_on`` spares
  them the wait).
- PyTorch Lightning ``Trainer``, the same model in a ``LightningModule``
  that logs its loss every step (``log_every_n_steps=1``), a
  ``ModelCheckpoint`` every ``save_steps`` (the last 3 kept): ``pl-none``,
  ``pl-hand`` (four hand-written Lightning ``Callback``s doing the same
  work, the first two keeping their state in Lightning's checkpoint) and
  ``pl-ours`` (``adapters.lightning.EventBusCallback`` with our four, the
  event log, and the states in each checkpoint and beside it).
- A plain async training loop, 4 anyio tasks each doing a forward/backward
  step of its own copy of the model then reporting: ``loop`` (nothing to
  report to), ``open-run`` (``handlers.open_run``, nothing attached),
  ``open-run-full`` (the same four callbacks, the event log, snapshots at
  every checkpoint). A step of this section is a round: the 4 workers' steps.

``--patch FILE`` runs FILE (Python) in this process before anything is
built: a candidate change to the package, monkeypatched in, measured as
its own condition without editing the package.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import selectors
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO

from _harness import CountingSelector

for _name in (
    "HF_HUB_OFFLINE",
    "TRANSFORMERS_OFFLINE",
    "HF_HUB_DISABLE_TELEMETRY",
    "HF_HUB_DISABLE_PROGRESS_BARS",
    "TOKENIZERS_PARALLELISM",
):
    os.environ.setdefault(_name, "1" if _name != "TOKENIZERS_PARALLELISM" else "false")

HF_CONDITIONS = (
    "none",
    "hand",
    "ours",
    "ours-thread",
    "ours-bare",
    "ours-nolog",
    "ours-nostate",
    "ours-console",
    "ours-nostopper",
    "ours-evalstop",
)
LOOP_CONDITIONS = ("loop", "open-run", "open-run-full")
LIGHTNING_CONDITIONS = ("pl-none", "pl-hand", "pl-ours")
CONDITIONS = HF_CONDITIONS + LOOP_CONDITIONS + LIGHTNING_CONDITIONS

#: The model: a tiny BERT built from its config (nothing downloaded), random token ids.
VOCAB, SEQUENCE, BATCH = 1000, 32, 8
MODEL = {
    "vocab_size": VOCAB,
    "hidden_size": 32,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "intermediate_size": 64,
    "max_position_embeddings": 64,
}
WORKERS = 4  # the async loop's ranks
PATIENCE = 1_000_000  # early stopping that never stops: the same work, every round


class Channel:
    """The baton's end in this process: ``go``/``stop`` on stdin, JSON lines out on a
    private copy of stdout (stdout itself goes to stderr: libraries print)."""

    def __init__(self) -> None:
        self._out: TextIO = os.fdopen(os.dup(1), "w", buffering=1)
        os.dup2(2, 1)
        sys.stdout = sys.stderr

    def send(self, message: dict[str, Any]) -> None:
        self._out.write(json.dumps(message) + "\n")

    def wait_go(self) -> bool:
        """True for ``go``; False for ``stop`` (or the coordinator gone)."""
        return sys.stdin.readline().strip() == "go"


class SliceClock:
    """A slice's figures: wall time, this thread's CPU, the other threads' CPU, the bus
    thread's CPU, this thread's context switches, the bus loop's wake-ups."""

    def __init__(self, bus_thread: Callable[[], threading.Thread | None]) -> None:
        self._bus_thread = bus_thread
        self._start: dict[str, float] = {}

    def _read(self) -> dict[str, float]:
        usage = resource.getrusage(resource.RUSAGE_THREAD)
        on_cpu, waiting = _schedstat("thread-self")
        bus = self._bus_thread()
        bus_cpu = 0.0
        wakeups = 0
        if bus is not None and bus.ident is not None and bus.is_alive():
            try:
                bus_cpu = time.clock_gettime(time.pthread_getcpuclockid(bus.ident))
            except OSError:  # ended meanwhile
                bus_cpu = 0.0
            wakeups = CountingSelector.wakeups.get(bus.name, 0)
        return {
            "wall": time.perf_counter(),
            "trainer_cpu": time.thread_time(),
            "process_cpu": time.process_time(),
            "bus_cpu": bus_cpu,
            "blocks": usage.ru_nvcsw,
            "preempted": usage.ru_nivcsw,
            "loop_wakeups": wakeups,
            "on_cpu": on_cpu,
            "runqueue": waiting,
        }

    def start(self) -> None:
        self._start = self._read()

    def stop(self, steps: int, settle: Callable[[], float]) -> dict[str, float]:
        """The slice's figures; ``settle()`` (seconds) lets the bus finish what the slice
        handed it: that time counts in the slice's rates (the work is the slice's), not in
        its per-step CPU and switch counts."""
        end = self._read()
        diff = {key: end[key] - self._start[key] for key in end}
        drain = settle()
        wall = diff["wall"] + drain
        ours = wall - diff["runqueue"]
        return {
            "steps": steps,
            "seconds": wall,
            "rate": steps / wall,
            "settle_ms": drain * 1e3,
            # As if no other process had wanted this CPU: the time this thread waited
            # for one (runnable, not running) taken out.
            "rate_own_cpu": steps / ours if ours > 0 else float("nan"),
            "runqueue_ms": diff["runqueue"] * 1e3 / steps,
            "trainer_cpu_ms": diff["trainer_cpu"] * 1e3 / steps,
            "other_cpu_ms": (diff["process_cpu"] - diff["trainer_cpu"]) * 1e3 / steps,
            "bus_cpu_ms": diff["bus_cpu"] * 1e3 / steps,
            "blocks": diff["blocks"] / steps,
            "preempted": diff["preempted"] / steps,
            "loop_wakeups": diff["loop_wakeups"] / steps,
        }


def _schedstat(task: str) -> tuple[float, float]:
    """Seconds ``task`` (``thread-self``, or ``self/task/<tid>``) ran on a CPU, and waited
    for one while runnable (``/proc/<task>/schedstat``; zeros where there is none)."""
    try:
        with open(f"/proc/{task}/schedstat") as stat:
            ran, waited, _ = stat.read().split()
    except (OSError, ValueError):
        return 0.0, 0.0
    return int(ran) / 1e9, int(waited) / 1e9


def _last_cpu() -> int:
    """The CPU this thread ran on last (``/proc/thread-self/stat``; -1 if unknown)."""
    try:
        with open("/proc/thread-self/stat") as stat:
            return int(stat.read().rsplit(")", 1)[1].split()[36])
    except (OSError, ValueError, IndexError):
        return -1


class Baton:
    """Where a trainer stops to pass the baton: every ``slice`` steps; the clock runs
    from step ``warmup`` of each slice to its end."""

    def __init__(
        self,
        channel: Channel,
        clock: SliceClock,
        slice_steps: int,
        warmup: int,
        settle: Callable[[], float] = lambda: 0.0,
    ) -> None:
        self.channel, self.clock = channel, clock
        self.slice, self.warmup = slice_steps, warmup
        self.settle = settle  # at the slice's end: let the bus finish (see SliceClock.stop)

    def begin(self, info: dict[str, Any]) -> bool:
        self.channel.send({"ready": True, "niceness": os.nice(0), **info})
        return self.channel.wait_go()

    def at_step(self, step: int) -> bool:
        """Called at the end of each step (1, 2, ...); False: stop training."""
        phase = step % self.slice
        if phase == self.warmup:
            self.clock.start()
        elif phase == 0:
            figures = self.clock.stop(self.slice - self.warmup, self.settle)
            figures["cpu"] = _last_cpu()
            figures["step"] = step
            self.channel.send({"slice": figures})
            return self.channel.wait_go()
        return True


def _settle(ours: Any) -> Callable[[], float]:
    """How a slice lets our adapter (None: no adapter) finish what the slice handed it:
    the seconds that took (see ``SliceClock.stop``)."""

    def settle() -> float:
        if ours is None:
            return 0.0
        start = time.perf_counter()
        ours.wait_idle()
        return time.perf_counter() - start

    return settle


# --- the Hugging Face conditions -----------------------------------------------------


def _torch() -> Any:
    import torch

    torch.set_num_threads(1)
    return torch


def _model(seed: int = 0) -> Any:
    torch = _torch()
    from transformers import BertConfig, BertForSequenceClassification

    torch.manual_seed(seed)
    return BertForSequenceClassification(BertConfig(**MODEL))


def _random_tokens(n: int, seed: int = 0) -> Any:
    torch = _torch()
    from torch.utils.data import Dataset

    class RandomTokens(Dataset):  # type: ignore[misc]  # torch is untyped to mypy
        def __init__(self) -> None:
            generator = torch.Generator().manual_seed(seed)
            self.ids = torch.randint(0, VOCAB, (n, SEQUENCE), generator=generator)
            self.labels = torch.randint(0, 2, (n,), generator=generator)
            self.mask = torch.ones(SEQUENCE, dtype=torch.long)

        def __len__(self) -> int:
            return n

        def __getitem__(self, i: int) -> dict[str, Any]:
            return {"input_ids": self.ids[i], "attention_mask": self.mask, "labels": self.labels[i]}

    return RandomTokens()


def _jsonl_logger(path: Path) -> Any:
    """A structlog logger writing one JSON line per call to ``path`` (for ``MetricsLogger``:
    the hand-written metrics file's work)."""
    import logging

    import structlog

    stream = path.open("a")
    wrapper: Any = structlog.make_filtering_bound_logger(logging.INFO)
    return wrapper(structlog.WriteLogger(stream), [structlog.processors.JSONRenderer()], {})


def _hand_written(output: Path) -> list[Any]:
    """What a user writes with HF alone for the same work as our four."""
    from transformers import TrainerCallback
    from transformers.trainer_callback import ExportableState

    class HFEarlyStopping(TrainerCallback, ExportableState):  # type: ignore[misc]
        def __init__(self, patience: int) -> None:
            self.patience, self.wait = patience, 0
            self.best: float | None = None

        def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kw: Any) -> None:
            loss = (logs or {}).get("loss")
            if not isinstance(loss, float):
                return
            if self.best is None or loss < self.best:
                self.best, self.wait = loss, 0
            else:
                self.wait += 1
                if self.wait >= self.patience:
                    control.should_training_stop = True

        def state(self) -> dict[str, Any]:
            return {
                "args": {"patience": self.patience},
                "attributes": {"best": self.best, "wait": self.wait},
            }

    class HFBestCheckpoints(TrainerCallback, ExportableState):  # type: ignore[misc]
        def __init__(self, k: int) -> None:
            self.k = k
            self.top: list[list[Any]] = []
            self.loss: float | None = None

        def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kw: Any) -> None:
            loss = (logs or {}).get("loss")
            if isinstance(loss, float):
                self.loss = loss

        def on_save(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            if self.loss is None:
                return
            checkpoint = os.path.join(args.output_dir, f"checkpoint-{state.global_step}")
            self.top = sorted([*self.top, [self.loss, checkpoint]], key=lambda e: e[0])[: self.k]

        def state(self) -> dict[str, Any]:
            return {"args": {"k": self.k}, "attributes": {"top": self.top}}

    class HFMetricsFile(TrainerCallback):  # type: ignore[misc]
        def __init__(self, path: Path) -> None:
            self.stream = path.open("a")

        def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kw: Any) -> None:
            self.stream.write(json.dumps({"step": state.global_step, **(logs or {})}) + "\n")
            self.stream.flush()

    class HFTrivial(TrainerCallback):  # type: ignore[misc]
        calls = 0

        def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kw: Any) -> None:
            self.calls += 1

    return [
        HFEarlyStopping(PATIENCE),
        HFBestCheckpoints(3),
        HFMetricsFile(output / "metrics.jsonl"),
        HFTrivial(),
    ]


def _ours_callbacks(
    output: Path, console: bool = False, stopper: bool = True, metric: str = "loss"
) -> list[Any]:
    from handlers import BestCheckpoints, EarlyStopping, MetricsLogger, UserCallback

    class Trivial(UserCallback):
        calls = 0

        def after_report(self, run_context: Any, metrics: Any, checkpoint: Any) -> None:
            self.calls += 1

    metrics = (
        MetricsLogger() if console else MetricsLogger(logger=_jsonl_logger(output / "m.jsonl"))
    )
    early_stopping = EarlyStopping(metric, patience=PATIENCE)

    class Watching(UserCallback):  # the same work, and no should_stop: nothing waits for it
        def after_report(self, run_context: Any, metrics: Any, checkpoint: Any) -> None:
            early_stopping.after_report(run_context, metrics, checkpoint)

    return [
        early_stopping if stopper else Watching(),
        BestCheckpoints("loss", k=3),
        metrics,
        Trivial(),
    ]


def _hf_callbacks(condition: str, output: Path) -> list[Any]:
    if condition == "none":
        return []
    if condition == "hand":
        return _hand_written(output)
    from adapters.transformers import EventBusCallback

    if condition == "ours-bare":
        return [EventBusCallback(_ours_callbacks(output)[3:], state=False)]
    callbacks = _ours_callbacks(
        output,
        console=condition == "ours-console",
        stopper=condition != "ours-nostopper",
        metric="eval_loss" if condition == "ours-evalstop" else "loss",
    )
    log = condition != "ours-nolog"
    state = condition != "ours-nostate"
    if condition == "ours-thread":
        return [EventBusCallback(callbacks, log=log, state=state, bus_runs="in_thread")]
    return [EventBusCallback(callbacks, log=log, state=state)]


def run_hf(
    condition: str, args: argparse.Namespace, output: Path, channel: Channel
) -> dict[str, Any]:
    """Train until told to stop; returns what the run delivered."""
    import transformers
    from transformers import PrinterCallback, ProgressCallback, Trainer, TrainerCallback

    transformers.logging.set_verbosity_error()
    selectors.DefaultSelector = CountingSelector  # type: ignore[misc]  # the bus loop's
    max_steps = args.slice * (args.slices + 2)
    theirs = _hf_callbacks(condition, output)
    ours = theirs[0] if theirs and hasattr(theirs[0], "bus_thread") else None

    def bus_thread() -> threading.Thread | None:
        """The bus's thread, found by its name (``BusThread.name``)."""
        handle = getattr(ours, "bus_thread", None)
        name = getattr(handle, "name", None)
        return next((t for t in threading.enumerate() if t.name == name), None)

    baton = Baton(channel, SliceClock(bus_thread), args.slice, args.warmup, _settle(ours))

    class BatonCallback(TrainerCallback):  # type: ignore[misc]  # last: after every other
        def on_train_begin(self, a: Any, state: Any, control: Any, **kw: Any) -> None:
            if not baton.begin({"condition": condition, "pid": os.getpid()}):
                control.should_training_stop = True

        def on_step_end(self, a: Any, state: Any, control: Any, **kw: Any) -> None:
            if not baton.at_step(int(state.global_step)):
                control.should_training_stop = True

    training = transformers.TrainingArguments(
        output_dir=str(output),
        max_steps=max_steps,
        per_device_train_batch_size=BATCH,
        logging_steps=1,
        save_strategy="steps",
        save_steps=args.save_steps,
        save_total_limit=3,
        report_to="none",
        use_cpu=True,
        disable_tqdm=True,
        dataloader_num_workers=0,
        log_level="error",
    )
    trainer = Trainer(
        model=_model(),
        args=training,
        train_dataset=_random_tokens(BATCH * (max_steps + 1)),
        callbacks=[*theirs, BatonCallback()],
    )
    for printer in (PrinterCallback, ProgressCallback):  # each prints every log
        trainer.remove_callback(printer)
    trainer.train()
    done: dict[str, Any] = {"steps": int(trainer.state.global_step)}
    if ours is not None:
        rounds = [getattr(cb, "calls", None) for cb in ours.callbacks]
        done.update(dropped=ours.dropped, trivial_rounds=rounds[-1])
    return done


# --- the Lightning conditions ---------------------------------------------------------


def _floats(metrics: dict[str, Any]) -> dict[str, float]:
    return {name: float(value) for name, value in metrics.items()}


def _lightning_hand_written(output: Path) -> list[Any]:
    """What a user writes with Lightning alone for the same work as our four."""
    from lightning.pytorch import Callback

    class PLEarlyStopping(Callback):  # type: ignore[misc]  # lightning is untyped to mypy
        def __init__(self, patience: int) -> None:
            self.patience, self.wait = patience, 0
            self.best: float | None = None

        def on_train_batch_end(self, trainer: Any, *args: Any) -> None:
            loss = float(trainer.callback_metrics["loss"])
            if self.best is None or loss < self.best:
                self.best, self.wait = loss, 0
            else:
                self.wait += 1
                if self.wait >= self.patience:
                    trainer.should_stop = True

        def state_dict(self) -> dict[str, Any]:
            return {"best": self.best, "wait": self.wait}

        def load_state_dict(self, state: dict[str, Any]) -> None:
            self.best, self.wait = state["best"], state["wait"]

    class PLBestCheckpoints(Callback):  # type: ignore[misc]
        def __init__(self, k: int) -> None:
            self.k = k
            self.top: list[list[Any]] = []

        def on_save_checkpoint(self, trainer: Any, module: Any, checkpoint: Any) -> None:
            loss = float(trainer.callback_metrics["loss"])
            entry = [loss, f"step={trainer.global_step}"]
            self.top = sorted([*self.top, entry], key=lambda e: e[0])[: self.k]

        def state_dict(self) -> dict[str, Any]:
            return {"top": self.top}

        def load_state_dict(self, state: dict[str, Any]) -> None:
            self.top = state["top"]

    class PLMetricsFile(Callback):  # type: ignore[misc]
        def __init__(self, path: Path) -> None:
            self.stream = path.open("a")

        def on_train_batch_end(self, trainer: Any, *args: Any) -> None:
            line = {"step": trainer.global_step, **_floats(trainer.callback_metrics)}
            self.stream.write(json.dumps(line) + "\n")
            self.stream.flush()

    class PLTrivial(Callback):  # type: ignore[misc]
        calls = 0

        def on_train_batch_end(self, trainer: Any, *args: Any) -> None:
            self.calls += 1

    return [
        PLEarlyStopping(PATIENCE),
        PLBestCheckpoints(3),
        PLMetricsFile(output / "metrics.jsonl"),
        PLTrivial(),
    ]


def run_lightning(
    condition: str, args: argparse.Namespace, output: Path, channel: Channel
) -> dict[str, Any]:
    """Train until told to stop; returns what the run delivered."""
    import warnings

    import lightning.pytorch as pl

    warnings.filterwarnings("ignore", module="lightning")  # its advice for real jobs
    torch = _torch()
    selectors.DefaultSelector = CountingSelector  # type: ignore[misc]  # the bus loop's
    max_steps = args.slice * (args.slices + 2)
    theirs: list[Any] = []
    ours = None
    if condition == "pl-hand":
        theirs = _lightning_hand_written(output)
    elif condition == "pl-ours":
        from adapters.lightning import EventBusCallback

        ours = EventBusCallback(_ours_callbacks(output), log=True)
        theirs = [ours]

    baton = Baton(channel, SliceClock(lambda: None), args.slice, args.warmup, _settle(ours))

    class BatonCallback(pl.Callback):  # type: ignore[misc]  # after ours: last in the list
        def on_train_start(self, trainer: Any, module: Any) -> None:
            if not baton.begin({"condition": condition, "pid": os.getpid()}):
                trainer.should_stop = True

        def on_train_batch_end(self, trainer: Any, *rest: Any) -> None:
            if not baton.at_step(int(trainer.global_step)):
                trainer.should_stop = True

    class Classifier(pl.LightningModule):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__()
            self.model = _model()

        def training_step(self, batch: dict[str, Any], batch_idx: int) -> Any:
            loss = self.model(**batch).loss
            self.log("loss", loss)
            return loss

        def configure_optimizers(self) -> Any:
            return torch.optim.AdamW(self.parameters(), lr=5e-5)

    checkpoints = pl.callbacks.ModelCheckpoint(
        dirpath=output / "checkpoints",
        every_n_train_steps=args.save_steps,
        save_top_k=3,
        monitor="step",
        mode="max",
    )
    trainer = pl.Trainer(
        default_root_dir=str(output),
        max_steps=max_steps,
        log_every_n_steps=1,
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[*theirs, BatonCallback(), checkpoints],
    )
    data = torch.utils.data.DataLoader(_random_tokens(BATCH * (max_steps + 1)), batch_size=BATCH)
    trainer.fit(Classifier(), data)
    done: dict[str, Any] = {"steps": int(trainer.global_step)}
    if ours is not None:
        done.update(dropped=ours.dropped, trivial_rounds=ours.callbacks[-1].calls)
    return done


# --- the async loop conditions ---------------------------------------------------------


def run_loop(
    condition: str, args: argparse.Namespace, output: Path, channel: Channel
) -> dict[str, Any]:
    import anyio
    import anyio.lowlevel

    torch = _torch()
    models = [_model(seed) for seed in range(WORKERS)]
    optimizers = [torch.optim.AdamW(m.parameters(), lr=5e-5) for m in models]
    data = _random_tokens(BATCH * 64)
    batches = [
        {
            key: torch.stack([data[i][key] for i in range(b * BATCH, (b + 1) * BATCH)])
            for key in data[0]
        }
        for b in range(64)
    ]
    baton = Baton(channel, SliceClock(lambda: None), args.slice, args.warmup)
    stopping = False
    steps = [0] * WORKERS

    def train_step(rank: int, step: int) -> dict[str, Any]:
        model, optimizer = models[rank], optimizers[rank]
        loss = model(**batches[(step + rank) % len(batches)]).loss
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad()
        return {"loss": loss.item(), "grad_norm": grad_norm.item(), "learning_rate": 5e-5}

    def save(step: int) -> str:
        folder = output / f"checkpoint-{step}"
        folder.mkdir(exist_ok=True)
        torch.save(models[0].state_dict(), folder / "model.pt")
        return str(folder)

    async def worker(reporter: Any) -> None:
        nonlocal stopping
        rank = reporter.rank
        while not stopping:
            step = steps[rank] = steps[rank] + 1
            metrics = {**train_step(rank, step), "step": step}
            checkpoint = save(step) if rank == 0 and step % args.save_steps == 0 else None
            await reporter.report(metrics, checkpoint=checkpoint)
            if rank == 0 and not baton.at_step(step):
                stopping = True
            await anyio.lowlevel.checkpoint()  # let the other ranks (and the bus) run

    class Nowhere:
        def __init__(self, rank: int) -> None:
            self.rank = rank

        async def report(self, metrics: dict[str, Any], checkpoint: str | None = None) -> None:
            pass

    async def main() -> dict[str, Any]:
        if not baton.begin({"condition": condition, "pid": os.getpid()}):
            return {"steps": 0}
        if condition == "loop":
            async with anyio.create_task_group() as group:
                for rank in range(WORKERS):
                    group.start_soon(worker, Nowhere(rank))
            return {"steps": steps[0]}
        from handlers import open_run

        full = condition == "open-run-full"
        run = open_run(
            world_size=WORKERS,
            callbacks=_ours_callbacks(output) if full else (),
            log=output / "run.evlog" if full else None,
            state_dir=output if full else None,
        )
        async with run:
            await run.workers(worker)
        result = run.result
        return {"steps": steps[0], "rounds": getattr(result, "rounds", None)}

    return anyio.run(main)


def _renice(increment: int) -> None:
    """Niceness ``increment`` for this process, and for its scheduling autogroup (Linux
    weighs sessions against each other first: the benchmark starts this process in a
    session of its own, so this sets its weight against the machine's other sessions)."""
    try:
        os.nice(increment)
        with open("/proc/self/autogroup", "w") as group:
            group.write(str(max(-20, min(19, increment))))
    except OSError as exc:  # a negative increment needs the privilege
        print(f"niceness not fully changed: {exc}", file=sys.stderr)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("condition", choices=CONDITIONS)
    parser.add_argument("--slice", type=int, default=70, help="steps per slice")
    parser.add_argument("--warmup", type=int, default=20, help="untimed steps opening a slice")
    parser.add_argument("--slices", type=int, default=40, help="slices to plan max_steps for")
    parser.add_argument("--save-steps", type=int, default=50)
    parser.add_argument("--patch", help="a Python file run first (a candidate change)")
    parser.add_argument("--output", help="where checkpoints go (default: a temporary folder)")
    parser.add_argument("--nice", type=int, default=0, help="add this to the process's niceness")
    args = parser.parse_args()
    if args.nice:
        _renice(args.nice)
    if args.patch:
        code = Path(args.patch).read_text()
        exec(compile(code, args.patch, "exec"), {"__name__": "__patch__"})
    channel = Channel()
    output = Path(args.output or tempfile.mkdtemp(prefix=f"bench_trainer_{args.condition}_"))
    output.mkdir(parents=True, exist_ok=True)
    try:
        runner = (
            run_hf
            if args.condition in HF_CONDITIONS
            else run_lightning
            if args.condition in LIGHTNING_CONDITIONS
            else run_loop
        )
        done = runner(args.condition, args, output, channel)
    finally:
        if not args.output:
            shutil.rmtree(output, ignore_errors=True)
    channel.send({"done": done})
    return 0


if __name__ == "__main__":
    sys.exit(main())
