"""Make ``docs/report.png``, the README's picture of a real run report.

A demo run with a failing rank (so a failure and a restart), its report, and a
screenshot of the page by headless Chromium (Debian's ``chromium``)::

    .venv/bin/python docs/screenshot.py [OUT.png]
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

DOCS = Path(__file__).resolve().parent
EVENTBUS = [sys.executable, "-m", "adapters.cli"]
DEMO = ["demo", "--out", "run", "--fail-rank", "2", "--steps", "300", "--period", "0.1"]
DEMO += ["--patience", "1000", "--seed", "3"]


def main(out: Path) -> int:
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        print("docs/screenshot.py: needs chromium (apt-get install chromium)", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as folder:
        here = Path(folder)
        subprocess.run([*EVENTBUS, *DEMO], cwd=here, check=True, capture_output=True)
        (log,) = (here / "run").glob("demo-*.evlog")
        subprocess.run([*EVENTBUS, "report", str(log), "-o", "report.html"], cwd=here, check=True)
        subprocess.run(
            [
                chromium,
                "--headless=new",
                "--no-sandbox",  # as root (CI, containers); harmless otherwise
                "--hide-scrollbars",
                "--window-size=1280,2900",
                "--virtual-time-budget=5000",  # let the charts draw before the shot
                f"--screenshot={out.resolve()}",
                (here / "report.html").as_uri(),
            ],
            check=True,
            capture_output=True,
        )
    print(f"screenshot written to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1]) if len(sys.argv) > 1 else DOCS / "report.png"))
