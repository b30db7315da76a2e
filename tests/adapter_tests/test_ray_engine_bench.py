"""``benchmarks/bench_ray_engine.py`` runs and reports its target (figures are for people:
ratios on a shared machine are never asserted). One short pair of jobs, plain Ray Train
and ``RayEngine``, on the Ray files' cluster (``RAY_ADDRESS``: one cluster start fewer)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from _ray_env import quiet_ray

quiet_ray()  # before ray is imported (by the cluster's fixture)

pytest.importorskip("ray.train")
pytest.importorskip("torch")

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_ray_engine.py"


def test_the_ray_engine_benchmark_reports_both_conditions_and_its_target(
    joining_ray: dict[str, str],
) -> None:
    command = [sys.executable, str(BENCH), "--json", "--pairs", "1", "--steps", "40"]
    command += ["--warmup", "10", "--save-every", "20", "--hidden", "64"]
    done = subprocess.run(
        command, capture_output=True, text=True, timeout=280, check=False, env=joining_ray
    )
    # It exits non-zero when a condition's callbacks did not see every step's round.
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads(done.stdout)
    assert set(results["conditions"]) == {"plain", "ours"}
    for figures in results["conditions"].values():
        assert figures["steps_per_s"]["median"] > 0
    assert set(results["lost_pct"]) == {"ours"}
    (row,) = results["targets"]
    assert row["name"] == "Ray Train steps/s lost to RayEngine (4 callbacks, log, snapshots)"
    assert row["met"] == (row["measured"] <= row["target"])
    assert row["peer"].startswith("plain Ray Train: ")
