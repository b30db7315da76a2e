"""``benchmarks/bench_trainer_overhead.py`` runs and reports its targets (figures are for
people: ratios on a shared machine are never asserted). One round of each section: the
real HF and Lightning Trainers' conditions and the ``open_run`` loop, side by side, baton
passed."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("transformers")
pytest.importorskip("lightning")

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_trainer_overhead.py"


def test_the_trainer_benchmark_reports_every_section_and_its_targets() -> None:
    command = [sys.executable, str(BENCH), "--quick", "--json", "--open-run", "--lightning"]
    done = subprocess.run(
        [*command, "--rounds", "1"], capture_output=True, text=True, timeout=280, check=False
    )
    assert done.returncode == 0, done.stderr[-2000:]
    results = json.loads(done.stdout)
    sections = results["sections"]
    hf, lightning, loop = sections["hf"], sections["lightning"], sections["open_run"]
    assert set(hf["conditions"]) == {"none", "hand", "ours"}
    assert set(lightning["conditions"]) == {"pl-none", "pl-hand", "pl-ours"}
    assert set(loop["conditions"]) == {"loop", "open-run", "open-run-full"}
    for section in (hf, lightning, loop):
        for delivered in section["delivered"].values():
            assert delivered  # every process trained and said what it delivered
    # Every step's log reached our callbacks as one round (HF's end-of-training summary
    # log is the run's summary, not a round).
    for section, prefix in ((hf, "ours"), (lightning, "pl-ours")):
        ours = next(d for name, d in section["delivered"].items() if name.startswith(prefix))
        assert ours["dropped"] == 0 and ours["trivial_rounds"] == ours["steps"]
    names = [row["name"] for row in results["targets"]]
    assert names == [
        "HF Trainer steps/s lost to EventBusCallback (4 callbacks, log, snapshots)",
        "HF Trainer steps/s lost: EventBusCallback minus hand-written TrainerCallbacks",
        "Lightning Trainer steps/s lost to EventBusCallback (4 callbacks, log, snapshots)",
        "Lightning Trainer steps/s lost: EventBusCallback minus hand-written Callbacks",
        "open_run, 4 async workers: steps/s lost to 4 callbacks, log, snapshots",
    ]
    for row in results["targets"]:
        assert row["met"] == (row["measured"] <= row["target"])
