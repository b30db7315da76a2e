"""``eventbus bench --over-budget`` (issue 43, item 3): a policy for every callback or
one by name, without editing its class; the JSON, the table and the page say when the
bus disabled or coalesced each callback, in which periods, and the page shades them
(in a browser: tests/test_report_browser.py).

The slow callback takes 10 ms a round at 10 rounds a second: 100 ms of a 1 s period,
twice its 5% budget in every period in which it is called, however loaded the machine.
With ``disable`` (probation 3) the periods are then fixed: over in period 0, disabled in
1-3, tried again in 4, disabled again from 5 on (the partial last period).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

CALLBACKS = """
import time

from handlers import UserCallback


class Slow(UserCallback):
    def after_report(self, run_context, metrics, checkpoint):
        time.sleep(0.01)


class Quick(UserCallback):
    def after_report(self, run_context, metrics, checkpoint):
        pass
"""
#: A synthetic run of 50 rounds over 5 periods of 1 s (and a short partial one).
WORKLOAD = ("--world-size", "1", "--rate", "10", "--duration", "5", "--period", "1")


@pytest.fixture
def callbacks_dir(tmp_path: Path) -> Path:
    """A directory with ``policy_callbacks.py``; the command runs there."""
    (tmp_path / "policy_callbacks.py").write_text(CALLBACKS)
    return tmp_path


def bench(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "adapters.cli", "bench", *args, "--repeat", "1"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=cwd,
        check=False,
    )


def by_name(result: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {f["name"]: f for f in result["callbacks"]}


def report_data(page: Path) -> dict[str, Any]:
    found = re.search(r'id="report-data">(.*?)</script>', page.read_text("utf-8"), re.S)
    assert found is not None
    data: dict[str, Any] = json.loads(found.group(1))
    return data


def test_disable_for_every_callback_shows_in_the_json_the_table_and_the_page(
    callbacks_dir: Path,
) -> None:
    out, page = callbacks_dir / "bench.json", callbacks_dir / "bench.html"
    done = bench(
        *("policy_callbacks:Slow", "policy_callbacks:Quick", *WORKLOAD),
        *("--over-budget", "disable", "--json", str(out), "--html", str(page)),
        cwd=callbacks_dir,
    )
    assert done.returncode == 0, done.stderr
    figures = by_name(json.loads(out.read_text()))
    slow, quick = figures["Slow.after_report"], figures["Quick.after_report"]
    assert slow["over_budget"] == quick["over_budget"] == "disable"
    changes = [(c["period"], c["state"]) for c in slow["state_changes"]]
    assert changes == [(1, "disabled"), (4, "normal"), (5, "disabled")]
    assert slow["state_changes"][0]["reason"].startswith("over budget: took ")
    assert (slow["bus_calls"], slow["bus_skipped"]) == (20, 30)
    assert quick["state_changes"] == [] and quick["bus_skipped"] == 0
    # The table: a policy column, and where the bus disabled the callback.
    lines = done.stdout.splitlines()
    assert lines[3].split()[-1] == "policy"
    (row,) = [line for line in lines if line.startswith("Slow.after_report  ")]  # padded
    assert row.split()[-1] == "disable"
    assert (
        "Slow.after_report (over_budget=disable): disabled in periods 1-3 and 5 (periods 0 "
        "to 5); 30 of 50 deliveries skipped"
    ) in lines
    # The page: the same periods shaded on the cost chart, and in the table.
    (chart,) = report_data(page)["charts"]
    spans = [(s["from"], s["to"], s["kind"]) for s in chart["spans"]]
    assert spans == [(1, 4, "disabled"), (5, 6, "disabled")]
    assert all(
        s["label"].startswith("Slow.after_report disabled: over budget") for s in chart["spans"]
    )
    text = page.read_text("utf-8")
    assert "<td>disabled in periods 1-3 and 5</td>" in text
    assert '<span class="solid" style="--c:#777777">disabled</span>' in text  # the chart's key


def test_a_policy_by_name_leaves_the_others_theirs(callbacks_dir: Path) -> None:
    done = bench(
        *("policy_callbacks:Slow", "noop", *WORKLOAD, "--json", "-"),
        *("--over-budget", "coalesce", "--over-budget", "Slow=warn"),
        cwd=callbacks_dir,
    )
    assert done.returncode == 0, done.stderr
    figures = by_name(json.loads(done.stdout))
    slow, noop = figures["Slow.after_report"], figures["NoOp.after_report"]
    assert (slow["over_budget"], noop["over_budget"]) == ("warn", "coalesce")
    # Warned, never stopped: every call made, over budget in every period it was called.
    assert slow["state_changes"] == [] and slow["bus_calls"] == 50
    assert slow["periods_over_budget"] == 5


def test_coalescing_is_said_from_the_period_after_the_one_over_budget(
    callbacks_dir: Path,
) -> None:
    done = bench(
        *("policy_callbacks:Slow", *WORKLOAD, "--json", "-"),
        *("--over-budget", "policy_callbacks:Slow=coalesce"),
        cwd=callbacks_dir,
    )
    assert done.returncode == 0, done.stderr
    (slow,) = json.loads(done.stdout)["callbacks"]
    assert slow["over_budget"] == "coalesce"
    first = slow["state_changes"][0]
    assert (first["period"], first["state"]) == (1, "coalescing")
    assert slow["bus_skipped"] > 0 and slow["bus_calls"] + slow["bus_skipped"] == 50


@pytest.mark.parametrize(
    ("given", "said"),
    [
        (
            ["sometimes"],
            "--over-budget 'sometimes': 'sometimes' is not a policy (warn, coalesce or disable)",
        ),
        (["=warn"], "--over-budget '=warn': no callback named before '='"),
        (
            ["Nope=warn"],
            "--over-budget: no benched callback is named 'Nope' (benched: "
            "policy_callbacks:Quick, noop; a callback is named as given, or by its class name)",
        ),
        (
            ["Quick=warn", "Quick=disable"],
            "--over-budget gives 'Quick' two policies: warn and disable",
        ),
        (
            ["warn", "coalesce"],
            "--over-budget gives every callback two policies: warn and coalesce",
        ),
    ],
)
def test_a_bad_policy_is_one_line_before_the_bench(
    callbacks_dir: Path, given: list[str], said: str
) -> None:
    flags = [part for text in given for part in ("--over-budget", text)]
    done = bench("policy_callbacks:Quick", "noop", "--events", "10", *flags, cwd=callbacks_dir)
    assert done.returncode == 2
    assert done.stderr == f"eventbus bench: error: {said}\n"
