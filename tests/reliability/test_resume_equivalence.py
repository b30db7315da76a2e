"""Resume equivalence: a run killed anywhere and resumed ends where an uninterrupted run ends.

The property (issue 13): for the deterministic demo trainer, with a random
seed, world size, checkpoint interval and patience, SIGKILL a real
subprocess at random points (two to four times in a row, each resumed
run killed again), resume from the latest checkpoint each time, and
compare with a run never interrupted:

- the final summaries are equal (status, rounds, reports, last checkpoint,
  final mean loss, every stateful callback's final ``state()``), exactly;
- the history log (the one file every resumed segment appended to)
  replays to exactly the callback inputs the uninterrupted run's log
  replays to: ``before_run`` once, every round's metrics and checkpoint,
  ``after_run``'s figures. The rolled-back events stay in the log and are
  left out.

Kill points: the dispatcher taking the batch holding the N-th event (before
the log or any handler saw it), the N-th event handled by every handler, or
a timer in the parent at a random moment (start-up, training, shutdown; each
process is forked from one that imported the demo, see ``_killed_demo.py``, as
nothing happens to a run's files while Python imports). SIGTERM (issue 40) at
the same points, the N-th event handled or a timer: the run is preempted,
checkpoints where it stands and exits 143, and the requeued run must end as
the uninterrupted one too. ``--soak`` tries ten times as many.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Generator
from functools import cache
from pathlib import Path
from typing import Any, NamedTuple

import anyio
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from eventbus import TrainRunContext
from eventbus.log import LogReader
from eventbus.log._history import rollbacks
from eventbus.testing import replay_log
from handlers import UserCallback

from ._figures import FIGURES

DRIVER = Path(__file__).with_name("_killed_demo.py")
ROOT = Path(__file__).resolve().parents[2]
#: Examples in the normal run: each kills two to four times in a row.
EXAMPLES = int(os.environ.get("RESUME_EXAMPLES", "60"))
SOAK_EXAMPLES = 600

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


class Params(NamedTuple):
    seed: int
    workers: int
    every: int
    steps: int
    patience: int

    def demo_args(self) -> list[str]:
        return [
            "--out", "run", "--seed", str(self.seed), "--workers", str(self.workers),
            "--checkpoint-every", str(self.every), "--steps", str(self.steps),
            "--patience", str(self.patience), "--step-time", "0", "--period", "0.2",
        ]  # fmt: skip


#: How the driver may end: finished, SIGKILLed, preempted (143), or SIGTERMed before
#: the run installed its handler (a timer during start-up).
_ENDS = (0, -signal.SIGKILL, 143, -signal.SIGTERM)


class Forks:
    """Two demo servers (``_killed_demo.py --serve``), each with the modules imported once,
    forking a demo per call, taken in turn: one after another, two processes never share
    Python's hash seed (as when each was started afresh)."""

    def __init__(self) -> None:
        env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
        env.pop("PYTHONHASHSEED", None)
        self.servers = [
            subprocess.Popen(
                [sys.executable, str(DRIVER), "--serve"],
                env=env,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
            )
            for _ in range(2)
        ]
        self.calls = 0

    def demo(self, cwd: Path, argv: list[str], timer: float | None, signum: int) -> int | None:
        server = self.servers[self.calls % 2]
        self.calls += 1
        assert server.stdin is not None and server.stdout is not None
        stderr = cwd / "stderr.txt"
        request = {"cwd": str(cwd), "argv": argv, "stderr": str(stderr), "timer": timer}
        server.stdin.write(json.dumps({**request, "signum": signum}) + "\n")
        server.stdin.flush()
        answer = server.stdout.readline()
        assert answer, f"the demo server ended ({server.poll()})"
        code: int | None = json.loads(answer)
        return code

    def close(self) -> None:
        for server in self.servers:
            assert server.stdin is not None and server.stdout is not None
            server.stdin.close()
            server.wait(timeout=30)
            server.stdout.close()


