"""Every command and snippet in the README and the documentation site's pages (``docs/``,
every folder) runs as written, and shows what the text says it shows.

Each code block in the docs carries a marker comment saying how it is checked
(``<!-- docs-test: KIND [label] -->`` on the line before the fence); a block
without one fails ``test_every_block_says_how_it_is_checked``, so a new
snippet cannot go untested. Commands run exactly as typed, relative paths
included, in a fresh directory that holds only a ``.venv`` link to this
project's environment (what a user's clone holds after the quick start):
the first release's resume flow failed only with relative paths, which no
test used.

Kinds:

- ``quickstart``: the two ``make`` targets exist and do what the README says
  (``make test`` is what CI itself runs, so here only its recipe is read);
- ``shell``: each line is run in order in one fresh directory, and
  ``SHOWS`` says what its output must show;
- ``python``: the block is a script, run in a fresh directory (``continues``:
  after the file's previous python blocks); ``SHOWS`` again;
- ``pytest``: the block is a test file, run with pytest in a fresh directory;
- ``transcript``: ``$ command`` and its output; the command runs from the
  repository and its output must have every line shown, numbers aside;
- ``fragment FILE``: part of a complete example, ``FILE``, which its own test
  runs; the fragment's imports must work and the names it uses must be in FILE;
- ``install``: pip commands, checked against ``pyproject.toml`` and the Makefile;
- ``data KIND``: a file or record format, decoded by our own decoder (``slurm``,
  ``kubernetes``: a scheduler's file, read by bash or YAML, its grace checked against
  the ``preempt_grace`` it names).
"""

from __future__ import annotations

import functools
import importlib.util
import json
import math
import os
import re
import shlex
import subprocess
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path

import msgspec
import pytest

from eventbus import Report
from eventbus._codec import decode_json
from eventbus.log._format import LOG_FORMAT_VERSION, decode_jsonl_header
from eventbus.state._model import Snapshot

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
#: The README stays short: what it is, the quick start, one example, where to read on.
README_LINES = 300
VENV = Path(sys.prefix)
KINDS = {"quickstart", "shell", "python", "pytest", "transcript", "fragment", "install", "data"}
MARKER = re.compile(r"<!--\s*docs-test:\s*(?P<kind>\w+)\s*(?P<arg>[^>]*?)\s*-->")


