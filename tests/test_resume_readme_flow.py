"""The README's resume flow, typed as a user types it: relative paths, from a fresh directory.

Issue 20: ``eventbus demo --out runs/a --fail-rank 2`` then ``eventbus demo
--resume runs/a/checkpoint_000040 --steps 150`` printed "restored nothing":
the demo reported ``runs/a/checkpoint_000010`` with the state root
``runs/a``, and the store took the location from the root a second time,
writing ``runs/a/runs/a/checkpoint_000010/callback_state.json``. Resuming
into another run directory (``--out runs/b``) was refused outright, the
checkpoint being outside the new root.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path


def eventbus(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """The installed ``eventbus`` command (as the README runs it), in ``cwd``."""
    script = Path(sys.executable).with_name("eventbus")
    command = [str(script)] if script.exists() else [sys.executable, "-m", "adapters.cli"]
    return subprocess.run(
        [*command, *args], cwd=cwd, capture_output=True, text=True, timeout=300, check=False
    )


def test_readme_resume_flow_with_relative_paths_restores_the_callbacks(tmp_path: Path) -> None:
    first = eventbus(tmp_path, "demo", "--out", "runs/a", "--fail-rank", "2")
    assert first.returncode == 0, first.stderr
    state = tmp_path / "runs" / "a" / "checkpoint_000040" / "callback_state.json"
    assert state.is_file()
    assert not (tmp_path / "runs" / "a" / "runs").exists()  # not taken from the root twice
    saved = json.loads(state.read_text())
    assert {k.split("[")[0].rsplit(".", 1)[-1] for k in saved["states"]} == {
        "EarlyStopping",
        "BestCheckpoints",
        "FinalLoss",
    }

    second = eventbus(tmp_path, "demo", "--resume", "runs/a/checkpoint_000040", "--steps", "150")
    assert second.returncode == 0, second.stderr
    assert "restored EarlyStopping, BestCheckpoints, FinalLoss" in second.stdout, second.stdout

    # Into another run directory: the operator's checkpoint lies outside the new root.
    third = eventbus(
        tmp_path,
        "demo",
        "--resume",
        "runs/a/checkpoint_000040",
        "--out",
        "runs/b",
        "--steps",
        "150",
    )
    assert third.returncode == 0, third.stderr
    assert "restored EarlyStopping, BestCheckpoints, FinalLoss" in third.stdout, third.stdout
    written = sorted((tmp_path / "runs" / "b").glob("checkpoint_*/callback_state.json"))
    assert written  # the new run's snapshots go under its own root
    assert not (tmp_path / "runs" / "b" / "runs").exists()
    rounds = [
        next(v for k, v in json.loads(p.read_text())["states"].items() if "EarlyStopping" in k)[
            "attributes"
        ]["rounds"]
        for p in written
    ]
    # Early stopping went on counting from its restored state, not from zero.
    assert min(rounds) > saved_rounds(saved)


def saved_rounds(snapshot: dict[str, object]) -> int:
    states = snapshot["states"]
    assert isinstance(states, dict)
    early = next(v for k, v in states.items() if "EarlyStopping" in k)
    return int(early["attributes"]["rounds"])