def _demo(
    cwd: Path,
    kill_at: int,
    mode: str,
    args: list[str],
    *,
    timer: float | None = None,
    signum: int = signal.SIGKILL,
) -> int:
    """Run the driver in ``cwd`` (a process forked by the module's ``Forks``), ``signum``
    sent at ``timer`` seconds if given; returns its exit code (``-9`` when it was
    SIGKILLed, 143 when preempted)."""
    (forks,) = _FORKS
    code = forks.demo(cwd, [str(kill_at), mode, *args], timer, signum)
    stderr = (cwd / "stderr.txt").read_text(errors="replace")
    assert code is not None, f"demo hung: {stderr[-3000:]}"
    assert code in _ENDS, f"demo failed ({code}): {stderr[-3000:]}"
    return code


def _latest_checkpoint(out: Path) -> Path | None:
    """The latest checkpoint whose callback states were written (what an operator resumes)."""
    done = sorted(p.parent for p in out.glob("checkpoint_*/callback_state.json"))
    return done[-1].relative_to(out.parent) if done else None


@cache
def _reference(params: Params, where: Path) -> tuple[dict[str, Any], Path, int, float]:
    """The uninterrupted run: its summary, its log, its event count, its duration."""
    cwd = where / ("ref-" + "-".join(map(str, params)))
    cwd.mkdir(parents=True)
    started = time.perf_counter()
    _demo(cwd, 0, "never", [*params.demo_args(), "--summary", "summary.json"])
    duration = time.perf_counter() - started
    (log,) = (cwd / "run").glob("*.evlog")
    with LogReader(log) as reader:
        events = sum(1 for _ in reader)
    return _outcome(cwd / "summary.json"), log, events, duration


def _outcome(summary: Path) -> dict[str, Any]:
    """The demo's summary less what differs between any two runs (its callbacks' costs)."""
    figures: dict[str, Any] = json.loads(summary.read_text())
    del figures["callback_costs"]
    return figures


def _without_checkpoints(found: Any) -> Any:
    """A summary or a history with every checkpoint left out: a preempted run checkpoints
    where the signal found it, one checkpoint more than the uninterrupted run, which the
    callbacks that keep checkpoints (``BestCheckpoints``) and the round carrying it show;
    everything else must be equal."""
    if isinstance(found, dict):
        return {
            k: _without_checkpoints(v)
            for k, v in found.items()
            if k != "last_checkpoint" and not k.startswith("handlers.BestCheckpoints")
        }
    if isinstance(found, list):
        return [_call_without_checkpoint(call) for call in found]
    return found


def _call_without_checkpoint(call: tuple[Any, ...]) -> tuple[Any, ...]:
    if call[0] == "after_report":
        return (*call[:2], None)
    if call[0] == "after_run":
        return call[:4]  # its last checkpoint left out
    return call


def _preemption_checkpoints(got: list[Any], want: list[Any]) -> set[str]:
    """The checkpoints the preempted history's rounds carry that the uninterrupted run's
    do not: each must be a checkpoint on disk."""
    carried = {call[2] for call in want if call[0] == "after_report"}
    return {
        call[2] for call in got if call[0] == "after_report" and call[2] and call[2] not in carried
    }


class Inputs(UserCallback):
    """Keeps what every hook was given (run ids and start times aside: runs differ there)."""

    def __init__(self) -> None:
        self.calls: list[Any] = []

    def before_run(self, run_context: TrainRunContext) -> None:
        self.calls.append(("before_run", run_context.world_size, dict(run_context.config)))

    def after_report(
        self, run_context: TrainRunContext, metrics: list[dict[str, Any]], checkpoint: str | None
    ) -> None:
        self.calls.append(("after_report", [dict(m) for m in metrics], checkpoint))

    def after_exception(
        self, run_context: TrainRunContext, worker_exceptions: dict[int, Exception]
    ) -> None:
        self.calls.append(("after_exception", {r: str(e) for r, e in worker_exceptions.items()}))

    def after_run(self, run_context: TrainRunContext, result: Any) -> None:
        self.calls.append(
            ("after_run", result.status, result.rounds, result.reports, result.last_checkpoint)
        )


def _replayed_inputs(log: Path) -> tuple[list[Any], int]:
    inputs = Inputs()

    async def replay() -> int:
        result = await replay_log(log, inputs)
        return result.summary.rolled_back

    rolled_back = anyio.run(replay)
    return inputs.calls, rolled_back


#: Where each kill lands: at an event (before anything saw its batch, or once every
#: handler handled it), or at a random moment of the process's life (start-up included).
kill_spec = st.tuples(
    st.sampled_from(["batch", "handled", "term", "handled", "timer", "term", "timer-term"]),
    st.floats(0.0, 0.999),
)


