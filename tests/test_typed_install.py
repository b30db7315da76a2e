"""The installed packages are typed for their users: mypy run on a user's own code, in another
directory, sees ``eventbus``, ``handlers`` and ``adapters`` (the Makefile's editable install is
``editable_mode=strict``: setuptools' default import hook is invisible to type checkers), and
the wheel carries their ``py.typed`` markers. The install puts the three packages alone on the
path: not tests/, benchmarks/, examples/ or docs/."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.prefix) / "bin"
PACKAGES = ("eventbus", "handlers", "adapters")

USER_CODE = """\
from eventbus import EventBus
from handlers import UserCallback, open_run


class Counter(UserCallback):
    def __init__(self) -> None:
        self.rounds = 0


def make() -> tuple[Counter, EventBus | None]:
    return Counter(), None


runner = open_run
callback, bus = make()
wrong: str = callback  # the deliberate error: only seen if mypy knows UserCallback
"""


def clean_environment(home: Path) -> dict[str, str]:
    """What a user's shell would have: no MYPYPATH or PYTHONPATH, a HOME without our configs."""
    return {
        "PATH": f"{BIN}{os.pathsep}/usr/bin{os.pathsep}/bin",
        "HOME": str(home),
        "LANG": "C.UTF-8",
    }


def outside_the_repository(tmp_path: Path) -> Path:
    work = tmp_path / "user"
    work.mkdir()
    return work


def test_the_packages_import_from_another_directory_and_nothing_else_of_the_repository(
    tmp_path: Path,
) -> None:
    work = outside_the_repository(tmp_path)
    probe = (
        "import importlib.util, eventbus, handlers, adapters, adapters.report\n"
        "print(sorted(n for n in ('tests', 'benchmarks', 'examples', 'docs') "
        "if importlib.util.find_spec(n) is not None))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe],
        cwd=work,
        env=clean_environment(work),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]", "the install put more than the packages on the path"


def test_mypy_on_a_users_code_sees_the_installed_packages(tmp_path: Path) -> None:
    if importlib.util.find_spec("mypy") is None or not (BIN / "mypy").exists():
        pytest.skip("needs mypy (the `dev` extra: make test installs it)")
    work = outside_the_repository(tmp_path)
    (work / "mycode.py").write_text(USER_CODE)
    done = subprocess.run(
        [str(BIN / "mypy"), "--no-error-summary", "mycode.py"],
        cwd=work,
        env=clean_environment(work),
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    output = done.stdout + done.stderr
    assert "Cannot find implementation" not in output, (
        "mypy cannot see the installed packages (reinstall: make .venv/.installed-all):\n" + output
    )
    assert "py.typed" not in output, output
    line = next(n for n, text in enumerate(USER_CODE.splitlines(), 1) if text.startswith("wrong"))
    expected = (
        f"mycode.py:{line}: error: Incompatible types in assignment "
        '(expression has type "Counter", variable has type "str")  [assignment]'
    )
    errors = [text for text in output.splitlines() if ": error:" in text]
    assert errors == [expected], output
    assert done.returncode == 1, output


def test_the_wheel_carries_py_typed_for_every_package(tmp_path: Path) -> None:
    """Built from a copy of the project (so the working tree gets no build/ or egg-info), by
    the installed setuptools, with no network (``--no-build-isolation``)."""
    source = tmp_path / "source"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, source / name)
    for package in PACKAGES:
        shutil.copytree(
            ROOT / package, source / package, ignore=shutil.ignore_patterns("__pycache__")
        )
    dist = tmp_path / "dist"
    done = subprocess.run(
        [
            *(sys.executable, "-m", "pip", "wheel", "--quiet", "--disable-pip-version-check"),
            *("--no-deps", "--no-build-isolation", "--wheel-dir", str(dist), str(source)),
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    (wheel,) = dist.glob("train_eventbus-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
    assert {f"{package}/py.typed" for package in PACKAGES} <= names
    # Every subpackage is in it (py.typed at the top covers them, PEP 561), and nothing else.
    tops = {name.split("/", 1)[0] for name in names if not name.startswith("train_eventbus-")}
    assert tops == set(PACKAGES)
    expected = {
        path.relative_to(ROOT).as_posix()
        for package in PACKAGES
        for path in (ROOT / package).rglob("__init__.py")
    }
    assert expected <= names
    assert "adapters/report/_assets/report.js" in names