@dataclass(frozen=True)
class Block:
    path: Path
    line: int
    lang: str
    text: str
    kind: str
    arg: str

    @property
    def where(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"


def doc_blocks() -> list[Block]:
    found: list[Block] = []
    for path in DOCS:
        lines = path.read_text().split("\n")
        i = 0
        while i < len(lines):
            if not lines[i].startswith("```"):
                i += 1
                continue
            start, lang = i, lines[i][3:].strip()
            end = next(j for j in range(i + 1, len(lines)) if lines[j].startswith("```"))
            marker = MARKER.fullmatch(lines[start - 1].strip()) if start else None
            found.append(
                Block(
                    path=path,
                    line=start + 1,
                    lang=lang,
                    text="\n".join(lines[start + 1 : end]) + "\n",
                    kind=marker["kind"] if marker else "",
                    arg=marker["arg"] if marker else "",
                )
            )
            i = end + 1
    return found


BLOCKS = doc_blocks()


def blocks_of(kind: str) -> list[Block]:
    return [b for b in BLOCKS if b.kind == kind]


def ids(blocks: list[Block]) -> list[str]:
    return [b.where for b in blocks]


def test_every_block_says_how_it_is_checked() -> None:
    unchecked = [b.where for b in BLOCKS if b.kind not in KINDS]
    assert unchecked == [], "add a <!-- docs-test: KIND --> marker before each of these"


def test_the_site_pages_are_read_too() -> None:
    """Blocks moved from the README to a page in a folder of ``docs/`` stay tested."""
    read = {b.path.relative_to(ROOT).parts[:2] for b in BLOCKS}
    assert {("docs", "guides"), ("docs", "operations"), ("docs", "trainers")} <= read


def test_the_readme_is_short() -> None:
    lines = (ROOT / "README.md").read_text().count("\n")
    assert lines <= README_LINES, f"README.md has {lines} lines, at most {README_LINES}"


def test_a_label_names_one_example() -> None:
    """The README's example is the guide's, word for word: blocks that share a label (and
    so what they must show) are the same text."""
    by_label: dict[str, set[str]] = {}
    for block in blocks_of("python") + blocks_of("pytest"):
        by_label.setdefault(block.arg.split()[0], set()).add(block.text)
    assert [label for label, texts in by_label.items() if len(texts) > 1] == []


def heading_anchors(path: Path) -> set[str]:
    """The anchors MkDocs gives a page's headings (its ``toc`` slugs, code spans' text kept)."""
    anchors = set()
    fenced = False
    for line in path.read_text().splitlines():
        fenced ^= line.startswith("```")
        if not fenced and (match := re.match(r"#{1,6} (.*)", line)):
            words = re.sub(r"[^\w\s-]", "", match[1].replace("`", "")).strip().lower()
            anchors.add(re.sub(r"[-\s]+", "-", words))
    return anchors


def relative_links(path: Path) -> list[str]:
    """The targets of a Markdown file's relative links and images, outside code."""
    text = re.sub(r"```.*?```", "", path.read_text(), flags=re.S)
    text = re.sub(r"`[^`]*`", "", text)
    targets = re.findall(r"\]\(([^)\s]+)\)", text)
    return [t for t in targets if not re.match(r"[a-z]+:", t)]


def test_the_readme_links_resolve_where_github_shows_them() -> None:
    """The README links the site's pages by path (MkDocs checks the pages' own links)."""
    broken = []
    for target in relative_links(ROOT / "README.md"):
        file, _, anchor = target.partition("#")
        path = ROOT / file
        if not path.is_file() or (anchor and anchor not in heading_anchors(path)):
            broken.append(target)
    assert broken == []
    assert len(relative_links(ROOT / "README.md")) >= 15


def test_each_command_help_names_the_page_that_explains_it() -> None:
    """``eventbus --help`` and each command's: ``docs: PAGE[#ANCHOR]``, a page of the site,
    the anchor one of its headings."""
    import argparse

    from adapters.cli import build_parser

    parser = build_parser()
    (commands,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    helps = {"eventbus": parser.format_help()}
    helps |= {name: sub.format_help() for name, sub in commands.choices.items()}
    assert set(helps) >= {"eventbus", "demo", "bench", "report", "show", "stats", "replay"}
    for name, text in helps.items():
        found = re.search(r"^docs: (docs/[\w/.-]+\.md)(?:#([\w-]+))?", text, re.M)
        assert found, f"eventbus {name} --help names no page:\n{text}"
        page, anchor = ROOT / found[1], found[2]
        assert page.is_file(), f"eventbus {name} --help: {found[1]} does not exist"
        assert anchor is None or anchor in heading_anchors(page), (name, anchor)


def test_an_unknown_option_names_the_section_that_lists_them() -> None:
    from handlers import open_run

    with pytest.raises(TypeError, match=r"unexpected option\(s\): perod") as raised:
        open_run(world_size=1, perod=2)  # type: ignore[call-arg]  # a typo, as a user makes
    found = re.search(r"listed in (docs/[\w/.-]+\.md)#([\w-]+)", str(raised.value))
    assert found, str(raised.value)
    assert found[2] in heading_anchors(ROOT / found[1]), str(raised.value)


# --- a fresh directory, as a user's --------------------------------------------------------


def fresh_directory(tmp_path: Path) -> Path:
    """A directory holding only ``.venv`` (this project's environment) and the user's
    own callback module the README's replay command names."""
    work = tmp_path / "work"
    work.mkdir()
    (work / ".venv").symlink_to(VENV)
    package = work / "yourpkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "callbacks.py").write_text(
        "from handlers import UserCallback\n\n\n"
        "class YourCallback(UserCallback):\n"
        "    def __init__(self):\n"
        "        self.rounds = 0\n\n"
        "    def after_report(self, run_context, metrics, checkpoint):\n"
        "        self.rounds += 1\n"
    )
    return work


def environment() -> dict[str, str]:
    env = dict(os.environ)
    env["PATH"] = f"{VENV / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    env.pop("PYTHONPATH", None)  # the installed project, as a user has it
    return env


def run(command: str | list[str], cwd: Path, timeout: float = 300) -> str:
    done = subprocess.run(
        command,
        shell=isinstance(command, str),
        executable="/bin/bash" if isinstance(command, str) else None,
        cwd=cwd,
        env=environment(),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, f"{command!r} exited {done.returncode}:\n{output[-3000:]}"
    return output


def shows(output: str, expected: list[str], what: str) -> None:
    missing = [pattern for pattern in expected if not re.search(pattern, output, re.M)]
    assert missing == [], f"{what} did not show {missing}; it printed:\n{output[-3000:]}"


# --- what each command and script shows ----------------------------------------------------

#: Shell commands of the docs (comments removed, spaces collapsed) -> patterns their output shows.
SHOWS: dict[str, list[str]] = {
    ".venv/bin/eventbus demo --out runs/a --fail-rank 2": [
        r"^run finished: \d+ rounds from \d+ reports",
        r"failures: 1, restarts: 1",
        r"checkpoints: \d+ in runs/a",
        r"event log: runs/a/demo-\w+\.evlog",
    ],
    ".venv/bin/eventbus stats runs/a/demo-*.evlog": [
        r"^events:\s+\d+",
        r"rounds:\s+\d+ complete across 4 rank",
        r"WorkerFailure\s+1",
    ],
    ".venv/bin/eventbus report runs/a/demo-*.evlog": [
        r"^report written to runs/a/demo-\w+\.html \(\d+ KB\): open it in a browser$",
    ],
    ".venv/bin/eventbus show runs/a/demo-*.evlog --type WorkerFailure --type "
    "WorkerGroupRestarted": [
        r"WorkerFailure\s+2\s+run_id=\S+ error_type=RuntimeError message=rank 2 lost its device",
        r"WorkerGroupRestarted\s+-\s+run_id=\S+ world_size=4",
    ],
    ".venv/bin/eventbus replay runs/a/demo-*.evlog --callbacks yourpkg.callbacks:YourCallback": [
        r"^replayed \d+ events",
        r"YourCallback\.after_report\s+\d+",
    ],
    ".venv/bin/eventbus demo --resume runs/a --steps 150": [
        r"resuming from runs/a/checkpoint_\d+: the latest complete checkpoint in runs/a",
        r"resumed from runs/a/checkpoint_\d+: restored EarlyStopping, BestCheckpoints, FinalLoss",
        r"^run finished",
    ],
    # Each command's help ends with the page that explains it (docs/operations/cli.md).
    ".venv/bin/eventbus --help": [r"^docs: docs/operations/cli\.md"],
    ".venv/bin/eventbus bench --help": [r"^docs: docs/guides/benchmarking\.md$"],
    ".venv/bin/eventbus bench noop early-stopping best-checkpoints --world-size 64 --rate 5": [
        r"callback\s+calls\s+mean µs",
        r"EarlyStopping\.after_report",
        r"the runtime('s cost is within the noise| adds \d+ ns per event)",
    ],
}

#: Labels of python and pytest blocks -> patterns their output shows.
SCRIPT_SHOWS: dict[str, list[str]] = {
    "writing-callbacks": [r"^run-\w+ \[1\.0, 1\.0, 1\.0, 1\.0\] None$", r"\[0\.01, 0\.01"],
    "the-bus": [r"^0 \{'loss': 0\.3\}$"],
    "replay-snippet": [r"^4 passed in"],  # asyncio and trio, as the README says
    "slow-callback": [r"^2 passed in"],  # the policy keeps the trainer's pace (issue 43)
    "stateful-callback": [],
    # One run: the same id twice, 30 rounds both times, early stopping's count restored.
    "resume": [r"^(run-\w+) 30 30\n\1 30 30$"],
    "store-use": [r"^\('__main__\.EarlyStopping',\) 2$"],
    "log-sketch": [r"^0 Report$", r"^3 Report$"],
    # The slow callback's calls, and the rounds (the fast gathering gets no span).
    "otel": [r"^\['Slow\.after_report', 'eventbus\.round'\]$"],
    # SIGTERM at step 5: the run ends preempted, exit code 143, its checkpoint snapshotted.
    "preemption": [r"^preempted 143 True$"],
}


def command_key(line: str) -> str:
    """The command of a shell line, without its comment, spaces collapsed."""
    return " ".join(shlex.split(line, comments=True, posix=True)).replace("'", "")


def commands(block: Block) -> list[tuple[str, str]]:
    """(line as written, key) for each command of a shell block."""
    found = []
    for line in block.text.splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            found.append((line, " ".join(line.split("#", 1)[0].split())))
    return found


def test_every_command_and_script_says_what_it_shows() -> None:
    missing = [
        f"{b.where}: {key}"
        for b in blocks_of("shell")
        for _, key in commands(b)
        if key not in SHOWS
    ]
    missing += [
        f"{b.where}: {b.arg.split()[0]}"
        for b in blocks_of("python") + blocks_of("pytest")
        if b.arg.split()[0] not in SCRIPT_SHOWS
    ]
    assert missing == [], "add what these show to SHOWS / SCRIPT_SHOWS"


@pytest.mark.parametrize("block", blocks_of("shell"), ids=ids(blocks_of("shell")))
def test_shell_commands_run_as_written_from_a_fresh_directory(block: Block, tmp_path: Path) -> None:
    work = fresh_directory(tmp_path)
    for line, key in commands(block):
        output = run(line, work)
        shows(output, SHOWS[key], key)


@pytest.mark.parametrize("block", blocks_of("python"), ids=ids(blocks_of("python")))
def test_python_snippets_run_as_written_from_a_fresh_directory(
    block: Block, tmp_path: Path
) -> None:
    label, *flags = block.arg.split()
    code = block.text
    if "continues" in flags:
        earlier = [b for b in blocks_of("python") if b.path == block.path and b.line < block.line]
        code = "\n\n".join(b.text for b in [*earlier, block])
    work = fresh_directory(tmp_path)
    (work / "snippet.py").write_text(code)
    output = run([sys.executable, "snippet.py"], work)
    shows(output, SCRIPT_SHOWS[label], f"{block.where} ({label})")


@pytest.mark.parametrize("block", blocks_of("pytest"), ids=ids(blocks_of("pytest")))
def test_test_snippets_pass_as_written_in_a_fresh_directory(block: Block, tmp_path: Path) -> None:
    work = fresh_directory(tmp_path)
    (work / "test_snippet.py").write_text(block.text)
    output = run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"], work)
    shows(output, SCRIPT_SHOWS[block.arg.split()[0]], block.where)


def test_the_complete_replay_example_passes() -> None:
    output = run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_replay_example.py"],
        ROOT / "examples",
    )
    shows(output, [r"\d+ passed"], "examples/test_replay_example.py")


# --- transcripts ------------------------------------------------------------------------------


#: The bench's last line takes one of three documented forms, by how steady the timings
#: were (a ratio, no ratio and why, or within the noise): on a busy machine any can show.
BENCH_COST_LINE = re.compile(r"^the runtime('s cost is within the noise| adds N ns per event)")


def shape(line: str) -> str:
    """A line of output with its figures taken out: numbers vary, words and columns not."""
    line = line.replace("NOT met", "met")
    line = re.sub(r"\d[\d,]*(\.\d+)?", "N", line)
    if BENCH_COST_LINE.match(line):
        return "the runtime's cost against the floor"
    return " ".join(line.split())


@pytest.mark.parametrize("block", blocks_of("transcript"), ids=ids(blocks_of("transcript")))
def test_transcripts_match_what_the_command_prints(block: Block) -> None:
    first, *shown = block.text.splitlines()
    assert first.startswith("$ "), f"{block.where}: a transcript starts with '$ command'"
    command = first[2:]
    if command.startswith("python "):
        command = f"{shlex.quote(sys.executable)} {command[len('python ') :]}"
    if "bench_hf_handoff" in command:
        pytest.importorskip("transformers")
    output = run(command, ROOT)
    printed = {shape(line) for line in output.splitlines()}
    missing = [line for line in shown if line.strip() and shape(line) not in printed]
    assert missing == [], f"{block.where}: `{first[2:]}` no longer prints:\n" + "\n".join(missing)


# --- fragments, installs, formats -------------------------------------------------------------


@pytest.mark.parametrize("block", blocks_of("fragment"), ids=ids(blocks_of("fragment")))
def test_fragments_belong_to_an_example_that_runs(block: Block) -> None:
    example = ROOT / block.arg
    assert example.is_file(), f"{block.where}: {block.arg} does not exist"
    runners = ("test_examples.py", "adapter_tests/test_ray_examples.py")
    assert any(example.name in (ROOT / "tests" / name).read_text() for name in runners), (
        f"{block.where}: {block.arg} is not run by tests/{' or tests/'.join(runners)}"
    )
    imports = [line for line in block.text.splitlines() if line.startswith(("from ", "import "))]
    ours = [line for line in imports if line.startswith("from adapters")]
    names = [name.strip() for line in ours for name in line.split("import", 1)[1].split(",")]
    source = example.read_text()
    assert [n for n in names if n not in source] == [], f"{block.where}: not used in {block.arg}"
    for adapter, library in LIBRARIES.items():
        if f"adapters.{adapter}" in block.text and importlib.util.find_spec(library) is None:
            pytest.skip(f"{block.where} needs {library}, not installed")
    failed = fragment_import_failures().get(block.where)
    assert failed is None, f"{block.where}: its imports fail in a fresh process:\n{failed}"


#: The libraries the adapters a fragment may import need (found, not imported: that takes
#: seconds, and the fragments' imports run in another process).
LIBRARIES = {"transformers": "transformers", "ray": "ray", "lightning": "lightning"}
#: Runs each fragment's imports in a fresh namespace, in one process (the heavy libraries
#: they import are loaded once, not once per fragment), and prints what failed, as JSON.
_IMPORT_EACH = """
import json, sys, traceback
failed = {}
for where, imports in json.loads(sys.argv[1]).items():
    try:
        exec(imports, {})
    except BaseException:
        failed[where] = traceback.format_exc()
print(json.dumps(failed))
"""


@functools.cache
def fragment_import_failures() -> dict[str, str]:
    """Per fragment (its ``where``), the traceback of its imports, if they failed."""
    imports = {
        block.where: "\n".join(
            line for line in block.text.splitlines() if line.startswith(("from ", "import "))
        )
        for block in blocks_of("fragment")
    }
    done = subprocess.run(
        [sys.executable, "-c", _IMPORT_EACH, json.dumps(imports)],
        cwd=ROOT,
        env=environment(),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, f"the fragments' imports crashed:\n{done.stderr[-3000:]}"
    failed: dict[str, str] = json.loads(done.stdout)
    return failed


def test_quick_start_targets_do_what_the_readme_says() -> None:
    (block,) = blocks_of("quickstart")
    targets = [line.split()[1] for line in block.text.splitlines() if line.startswith("make ")]
    assert targets == ["demo", "test"]
    demo = run(["make", "-n", "demo"], ROOT)
    assert re.search(r"\.venv/bin/eventbus demo$", demo, re.M), demo
    test = run(["make", "-n", "test"], ROOT)
    for step in (r"ruff check", r"ruff format --check", r"mypy", r"-m pytest"):
        assert re.search(step, test), f"make test does not run {step}:\n{test}"
    assert "make test" in (ROOT / ".ci" / "run").read_text()


@pytest.mark.parametrize("block", blocks_of("install"), ids=ids(blocks_of("install")))
def test_install_commands_name_what_the_project_provides(block: Block) -> None:
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    torch_pin = re.search(r"^TORCH \?= (\S+)$", (ROOT / "Makefile").read_text(), re.M)
    assert torch_pin is not None
    for line in block.text.splitlines():
        words = shlex.split(line, comments=True)
        if not words:
            continue
        assert words[:2] == ["pip", "install"], f"{block.where}: {line}"
        target = words[2]
        if target.startswith("torch"):
            assert target == torch_pin[1], f"{block.where}: the Makefile pins {torch_pin[1]}"
        else:
            match = re.fullmatch(r"\.\[(\w+)\]", target)
            assert match and match[1] in extras, f"{block.where}: no extra {target!r}"


@pytest.mark.parametrize("block", blocks_of("data"), ids=ids(blocks_of("data")))
def test_documented_formats_decode_with_our_decoders(block: Block) -> None:
    kind = block.arg.split()[0]
    if kind == "snapshot":
        snapshot = msgspec.json.decode(block.text.encode(), type=Snapshot)
        assert snapshot.states
    elif kind == "log-header":
        header = decode_jsonl_header(block.where, block.text.encode())
        assert header.format_version == LOG_FORMAT_VERSION
        assert header.event_types["RunBegan"] == "eventbus"  # public: stable across moves
    elif kind == "log-event":
        for line in block.text.splitlines():
            event = decode_json(line.encode())
            assert isinstance(event, Report)
            if "NaN" in line:  # the tokens JSON Lines writes for NaN and infinity
                assert math.isnan(event.metrics["loss"])
                assert event.metrics["grad_norm"] == math.inf
    elif kind == "slurm":
        # A batch script bash reads, whose signal comes early enough for the grace it names.
        check = subprocess.run(["bash", "-n"], input=block.text, text=True, check=False)
        assert check.returncode == 0, block.where
        (early,) = re.findall(r"^#SBATCH --signal=TERM@(\d+)$", block.text, re.M)
        assert "#SBATCH --requeue" in block.text
        assert _grace(block) < int(early)
    elif kind == "kubernetes":
        import yaml  # type: ignore[import-untyped]  # transformers' dependency, untyped

        pod = yaml.safe_load(block.text)
        assert pod["kind"] == "Pod"
        assert _grace(block) < pod["spec"]["terminationGracePeriodSeconds"]
    else:
        raise AssertionError(f"{block.where}: unknown data kind {kind!r}")


def _grace(block: Block) -> float:
    """The ``preempt_grace`` a scheduler's file says it leaves room for."""
    (grace,) = set(re.findall(r"preempt_grace=(\d+)", block.text))
    return float(grace)
