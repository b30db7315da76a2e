"""The suite's own configuration: the markers tests/conftest.py gives by path name tests that
exist and are registered, ``make check`` leaves out exactly those markers, and a browser test
without Chromium skips with one line saying how to install it, but fails in CI (and no test
installs it)."""

from __future__ import annotations

import ast
import os
import re
import shutil
import subprocess
import tomllib
from pathlib import Path

import _browser
import conftest
import pytest

pytest_plugins = ["pytester"]

ROOT = Path(__file__).resolve().parent.parent
TESTS = ROOT / "tests"


def defined_tests(path: Path) -> set[str]:
    """Names of the test functions and ``Class::method``s a test file defines."""
    tree = ast.parse(path.read_text())
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            names.add(node.name)
        elif isinstance(node, ast.ClassDef):
            names |= {
                f"{node.name}::{item.name}"
                for item in node.body
                if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef)
            }
    return names


def all_keys() -> list[str]:
    keys = [key for group in conftest.MARKERS.values() for key in group]
    longest = [name for name in conftest.LONGEST if name != "ray"]
    return (
        keys
        + list(conftest.TIMEOUTS)
        + list(conftest.THREAD_TIMEOUT)
        + longest
        + [*conftest.RAY_FILES]
    )


@pytest.mark.parametrize("key", all_keys())
def test_each_key_names_a_folder_file_or_test_that_exists(key: str) -> None:
    where, _, name = key.partition("::")
    path = TESTS / where
    if where.endswith("/"):
        assert path.is_dir(), f"{key}: no folder tests/{where}"
        return
    assert path.is_file(), f"{key}: no file tests/{where}"
    if name:
        bare = re.sub(r"\[.*\]$", "", name)
        assert bare in defined_tests(path), f"{key}: tests/{where} defines no {bare}"


def test_every_in_process_ray_cluster_is_the_shared_one() -> None:
    """A test module that starts its own cluster would run beside the shared one, on the
    other xdist worker or after it: each starts through ``ray_cluster`` (or joins it, through
    ``joining_ray``), in RAY_FILES."""
    starting = sorted(
        path.relative_to(TESTS).as_posix()
        for path in TESTS.rglob("test_*.py")
        if "ray.init(" in path.read_text() and path != Path(__file__).resolve()
    )
    assert starting == []
    using = sorted(
        path.relative_to(TESTS).as_posix()
        for path in TESTS.rglob("test_*.py")
        if any(name in path.read_text() for name in ("ray_cluster", "joining_ray"))
        and path != Path(__file__).resolve()
    )
    assert using == sorted(conftest.RAY_FILES)


def test_a_key_is_listed_once_in_each_table() -> None:
    tables = [*conftest.MARKERS.values(), list(conftest.TIMEOUTS), conftest.THREAD_TIMEOUT]
    assert [sorted({k for k in keys if list(keys).count(k) > 1}) for keys in tables] == [
        [] for _ in tables
    ]


def test_the_markers_given_are_the_ones_registered() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    registered = {
        line.split(":", 1)[0] for line in config["tool"]["pytest"]["ini_options"]["markers"]
    }
    assert registered == set(conftest.MARKERS) == {"slow", "browser", "crash", "adapters"}


def test_make_check_leaves_out_exactly_those_markers() -> None:
    quick = re.search(r"^QUICK := (.+)$", (ROOT / "Makefile").read_text(), re.M)
    assert quick is not None
    assert set(quick[1].split(" and ")) == {f"not {marker}" for marker in conftest.MARKERS}


def test_keys_match_folders_files_tests_and_parameters() -> None:
    assert conftest.matches(["adapter_tests/"], "adapter_tests/test_ray.py", "test_x")
    assert conftest.matches(["test_a.py"], "test_a.py", "test_x[1]")
    assert conftest.matches(["test_a.py::test_x"], "test_a.py", "test_x[1-2]")
    assert not conftest.matches(["test_a.py::test_x"], "test_a.py", "test_xy")
    assert not conftest.matches(["test_a.py"], "test_ab.py", "test_x")
    key = "test_a.py::test_x[*-Ray *]"
    assert conftest.matches([key], "test_a.py", "test_x[nan-Ray EventBusUserCallback]")
    assert not conftest.matches([key], "test_a.py", "test_x[nan-EventBus]")


@pytest.fixture
def no_chromium(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A PATH with no browser on it, and any attempt to start a process is an error."""
    monkeypatch.setenv("PATH", str(tmp_path))

    def refused(*args: object, **kwargs: object) -> None:
        raise AssertionError(f"a test helper tried to run {args!r}")

    for name in ("run", "Popen", "call", "check_call", "check_output"):
        monkeypatch.setattr(subprocess, name, refused)
    monkeypatch.setattr(os, "system", refused)
    monkeypatch.setattr(os, "posix_spawn", refused)
    assert shutil.which("chromium") is None


@pytest.mark.usefixtures("no_chromium")
def test_without_chromium_a_browser_test_skips_saying_how_to_install_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception) as skipped:
        _browser.require_chromium()
    message = str(skipped.value)
    assert "\n" not in message
    assert "Chromium" in message
    assert "apt-get install chromium" in message


@pytest.mark.usefixtures("no_chromium")
@pytest.mark.parametrize("value", ["true", "1", "yes"])
def test_in_ci_without_chromium_a_browser_test_fails(
    monkeypatch: pytest.MonkeyPatch, value: str
) -> None:
    monkeypatch.setenv("CI", value)
    with pytest.raises(pytest.fail.Exception, match="apt-get install chromium"):
        _browser.require_chromium()


@pytest.mark.parametrize(("ci", "outcome"), [("", "skipped"), ("true", "failed")])
def test_a_browser_test_that_skips_for_any_reason_fails_in_ci(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, ci: str, outcome: str
) -> None:
    """The conftest's guard, whatever made the test skip (here, a bare pytest.skip)."""
    monkeypatch.setenv("CI", ci)
    # This suite's conftest, as a plugin under another name ("conftest" is imported already),
    # marking a test file of another name (this session imported the real one).
    shutil.copy2(TESTS / "conftest.py", pytester.path / "suite_conftest.py")
    pytester.makeconftest(
        "import suite_conftest\n\n"
        'suite_conftest.MARKERS["browser"] = ("test_pretend_browser.py",)\n'
        'pytest_plugins = ["suite_conftest"]\n'
    )
    pytester.makepyfile(
        test_pretend_browser="import pytest\n\ndef test_it():\n    pytest.skip('no browser')\n"
    )
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider")
    result.assert_outcomes(**{outcome: 1})
    if ci:
        result.stdout.fnmatch_lines(["*a browser test skipped in CI*no browser*"])