def _settings(examples: int) -> Any:
    return settings(
        max_examples=examples,
        deadline=None,
        derandomize=True,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
    )


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("resume")


#: The demo servers of this module's test, while it runs (``forks``). Not an argument
#: of ``_demo``: hypothesis draws its examples from a digest of ``check``'s source, and
#: this keeps them the examples drawn when each demo was a process started afresh.
_FORKS: list[Forks] = []


@pytest.fixture(scope="module", autouse=True)
def forks() -> Generator[Forks]:
    served = Forks()
    _FORKS.append(served)
    yield served
    _FORKS.remove(served)
    served.close()


def test_a_run_killed_anywhere_and_resumed_ends_as_an_uninterrupted_run(
    work: Path, soak: bool
) -> None:
    tried = {
        "examples": 0,
        "kills": 0,
        "preemptions": 0,
        "resumes": 0,
        "fresh_restarts": 0,
        "rolled_back": 0,
    }

    @_settings(SOAK_EXAMPLES if soak else EXAMPLES)  # type: ignore[untyped-decorator]
    @given(
        seed=st.integers(0, 10_000),
        workers=st.integers(1, 4),
        every=st.integers(1, 6),
        steps=st.integers(8, 30),
        patience=st.integers(2, 25),
        kills=st.lists(kill_spec, min_size=2, max_size=4),
    )
    def check(
        *,
        seed: int,
        workers: int,
        every: int,
        steps: int,
        patience: int,
        kills: list[tuple[str, float]],
    ) -> None:
        params = Params(seed, workers, every, steps, patience)
        expected, reference_log, events, duration = _reference(params, work)
        tried["examples"] += 1
        cwd = work / f"killed-{tried['examples']}"
        cwd.mkdir()
        out = cwd / "run"
        preempted = False
        for mode, where in kills:
            resume = _latest_checkpoint(out)
            args = params.demo_args() + (["--resume", str(resume)] if resume else [])
            if resume is not None:
                tried["resumes"] += 1
            elif out.exists():
                tried["fresh_restarts"] += 1  # killed before any checkpoint: start again
            if mode.startswith("timer"):
                signum = signal.SIGTERM if mode == "timer-term" else signal.SIGKILL
                timer = where * (duration + 0.2)
                code = _demo(cwd, 0, "never", args, timer=timer, signum=signum)
            else:
                code = _demo(cwd, 1 + int(where * events), mode, args)
            tried["kills"] += code == -signal.SIGKILL
            tried["preemptions"] += code == 143
            preempted |= code == 143
        resume = _latest_checkpoint(out)
        args = params.demo_args() + (["--resume", str(resume)] if resume else [])
        _demo(cwd, 0, "never", [*args, "--summary", "summary.json"])

        outcome = _outcome(cwd / "summary.json")
        # The history: the log of the run that finished (a run killed before its first
        # checkpoint leaves a log of its own, which a fresh start does not continue).
        history = max(out.glob("*.evlog"), key=lambda p: p.stat().st_mtime)
        got, rolled_back = _replayed_inputs(history)
        want, _ = _replayed_inputs(reference_log)
        if preempted:  # its checkpoint is one more: the same run, checkpoints aside
            assert _without_checkpoints(outcome) == _without_checkpoints(expected)
            assert _without_checkpoints(got) == _without_checkpoints(want)
            on_disk = {str(p.relative_to(cwd)) for p in out.glob("checkpoint_*")}
            assert _preemption_checkpoints(got, want) <= on_disk
        else:
            assert outcome == expected
            assert got == want
        tried["rolled_back"] += rolled_back
        if resume is not None:
            assert rollbacks(history) is not None

    check()
    FIGURES.add(
        "resume equivalence",
        examples=tried["examples"],
        kills=tried["kills"],
        preemptions=tried["preemptions"],
        resumes=tried["resumes"],
        fresh_restarts=tried["fresh_restarts"],
        rolled_back_events=tried["rolled_back"],
    )
    if "RESUME_EXAMPLES" not in os.environ:  # the environment may ask for a quick look
        assert tried["kills"] >= (800 if soak else 80), tried
        assert tried["preemptions"] >= (100 if soak else 10), tried
