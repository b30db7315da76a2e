"""CONTRIBUTING.md names what exists: its ``make`` targets, pytest markers and files. (Its
commands are not run here: ``make test`` is the whole suite, and tests/test_docs.py runs the
README's and docs/'s commands.)"""

from __future__ import annotations

import re
import subprocess
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TEXT = (ROOT / "CONTRIBUTING.md").read_text()


def test_every_make_target_it_names_exists() -> None:
    targets = sorted(set(re.findall(r"\bmake ([a-z][\w-]*)", TEXT)))
    assert {"test", "check", "demo", "bench", "bench-quick", "chromium"} <= set(targets)
    for target in targets:
        done = subprocess.run(
            ["make", "-n", target], cwd=ROOT, capture_output=True, text=True, check=False
        )
        assert done.returncode == 0, f"make {target}: {done.stderr}"


def test_every_marker_it_names_is_registered() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    registered = {m.split(":", 1)[0] for m in config["tool"]["pytest"]["ini_options"]["markers"]}
    named = set(re.findall(r"pytest -m \"?(?:not )?(\w+)", TEXT))
    assert named and named <= registered


def test_every_file_it_names_exists() -> None:
    paths = {
        path
        for path in re.findall(r"`([\w./-]+)`", TEXT)
        if "/" in path and not path.startswith(("http", ".venv/bin/"))
    }
    assert paths
    missing = sorted(p for p in paths if not (ROOT / p.rstrip("/")).exists())
    assert missing == []
