"""The README's and docs' Python examples pass ``mypy --strict`` and pyright as written.

A user copies an example into a typed project and runs their type checker on
it: what they read after ``async with`` must have the type it has then. The
blocks are those ``tests/test_docs.py`` runs (kinds ``python`` and
``pytest``; a ``continues`` block after the file's earlier python blocks, as
it runs), found with its helpers; each is written to a folder of its own
outside the repository (no project configuration applies: the checkers'
defaults, as a user has them), then one ``mypy --strict`` and one pyright
invocation check them all, since each pays for reading the installed
packages. Each block is a test of its own, named by where it is, so a
failure says which example and which line.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_docs import ROOT, Block, blocks_of, environment, ids

SNIPPETS = blocks_of("python") + blocks_of("pytest")
#: A deliberate error in a file of its own beside the snippets: each checker must report
#: it, so a checker that read nothing (or output this file cannot parse) is not a pass.
CANARY = "canary.py"
CANARY_CODE = 'wrong: int = "a str"\n'


def script(block: Block) -> str:
    """The code as ``tests/test_docs.py`` runs it: a ``continues`` block after its file's
    earlier python blocks."""
    if "continues" not in block.arg.split()[1:]:
        return block.text
    earlier = [b for b in blocks_of("python") if b.path == block.path and b.line < block.line]
    return "\n\n".join(b.text for b in [*earlier, block])


def file_name(block: Block) -> str:
    """A module name per block, unique, that says where it comes from."""
    label = block.arg.split()[0]
    where = "_".join(block.path.relative_to(ROOT).with_suffix("").parts)  # docs/guides/x.md
    return re.sub(r"\W", "_", f"{where}_{block.line}_{label}").lower() + ".py"


@pytest.fixture(scope="module")
def snippets(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("snippets")
    names = [file_name(b) for b in SNIPPETS]
    assert len(set(names)) == len(names), names
    for block, name in zip(SNIPPETS, names, strict=True):
        (folder / name).write_text(script(block))
    (folder / CANARY).write_text(CANARY_CODE)
    return folder


def checker(command: list[str], folder: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        command,
        cwd=folder,
        env=environment(),
        capture_output=True,
        text=True,
        timeout=280,
        check=False,
    )


def by_file(found: Iterator[tuple[str, str]]) -> dict[str, list[str]]:
    errors: dict[str, list[str]] = {}
    for name, line in found:
        errors.setdefault(name, []).append(line)
    return errors


@pytest.fixture(scope="module")
def mypy_errors(snippets: Path) -> dict[str, list[str]]:
    """File name -> mypy's error lines, from one ``mypy --strict`` over every snippet."""
    done = checker(
        [
            sys.executable,
            "-m",
            "mypy",
            "--strict",
            "--no-error-summary",
            "--no-pretty",
            "--no-color-output",
            "--cache-dir",
            str(snippets / ".mypy_cache"),
            ".",
        ],
        snippets,
    )
    lines = done.stdout.splitlines()
    assert done.returncode in (0, 1) and all(":" in line for line in lines), (
        f"mypy exited {done.returncode}:\n{done.stdout}{done.stderr}"
    )
    return by_file(
        (line.split(":", 1)[0], line) for line in lines if re.search(r":\d+: error:", line)
    )


@pytest.fixture(scope="module")
def pyright_errors(snippets: Path) -> dict[str, list[str]]:
    """File name -> pyright's errors (``file:line: message (rule)``), from one run."""
    done = checker(
        [sys.executable, "-m", "pyright", "--outputjson", "--pythonpath", sys.executable, "."],
        snippets,
    )
    try:
        report = json.loads(done.stdout)
    except json.JSONDecodeError:
        pytest.fail(f"pyright exited {done.returncode}:\n{done.stdout}{done.stderr}", False)
    assert report["summary"]["filesAnalyzed"] == len(SNIPPETS) + 1, report["summary"]
    return by_file(
        (
            Path(d["file"]).name,
            f"{Path(d['file']).name}:{d['range']['start']['line'] + 1}: {d['message']}"
            f" ({d.get('rule', '')})",
        )
        for d in report["generalDiagnostics"]
        if d["severity"] == "error"
    )


def test_the_checkers_read_the_snippets_and_report_their_errors(
    mypy_errors: dict[str, list[str]], pyright_errors: dict[str, list[str]]
) -> None:
    for errors in (mypy_errors, pyright_errors):
        assert len(errors.get(CANARY, [])) == 1, errors
        assert set(errors) <= {CANARY, *(file_name(b) for b in SNIPPETS)}, errors


def in_the_docs(block: Block, errors: list[str]) -> str:
    """The errors, each at its line in the README or doc (``file.py:N:`` is the snippet's
    line; a ``continues`` block's earlier blocks keep their snippet line)."""
    earlier = script(block).count("\n") - block.text.count("\n")

    doc = block.where.rsplit(":", 1)[0]

    def place(match: re.Match[str]) -> str:
        line = int(match[1])
        return f"{doc}:{block.line + line - earlier}:" if line > earlier else match[0]

    return "\n".join(re.sub(r"^[\w.]+\.py:(\d+):", place, error) for error in errors)


@pytest.mark.parametrize("block", SNIPPETS, ids=ids(SNIPPETS))
def test_the_example_passes_mypy_strict(block: Block, mypy_errors: dict[str, list[str]]) -> None:
    errors = mypy_errors.get(file_name(block), [])
    assert errors == [], f"{block.where}: mypy --strict:\n" + in_the_docs(block, errors)


@pytest.mark.parametrize("block", SNIPPETS, ids=ids(SNIPPETS))
def test_the_example_passes_pyright(block: Block, pyright_errors: dict[str, list[str]]) -> None:
    errors = pyright_errors.get(file_name(block), [])
    assert errors == [], f"{block.where}: pyright:\n" + in_the_docs(block, errors)


def test_the_examples_pass_pyright_as_written() -> None:
    """``examples/`` as a user opens them in an editor that runs pyright (mypy --strict
    already checks them with the packages, ``make typecheck``)."""
    examples = Path(__file__).resolve().parent.parent / "examples"
    done = checker(
        [sys.executable, "-m", "pyright", "--outputjson", "--pythonpath", sys.executable, "."],
        examples,
    )
    report = json.loads(done.stdout)
    assert report["summary"]["filesAnalyzed"] >= len(list(examples.glob("*.py")))
    errors = [
        f"{Path(d['file']).name}:{d['range']['start']['line'] + 1}: {d['message']}"
        for d in report["generalDiagnostics"]
        if d["severity"] == "error"
    ]
    assert errors == []
