"""What our trainer adapters cost a real ``Trainer``, in steps per second.

A tiny BERT (hidden 32, 2 layers, 2 heads, batch 8 of 32 random token ids;
built from a ``BertConfig``, nothing downloaded) trains on the CPU with one
torch thread and ``logging_steps=1`` (the worst case: a report every step),
saving every 50 steps, in three conditions:

- ``none``: no callback (HF's printing callbacks are removed in every condition);
- ``hand``: four hand-written HF ``TrainerCallback``s doing our four's work
  (early stopping on the logged loss, the 3 best checkpoints by loss, each
  log appended to a JSONL file, a trivial one; the first two keep their
  state in HF's ``trainer_state.json``, as HF's own callbacks do);
- ``ours``: ``EventBusCallback`` carrying ``EarlyStopping``,
  ``BestCheckpoints``, ``MetricsLogger`` (writing the same JSONL lines) and
  a trivial ``UserCallback``, with the event log and state snapshots at
  every save (its defaults: the bus stepped in the Trainer's hooks);
- ``ours-thread`` (with ``--conditions``): the same with
  ``bus_runs="in_thread"``, the bus thread of before issue 24.

This machine's speed swings 2x within seconds, so the conditions never run
one after another: each runs in processes of its own, side by side, and a
baton passes between them (only its holder trains). A slice is 65 steps:
15 untimed (the warm-up after the pause), then 50 timed, holding one save;
the time our bus then takes to finish what the slice handed it (it works
behind the trainer) counts in the slice. A round runs every process once,
in an order that rotates, so all stand at the same step at the same time
(HF's saves cost more as its log history grows). Each slice is compared
with the ``none`` slices next to it in time: the ratio of its steps/s to
their mean. Identical processes differ by several % (memory layout, where
they run), so each condition runs in ``--replicas`` processes (3; 1 with
``--quick``) and its figure is the median over all their slices.

Reported per condition: steps/s; % lost against ``none`` and the ms added
per step, each as the median over slices, the 90% bootstrap interval of
that median, and p10 to p90 over slices; ours against the hand-written
callbacks in points (slice by slice, same round); the noise (``none``
slices against their ``none`` neighbours, and the spread of the replicas'
medians); per step, the training thread's CPU, the other threads' (our bus
thread), its wait for a CPU, how often it blocked (voluntary context
switches) or was preempted, and the bus loop's wake-ups. The same
comparison is repeated with the training thread's wait for a CPU (other
processes' load) taken out of each slice's time.

``--lightning`` (on without ``--quick``) adds the same three conditions on a
PyTorch Lightning ``Trainer`` (``pl-none``, ``pl-hand``: four hand-written
Lightning ``Callback``s; ``pl-ours``: ``adapters.lightning.EventBusCallback``),
the model in a ``LightningModule`` that logs its loss every step
(``log_every_n_steps=1``), a ``ModelCheckpoint`` every ``--save-steps``.

``--open-run`` (on without ``--quick``) adds a plain async loop: 4 anyio
tasks, each a forward/backward step of its own copy of the model, then
``await reporter.report(...)``: ``loop`` (reporting nowhere), ``open-run``
(``handlers.open_run``, nothing attached) and ``open-run-full`` (the four
callbacks, the event log, snapshots at every checkpoint, every 25 rounds).
A step there is a round of the 4 workers' steps.

``--try NAME=FILE[@BASE]`` adds a condition: ``BASE`` (default ``ours``)
with FILE (Python) run first in its processes, to measure a candidate
change, monkeypatched, beside the rest. ``--conditions`` picks the HF
conditions (also ``ours-bare``, ``ours-nolog``, ``ours-nostate``,
``ours-console``, ``ours-nostopper``, ``ours-evalstop``: see
``_trainer_slices.py``). ``--nice -10`` (the default; it needs root, and
says so otherwise) gives the trainers' processes a scheduling group of
their own, weighted above the machine's other sessions: other processes'
load then mostly stays off the measurement.

    python benchmarks/bench_trainer_overhead.py [--quick] [--json] [--open-run | --no-open-run]
        [--lightning | --no-lightning]
        [--rounds N] [--replicas K] [--conditions none hand ours ...]
        [--try NAME=FILE[@BASE] ...] [--nice N]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import select
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from _harness import target

HERE = Path(__file__).resolve().parent
CHILD = HERE / "_trainer_slices.py"

TARGET_LOST_PCT = 2.0
TARGET_POINTS = 1.0
BOOTSTRAP = 2000  # resamples for the interval of a median
READY_TIMEOUT = 900.0  # every process importing torch at once on 2 cores
SLICE_TIMEOUT = 300.0

#: Per-step figures of each slice, summed up per condition.
PER_STEP = (
    "step",
    "rate",
    "rate_own_cpu",
    "trainer_cpu_ms",
    "other_cpu_ms",
    "runqueue_ms",
    "blocks",
    "preempted",
    "loop_wakeups",
    "settle_ms",
)
#: The rates compared with the baseline: as seen (wall clock), and with the time the
#: training thread waited for a CPU (other processes' load) taken out.
RATES = {"rate": "", "rate_own_cpu": "_own_cpu"}


@dataclass
class Section:
    """Conditions compared with one baseline, slice by slice."""

    name: str
    baseline: str
    conditions: list[str]
    slice_steps: int
    warmup: int
    save_steps: int
    rounds: int
    replicas: int
    unit: str  # what one step is
    patches: dict[str, tuple[str, str]] = field(default_factory=dict)  # name: (file, base)


@dataclass
class Child:
    """One trainer process, at the other end of the baton."""

    condition: str
    process: subprocess.Popen[bytes]
    stderr: IO[bytes]
    done: dict[str, Any] = field(default_factory=dict)

    def tell(self, word: str) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(f"{word}\n".encode())
        self.process.stdin.flush()

    def hear(self, timeout: float) -> dict[str, Any]:
        stdout = self.process.stdout
        assert stdout is not None
        ready, _, _ = select.select([stdout], [], [], timeout)
        line = stdout.readline() if ready else b""
        if not line:
            raise RuntimeError(f"condition {self.condition} said nothing: {self.stderr_tail()}")
        message: dict[str, Any] = json.loads(line)
        return message

    def stderr_tail(self) -> str:
        self.stderr.seek(0)
        lines = self.stderr.read().decode(errors="replace").strip().splitlines()
        return " | ".join(lines[-3:]) or f"exit status {self.process.poll()}"


def start(section: Section, name: str, slices: int, nice: int) -> Child:
    """A process training condition ``name`` in ``slices`` slices when told to."""
    condition, patch = name, None
    if name in section.patches:
        patch, condition = section.patches[name]
    command = [
        sys.executable,
        str(CHILD),
        condition,
        f"--slice={section.slice_steps}",
        f"--warmup={section.warmup}",
        f"--slices={slices}",
        f"--save-steps={section.save_steps}",
    ]
    if patch:
        command.append(f"--patch={patch}")
    if nice:
        command.append(f"--nice={nice}")
    stderr = tempfile.TemporaryFile()  # noqa: SIM115  # the child's, read on failure
    process = subprocess.Popen(
        command,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=stderr,
        cwd=HERE,
        start_new_session=bool(nice),  # its own scheduling autogroup: see --nice
    )
    return Child(name, process, stderr)


def order(section: Section) -> list[tuple[int, int, str]]:
    """The slices to run, as (round, replica, condition).

    A round runs every process once: for each replica, every condition, in
    an order that rotates. Every process runs as many slices, so all stand
    at the same step at the same time (HF's saves cost more as its log
    history grows: a baseline run more often would fall behind). Round 0 is
    the warm-up, dropped.
    """
    names, slices = section.conditions, []
    for r in range(section.rounds + 1):
        for j in range(section.replicas):
            shift = (r + j) % len(names)
            slices += [(r, j, name) for name in names[shift:] + names[:shift]]
    return slices


def run_section(section: Section, children: dict[tuple[str, int], Child]) -> list[dict[str, Any]]:
    """The slices of one section, in the order they ran (round 0 dropped)."""
    sequence: list[dict[str, Any]] = []
    for r, j, name in order(section):
        child = children[name, j]
        child.tell("go")
        figures = child.hear(SLICE_TIMEOUT)["slice"]
        if r:
            sequence.append({"round": r, "replica": j, "condition": name, **figures})
    for child in children.values():
        child.tell("stop")
        child.done = child.hear(SLICE_TIMEOUT)["done"]
        child.process.wait(60)
    return sequence


def quantiles(values: list[float], ci: bool = False) -> dict[str, float]:
    """Median, p10, p90, min and max of ``values``; with ``ci``, also the 90% bootstrap
    interval of the median (``ci_low``, ``ci_high``): how well the median is known."""
    ordered = sorted(values)
    if not ordered:
        nan = math.nan
        return {"median": nan, "p10": nan, "p90": nan, "min": nan, "max": nan, "n": 0}
    last = len(ordered) - 1
    figures = {
        "median": statistics.median(ordered),
        "p10": ordered[round(0.1 * last)],
        "p90": ordered[round(0.9 * last)],
        "min": ordered[0],
        "max": ordered[-1],
        "n": len(ordered),
    }
    if ci:
        rng = random.Random(0)
        medians = sorted(
            statistics.median(rng.choices(ordered, k=len(ordered))) for _ in range(BOOTSTRAP)
        )
        figures["ci_low"] = medians[round(0.05 * (BOOTSTRAP - 1))]
        figures["ci_high"] = medians[round(0.95 * (BOOTSTRAP - 1))]
    return figures


def neighbours(sequence: list[dict[str, Any]], i: int, baseline: str, key: str) -> list[float]:
    """``key`` of the nearest baseline slices before and after slice ``i``."""
    values = []
    for step in (-1, 1):
        j = i + step
        while 0 <= j < len(sequence) and sequence[j]["condition"] != baseline:
            j += step
        if 0 <= j < len(sequence):
            values.append(sequence[j][key])
    return values


Slot = tuple[int, int]  # (round, replica): one slice of each condition


def ratios(
    sequence: list[dict[str, Any]], baseline: str, key: str
) -> tuple[dict[str, dict[Slot, float]], dict[str, list[float]]]:
    """Per condition: each slice's ``key`` over its baseline neighbours' mean, by (round,
    replica); and the ms per step it added. The baseline's own slices are compared with
    their baseline neighbours (both sides needed): the noise."""
    ratio: dict[str, dict[Slot, float]] = {}
    added: dict[str, list[float]] = {}
    for i, row in enumerate(sequence):
        refs = neighbours(sequence, i, baseline, key)
        name = row["condition"]
        if not refs or (name == baseline and len(refs) < 2):
            continue
        reference = statistics.fmean(refs)
        ratio.setdefault(name, {})[row["round"], row["replica"]] = row[key] / reference
        added.setdefault(name, []).append(1e3 * (1 / row[key] - 1 / reference))
    return ratio, added


def analyse(section: Section, sequence: list[dict[str, Any]]) -> dict[str, Any]:
    baseline = section.baseline
    conditions: dict[str, Any] = {
        name: {
            key: quantiles([row[key] for row in sequence if row["condition"] == name])
            for key in PER_STEP
        }
        for name in section.conditions
    }
    result: dict[str, Any] = {
        "unit": section.unit,
        "baseline": baseline,
        "rounds": section.rounds,
        "replicas": section.replicas,
        "timed_steps": section.slice_steps - section.warmup,
        "warmup_steps": section.warmup,
        "save_steps": section.save_steps,
        "conditions": conditions,
    }
    for key, suffix in RATES.items():
        ratio, added = ratios(sequence, baseline, key)
        for name in section.conditions:
            mine = ratio.get(name, {})
            figures = conditions[name]
            figures[f"lost_pct{suffix}"] = quantiles([100 * (1 - v) for v in mine.values()], True)
            figures[f"added_ms{suffix}"] = quantiles(added.get(name, []), ci=True)
            # Each process's own median: identical processes differ (the noise floor).
            figures[f"replica_lost_pct{suffix}"] = [
                statistics.median(100 * (1 - v) for (_, j), v in mine.items() if j == replica)
                for replica in range(section.replicas)
                if any(j == replica for _, j in mine)
            ]
        # Each condition against each other, slice by slice: the same round and replica.
        points: dict[str, Any] = result.setdefault(f"points{suffix}", {})
        for a in section.conditions:
            for b in section.conditions:
                if a == b or baseline in (a, b):
                    continue
                theirs, mine = ratio.get(a, {}), ratio.get(b, {})
                diffs = [100 * (theirs[slot] - mine[slot]) for slot in set(theirs) & set(mine)]
                points[f"{a} vs {b}"] = quantiles(diffs, ci=True)
    return result


def sections_for(args: argparse.Namespace) -> list[Section]:
    quick = args.quick
    patches: dict[str, tuple[str, str]] = {}
    for spec in args.try_:
        name, _, rest = spec.partition("=")
        file, _, base = rest.partition("@")
        patches[name] = (str(Path(file).resolve()), base or "ours")
    sections = [
        Section(
            name="hf",
            baseline="none",
            conditions=[*args.conditions, *patches],
            slice_steps=args.warmup + args.timed,
            warmup=args.warmup,
            save_steps=args.save_steps or args.timed,
            rounds=args.rounds or (6 if quick else 20),
            replicas=args.replicas or (1 if quick else 3),
            unit="Trainer step",
            patches=patches,
        )
    ]
    if args.lightning if args.lightning is not None else not quick:
        sections.append(
            Section(
                name="lightning",
                baseline="pl-none",
                conditions=["pl-none", "pl-hand", "pl-ours"],
                slice_steps=args.warmup + args.timed,
                warmup=args.warmup,
                save_steps=args.save_steps or args.timed,
                rounds=args.rounds or (6 if quick else 20),
                replicas=args.replicas or (1 if quick else 3),
                unit="Lightning Trainer step",
            )
        )
    if args.open_run if args.open_run is not None else not quick:
        sections.append(
            Section(
                name="open_run",
                baseline="loop",
                conditions=["loop", "open-run", "open-run-full"],
                slice_steps=33,
                warmup=8,
                save_steps=25,
                rounds=max(3, (args.rounds or (6 if quick else 20)) // 2),
                replicas=2,
                unit="round of the 4 workers' steps",
            )
        )
    return sections


def measure(args: argparse.Namespace) -> dict[str, Any]:
    sections = sections_for(args)
    started = time.perf_counter()
    # Every process starts at once (imports, model, trainer); then one section at a time.
    children: dict[tuple[str, str, int], Child] = {}
    results: dict[str, Any] = {
        "python": sys.version.split()[0],
        "quick": args.quick,
        "nice": args.nice,
        "sections": {},
    }
    try:
        for section in sections:
            counts = Counter((name, j) for _, j, name in order(section))
            for (name, j), slices in counts.items():
                children[section.name, name, j] = start(section, name, slices + 1, args.nice)
        niceness = {child.hear(READY_TIMEOUT).get("niceness") for child in children.values()}
        results["niceness"] = sorted(n for n in niceness if n is not None)
        results["startup_s"] = round(time.perf_counter() - started, 1)
        for section in sections:
            mine = {
                (name, j): child
                for (where, name, j), child in children.items()
                if where == section.name
            }
            sequence = run_section(section, mine)
            analysed = analyse(section, sequence)
            analysed["delivered"] = {f"{n}#{j}": child.done for (n, j), child in mine.items()}
            analysed["slices"] = sequence
            results["sections"][section.name] = analysed
    finally:
        for child in children.values():
            if child.process.poll() is None:
                child.process.kill()
                child.process.wait()
    results["seconds"] = round(time.perf_counter() - started, 1)
    results["targets"] = targets(results)
    return results


def targets(results: dict[str, Any]) -> list[dict[str, Any]]:
    rows = []
    hf = results["sections"]["hf"]
    conditions = hf["conditions"]
    if "ours" in conditions:
        hand = conditions.get("hand")
        peer = f"hand-written TrainerCallbacks {hand['lost_pct']['median']:.1f}%" if hand else None
        rows.append(
            target(
                "HF Trainer steps/s lost to EventBusCallback (4 callbacks, log, snapshots)",
                conditions["ours"]["lost_pct"]["median"],
                TARGET_LOST_PCT,
                "%",
                peer=peer,
            )
        )
    if "hand vs ours" in hf["points"]:
        rows.append(
            target(
                "HF Trainer steps/s lost: EventBusCallback minus hand-written TrainerCallbacks",
                hf["points"]["hand vs ours"]["median"],
                TARGET_POINTS,
                "points",
            )
        )
    lightning = results["sections"].get("lightning")
    if lightning is not None:
        hand = lightning["conditions"]["pl-hand"]["lost_pct"]["median"]
        rows.append(
            target(
                "Lightning Trainer steps/s lost to EventBusCallback (4 callbacks, log, snapshots)",
                lightning["conditions"]["pl-ours"]["lost_pct"]["median"],
                TARGET_LOST_PCT,
                "%",
                peer=f"hand-written Lightning Callbacks {hand:.1f}%",
            )
        )
        rows.append(
            target(
                "Lightning Trainer steps/s lost: EventBusCallback minus hand-written Callbacks",
                lightning["points"]["pl-hand vs pl-ours"]["median"],
                TARGET_POINTS,
                "points",
            )
        )
    loop = results["sections"].get("open_run")
    if loop is not None:
        alone = loop["conditions"]["open-run"]["lost_pct"]["median"]
        rows.append(
            target(
                "open_run, 4 async workers: steps/s lost to 4 callbacks, log, snapshots",
                loop["conditions"]["open-run-full"]["lost_pct"]["median"],
                TARGET_LOST_PCT,
                "%",
                peer=f"open_run with nothing attached {alone:.1f}%",
            )
        )
    return rows


def _spread(q: dict[str, float], digits: int = 1, signed: bool = False) -> str:
    """``median [ci_low, ci_high] (p10 to p90)`` (the interval when known)."""
    f = f"{'+' if signed else ''}.{digits}f"
    interval = f" [{q['ci_low']:{f}}, {q['ci_high']:{f}}]" if "ci_low" in q else ""
    return f"{q['median']:{f}}{interval} ({q['p10']:{f}} to {q['p90']:{f}})"


def _rates_table(section: dict[str, Any], suffix: str) -> None:
    baseline = section["baseline"]
    print(f"{'condition':<13} {'steps/s':>22}  {'% lost':>34}  {'ms added per step':>37}")
    for condition, figures in section["conditions"].items():
        lost = added = ""
        if condition != baseline:
            lost = _spread(figures[f"lost_pct{suffix}"], 1, True)
            added = _spread(figures[f"added_ms{suffix}"], 2, True)
        rate = _spread(figures[f"rate{suffix}"])
        print(f"{condition:<13} {rate:>22}  {lost:>34}  {added:>37}")
    for pair, points in section[f"points{suffix}"].items():
        a, _, b = (name.removeprefix("pl-") for name in pair.partition(" vs "))
        if a == "hand" or (a == "ours" and b != "hand"):
            print(f"{b} minus {a}: {_spread(points, 1, True)} points lost, slice by slice")
    noise = _spread(section["conditions"][baseline][f"lost_pct{suffix}"], 1, True)
    print(f"noise: {baseline} slices against their {baseline} neighbours: {noise} % lost")
    replicas = "; ".join(
        f"{name} " + " / ".join(f"{value:+.1f}" for value in figures[f"replica_lost_pct{suffix}"])
        for name, figures in section["conditions"].items()
    )
    print(f"each process's own median % lost (identical processes differ): {replicas}")


def print_section(name: str, section: dict[str, Any]) -> None:
    baseline = section["baseline"]
    steps = section["conditions"][baseline]["step"]
    print(
        f"\n[{name}] {section['rounds']} rounds of {section['replicas']} "
        f"process{'es' if section['replicas'] > 1 else ''} per condition, one slice each, "
        f"in rotating order: {section['timed_steps']} timed steps "
        f"after {section['warmup_steps']} untimed, a save every {section['save_steps']} "
        f"(slices ending at steps {steps['min']:.0f} to {steps['max']:.0f}); "
        f"a step: {section['unit']}"
    )
    print(
        "median [its 90% interval] (p10 to p90 over slices); lost and added: each slice "
        f"against the {baseline} slices next to it in time"
    )
    _rates_table(section, "")
    print("\nthe same, the training thread's wait for a CPU (other processes) taken out:")
    _rates_table(section, "_own_cpu")
    print(
        "\nper step, medians: CPU of the training thread, of the other threads (our bus "
        "thread), the training thread's wait for a CPU,\nhow often it blocked (voluntary "
        "context switches) and was preempted; the bus loop's wake-ups; the bus's drain at "
        "a slice's end (ms a slice; counted in its rates)"
    )
    print(
        f"{'condition':<13} {'train CPU ms':>12} {'other CPU ms':>12} {'CPU wait ms':>12} "
        f"{'blocks':>7} {'preempted':>9} {'wake-ups':>8} {'drain ms':>8}"
    )
    for condition, f in section["conditions"].items():
        print(
            f"{condition:<13} {f['trainer_cpu_ms']['median']:12.2f} "
            f"{max(0.0, f['other_cpu_ms']['median']):12.3f} {f['runqueue_ms']['median']:12.2f} "
            f"{f['blocks']['median']:7.2f} {f['preempted']['median']:9.2f} "
            f"{f['loop_wakeups']['median']:8.2f} {f['settle_ms']['median']:8.2f}"
        )


def print_table(results: dict[str, Any]) -> None:
    print(
        f"Trainer overhead{' [quick]' if results['quick'] else ''}: tiny BERT on the CPU, "
        f"1 torch thread, a log every step; processes started in {results['startup_s']} s, "
        f"{results['seconds']} s in all; their niceness {results.get('niceness')}"
    )
    for name, section in results["sections"].items():
        print_section(name, section)
    print()
    for row in results["targets"]:
        bound = "<=" if row["better"] == "lower" else ">="
        verdict = "met" if row["met"] else "MISSED"
        peer = f" (peer: {row['peer']})" if row["peer"] else ""
        print(
            f"target: {row['name']}: {row['measured']} {row['unit']} {bound} {row['target']} "
            f"{verdict}{peer}"
        )


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--quick", action="store_true", help="6 rounds, 1 process a condition, HF only"
    )
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.add_argument("--rounds", type=int, help="rounds of slices (default 20; quick: 6)")
    parser.add_argument("--replicas", type=int, help="processes per condition (3; quick: 1)")
    parser.add_argument(
        "--conditions",
        nargs="+",
        default=["none", "hand", "ours"],
        help="HF conditions, the baseline (none) first",
    )
    parser.add_argument("--timed", type=int, default=50, help="timed steps per slice (HF)")
    parser.add_argument("--warmup", type=int, default=15, help="untimed steps opening a slice")
    parser.add_argument("--save-steps", type=int, help="HF save_steps (default: --timed)")
    parser.add_argument(
        "--try", dest="try_", action="append", default=[], metavar="NAME=FILE[@BASE]"
    )
    parser.add_argument(
        "--nice",
        type=int,
        default=-10,
        help="niceness of the trainers' processes and their scheduling group (default -10; "
        "0: leave them as they are)",
    )
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--open-run", dest="open_run", action="store_true", default=None)
    group.add_argument("--no-open-run", dest="open_run", action="store_false")
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--lightning", dest="lightning", action="store_true", default=None)
    group.add_argument("--no-lightning", dest="lightning", action="store_false")
    args = parser.parse_args()
    if args.conditions[0] != "none":
        parser.error("the first condition is the baseline: none")
    os.environ.setdefault("PYTHONHASHSEED", "0")
    results = measure(args)
    if args.json:
        json.dump(results, sys.stdout, indent=2)
        print()
    else:
        print_table(results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
