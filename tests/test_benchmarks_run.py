"""``make bench-quick`` works: every benchmark reports its targets in one table.

Figures are not checked here (ratios on a shared machine are for people to
read, never timed assertions); that each benchmark runs, reports the rows
the README's table has, and that a miss is shown as one, is.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"


def check(*args: str, tmp_path: Path) -> tuple[str, dict[str, object]]:
    out = tmp_path / "rows.json"
    done = subprocess.run(
        [sys.executable, str(BENCHMARKS / "check.py"), "--quick", "--json", str(out), *args],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    return done.stdout, json.loads(out.read_text())


def test_quick_benchmarks_report_every_target_in_one_table(tmp_path: Path) -> None:
    table, document = check("--only", "rounds", "log", "state", "report", "otel", tmp_path=tmp_path)
    rows = document["rows"]
    assert isinstance(rows, list)
    names = [row["name"] for _, row in rows]
    for expected in (
        "round through the bus, world size 8",
        "log recording, tap",
        "log recording, write_log",
        "log streaming read",
        "replay",
        "snapshot of 100 stateful callbacks",
        "report of a log",
        "peak RSS making the report of",
        "report page size",
        "otel tap, durations=False",
        "otel tap, K=1",
        "otel tap, world size 8",
    ):
        assert any(name.startswith(expected) for name in names), (expected, names)
    for _, row in rows:
        assert row["better"] in ("lower", "higher")
        met = (
            row["measured"] <= row["target"]
            if row["better"] == "lower"
            else (row["measured"] >= row["target"])
        )
        assert row["met"] == met
        assert row["name"] in table
    assert f"of {len(rows)} targets met" in table
    assert "not measured" not in table


@pytest.mark.parametrize("strict, status", [(False, 0), (True, 1)])
def test_a_benchmark_that_fails_is_named_and_strict_mode_fails(
    tmp_path: Path, strict: bool, status: int
) -> None:
    """A benchmark that cannot run is reported, not silently left out of the table."""
    bad = tmp_path / "benchmarks"
    bad.mkdir()
    for name in ("check.py", "_harness.py"):
        (bad / name).write_text((BENCHMARKS / name).read_text())
    (bad / "bench_state.py").write_text("import sys\nsys.exit('no disk today')\n")
    command = [sys.executable, str(bad / "check.py"), "--only", "state"]
    if strict:
        command.append("--strict")
    done = subprocess.run(command, check=False, capture_output=True, text=True, timeout=60)
    assert done.returncode == status
    assert "not measured: bench_state.py exited with 1: no disk today" in done.stdout
