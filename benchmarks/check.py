"""Every performance target, measured now: one table, met or not (``make bench``).

Runs each benchmark in its own process with ``--json`` (``--quick`` passes
``--quick`` on: about 3 minutes in all, for use before a commit), collects the
``targets`` each reports, and prints one row per target with the measured
figure, the target, the best peer's figure from the same run when there is
one, and whether it is met. Ratios, never timed assertions: the exit status
is 0 even when a target is missed, unless ``--strict``.

    python benchmarks/check.py [--quick] [--strict] [--json FILE] [--only dispatch log ...]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
BENCHMARKS = (
    "trainer_overhead",
    "ray_engine",
    "trackers",
    "dispatch",
    "rounds",
    "log",
    "hf_handoff",
    "state",
    "report",
    "otel",
)


def run_one(name: str, quick: bool) -> tuple[list[dict[str, Any]], str | None]:
    """The targets one benchmark reports, or why there are none."""
    command = [sys.executable, str(HERE / f"bench_{name}.py"), "--json"]
    if quick:
        command.append("--quick")
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        return [], f"bench_{name}.py exited with {done.returncode}: {last}"
    try:
        return list(json.loads(done.stdout).get("targets", [])), None
    except json.JSONDecodeError as error:
        return [], f"bench_{name}.py printed no JSON document ({error})"


def format_figure(value: float, unit: str) -> str:
    if unit == "x":
        return f"{value:.2f}x"
    figure = f"{value:,.3g}" if abs(value) < 100 else f"{value:,.0f}"
    return f"{figure} {unit}".strip()


def print_table(rows: list[tuple[str, dict[str, Any]]], failures: list[str]) -> None:
    width = max((len(row["name"]) for _, row in rows), default=20)
    print(f"{'target':<{width}}  {'measured':>12}  {'limit':>10}  {'':4}  best peer")
    for _, row in rows:
        bound = "<=" if row["better"] == "lower" else ">="
        limit = f"{bound} {format_figure(row['target'], row['unit'])}"
        verdict = "met" if row["met"] else "MISS"
        print(
            f"{row['name']:<{width}}  {format_figure(row['measured'], row['unit']):>12}  "
            f"{limit:>10}  {verdict:4}  {row['peer'] or ''}"
        )
    met = sum(row["met"] for _, row in rows)
    print(f"\n{met} of {len(rows)} targets met")
    for failure in failures:
        print(f"not measured: {failure}")


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="each benchmark in its quick mode")
    parser.add_argument("--strict", action="store_true", help="exit 1 when a target is missed")
    parser.add_argument("--json", metavar="FILE", help="also write the rows as JSON to FILE")
    parser.add_argument("--only", nargs="+", choices=BENCHMARKS, default=list(BENCHMARKS))
    args = parser.parse_args()

    rows: list[tuple[str, dict[str, Any]]] = []
    failures: list[str] = []
    started = time.perf_counter()
    for name in args.only:
        print(f"running bench_{name}.py ...", file=sys.stderr, flush=True)
        targets, failure = run_one(name, args.quick)
        rows.extend((name, row) for row in targets)
        if failure:
            failures.append(failure)
    print_table(rows, failures)
    print(f"({time.perf_counter() - started:.0f} s)", file=sys.stderr)
    if args.json:
        document = {"python": sys.version.split()[0], "quick": args.quick, "rows": rows}
        Path(args.json).write_text(json.dumps(document, indent=2) + "\n")
    missed = failures or not all(row["met"] for _, row in rows)
    return 1 if args.strict and missed else 0


if __name__ == "__main__":
    sys.exit(main())
