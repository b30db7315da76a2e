"""The demo's summary: what each callback cost, printed and in ``--summary FILE.json``."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from _builders import eventbus as cli

from adapters.cli._demo_trainer import run_demo

HOOK_KEYS = {
    "handler",
    "calls",
    "total_ms",
    "mean_us",
    "max_ms",
    "periods_over_budget",
    "faults",
    "timeouts",
    "skipped",
}


@pytest.mark.anyio
async def test_the_demo_s_summary_has_each_callback_s_figures(tmp_path: Path) -> None:
    summary = await run_demo(
        workers=2, steps=12, step_time=0.0, out=tmp_path, log=False, progress=io.StringIO()
    )
    costs = {cost.handler: cost for cost in summary.result.callbacks}
    # The training callbacks' hooks, none of the library's handlers.
    assert {"EarlyStopping.after_report", "FinalLoss.after_report"} <= set(costs)
    assert not any(name.startswith(("handlers.", "demo.")) for name in costs)
    assert costs["EarlyStopping.after_report"].calls == summary.result.rounds == 12
    for cost in costs.values():
        assert cost.total >= cost.max >= 0.0
        assert cost.periods_over_budget <= summary.periods
    figures = summary.to_json()["callback_costs"]
    assert figures["periods"] == summary.periods >= 1
    rows = {row["handler"]: row for row in figures["callbacks"]}
    assert set(rows) == set(costs)
    early = rows["EarlyStopping.after_report"]
    assert set(early) == HOOK_KEYS and early["calls"] == 12
    assert early["total_ms"] == costs["EarlyStopping.after_report"].total * 1e3
    lines = summary.lines()
    assert "callbacks:" in lines
    [printed] = [line for line in lines if line.startswith("  EarlyStopping.after_report: ")]
    assert printed.startswith("  EarlyStopping.after_report: 12 calls, ")
    assert " ms total, " in printed and " µs mean, " in printed and " ms max, " in printed
    assert printed.endswith(f"of {summary.periods} period{'' if summary.periods == 1 else 's'}")


def test_demo_summary_file_adds_the_costs_to_its_keys(tmp_path: Path) -> None:
    args = ["--workers", "2", "--steps", "8", "--step-time", "0", "--out", "d"]
    shown = cli("demo", *args, "--no-log", "--summary", "s.json", cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr
    assert "\ncallbacks:\n  " in shown.stdout
    summary = json.loads((tmp_path / "s.json").read_text())
    # The keys it had, and the costs beside them.
    assert {"status", "rounds", "reports", "last_checkpoint", "final_mean_loss", "states"} <= set(
        summary
    )
    costs = summary["callback_costs"]
    assert costs["periods"] >= 1
    early = next(c for c in costs["callbacks"] if c["handler"] == "EarlyStopping.after_report")
    assert set(early) == HOOK_KEYS and early["calls"] == summary["rounds"] == 8
