"""``open_run(engine=TorchrunEngine())`` under real ``torchrun`` processes (CPU, 2 ranks).

One deterministic job (``_torchrun_job.py``), run on the local engine in this
process and under torchrun: standalone (with messages that are not the run's
pushed into rank 0's inbox), as two "nodes" on 127.0.0.1, with a failure
on rank 1 that ``--max-restarts 1`` restarts, and without ``sync`` (rank 1's
reports batched when it fails or ends); and SIGTERM sent to torchrun
(a job of its own). Each launch is a few seconds
(torch imported by every process), so the launches are shared by module.
"""

from __future__ import annotations

import collections
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import anyio
import pytest

pytest.importorskip("torch.distributed", reason="torch is not installed")

from _torchrun_job import run_job

from eventbus import EventPlaceholder
from eventbus.log import read_log

JOB = Path(__file__).with_name("_torchrun_job.py")
TORCHRUN = Path(sys.executable).with_name("torchrun")
#: ``undecodable``: a metric named from undecodable bytes at step 2 (the log keeps that
#: report as a placeholder: the unsynced jobs, which read reports' indices, leave it out).
CONFIG = {"name": "job", "steps": 8, "stop_after": 5, "save_every": 2, "undecodable": True}
UNSYNCED = {**CONFIG, "stop_after": 100, "sync": False, "undecodable": False}
LAUNCH_TIMEOUT_S = 120


def launch(out: Path, config: dict[str, Any], *args: str) -> subprocess.Popen[str]:
    out.mkdir(parents=True, exist_ok=True)
    path = out / "config.json"
    path.write_text(json.dumps({**config, "out": str(out)}))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(JOB.parent)}
    command = [str(TORCHRUN), *args, str(JOB), str(path)]
    return subprocess.Popen(
        command, cwd=out, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )


def finish(process: subprocess.Popen[str]) -> tuple[int, str]:
    output, _ = process.communicate(timeout=LAUNCH_TIMEOUT_S)
    return process.returncode, output


def summary(out: Path, attempt: int = 0) -> dict[str, Any]:
    result: dict[str, Any] = json.loads((out / f"summary-{attempt}.json").read_text())
    return result


def logged(out: Path) -> dict[str, int]:
    """Events of the log by type: a placeholder by the type it stands for (a report
    holding a lone surrogate, which no log can, is one)."""
    events = read_log(out / "events.jsonl").events
    names = (e.event_type if isinstance(e, EventPlaceholder) else type(e).__name__ for e in events)
    return dict(collections.Counter(names))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@pytest.fixture(scope="module")
def jobs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The job on the local engine, standalone under torchrun, on two "nodes", and
    restarted after a failure: the torchrun launches run side by side."""
    root = tmp_path_factory.mktemp("torchrun")
    port = free_port()
    two_nodes = [
        "--nnodes",
        "2",
        "--nproc-per-node",
        "1",
        "--rdzv-backend",
        "c10d",
        "--rdzv-endpoint",
        f"127.0.0.1:{port}",
        "--rdzv-id",
        "two-nodes",
    ]
    runs = {
        "standalone": [
            launch(
                root / "standalone",
                {**CONFIG, "hostile": True},
                "--standalone",
                "--nproc-per-node",
                "2",
            )
        ],
        # On trio (the others on asyncio): the engine runs on either of anyio's backends.
        "nodes": [
            launch(root / "nodes", {**CONFIG, "backend": "trio"}, *two_nodes, "--node-rank", str(r))
            for r in (0, 1)
        ],
        "restart": [
            launch(
                root / "restart",
                {**CONFIG, "stop_after": 100, "fail": [1, 5, 0]},
                "--standalone",
                "--nproc-per-node",
                "2",
                "--max-restarts",
                "1",
            )
        ],
        # No sync: rank 1's reports wait in its sender, batched, when it fails or ends.
        "unsynced_fails": [
            launch(
                root / "unsynced_fails",
                {**UNSYNCED, "fail": [1, 6, 0]},
                "--standalone",
                "--nproc-per-node",
                "2",
            )
        ],
        "unsynced": [
            launch(
                root / "unsynced",
                UNSYNCED,
                "--standalone",
                "--nproc-per-node",
                "2",
            )
        ],
        "rank0_fails": [
            launch(
                root / "rank0_fails",
                {**CONFIG, "stop_after": 100, "fail": [0, 5, 0]},
                "--standalone",
                "--nproc-per-node",
                "2",
                "--max-restarts",
                "1",
            )
        ],
    }
    local = {}
    for name, config in (("local", CONFIG), ("uninterrupted", {**CONFIG, "stop_after": 100})):
        out = root / name
        out.mkdir()
        local[name] = anyio.run(run_job, {**config, "out": str(out)})
    ended = {name: [finish(p) for p in processes] for name, processes in runs.items()}
    return {"root": root, "ended": ended, **local}


@pytest.mark.parametrize("name", ["standalone", "nodes"])
def test_rounds_stop_and_states_as_on_the_local_engine(jobs: dict[str, Any], name: str) -> None:
    out = jobs["root"] / name
    assert [code for code, _ in jobs["ended"][name]] == [0] * len(jobs["ended"][name])
    got = summary(out)
    assert got == jobs["local"]
    assert [[m["rank"] for m in metrics] for metrics in got["rounds"]] == [[0, 1]] * 5
    assert got["status"] == "finished" and got["stopped"]


@pytest.mark.parametrize("name", ["standalone", "nodes"])
def test_every_rank_sees_the_stop_at_the_same_step(jobs: dict[str, Any], name: str) -> None:
    out = jobs["root"] / name
    seen = [json.loads((out / f"stop-{rank}.json").read_text()) for rank in (0, 1)]
    assert seen == [4, 4]  # the 5th round's step, where StopAfter(5) stopped the run


def test_the_run_starts_and_ends_once_in_rank_0_only(jobs: dict[str, Any]) -> None:
    out = jobs["root"] / "standalone"
    got = summary(out)
    assert (got["before"], got["after"]) == (1, 1)
    counts = logged(out)
    assert counts["RunStarted"] == counts["RunFinished"] == 1
    assert counts["Report"] == 10
    assert sorted(p.name for p in out.glob("summary-*")) == ["summary-0.json"]


def test_messages_not_the_runs_are_rejected_and_said(jobs: dict[str, Any]) -> None:
    (_, output), *_ = jobs["ended"]["standalone"]
    said = [line for line in output.splitlines() if "rejected a message" in line]
    assert len(said) == 3
    assert "a malformed message" in said[0]
    assert "a message of another run ('another-run'" in said[2]
    assert "6 messages that were not this run's were rejected in all" in output
    assert "Traceback" not in output


def test_a_failure_on_rank_1_reaches_after_exception_and_a_restart_resumes(
    jobs: dict[str, Any],
) -> None:
    out = jobs["root"] / "restart"
    [(code, output)] = jobs["ended"]["restart"]
    assert code == 0, output[-3000:]
    failed, resumed = summary(out, 0), summary(out, 1)
    assert failed["status"] == "failed"
    assert failed["exceptions"] == [{"1": ["WorkerError", "RuntimeError: rank 1 broke at step 5"]}]
    assert (failed["before"], failed["after"]) == (1, 1)
    # Restored from the checkpoint of step 3 (rounds 0-3), then steps 4 to 7.
    assert [m[0]["step"] for m in resumed["rounds"]] == [4, 5, 6, 7]
    assert resumed["rounds"][0][1]["seen"] == 4  # the restored callback's value, on rank 1
    uninterrupted = jobs["uninterrupted"]
    assert resumed["state"] == uninterrupted["state"]
    assert resumed["rounds"] == uninterrupted["rounds"][4:]
    counts = logged(out)  # one log, one history, continued
    assert (counts["RunStarted"], counts["RunResumed"]) == (2, 1)
    assert counts["WorkerFailure"] == 1 and counts["RunFinished"] == 2


def test_sigterm_to_torchrun_preempts_the_run_in_order(tmp_path: Path) -> None:
    """torchrun's agent passes SIGTERM on to every worker: rank 0's run has them
    checkpoint at their next step and stop at the one after, then ends ``preempted``."""
    out = tmp_path / "sigterm"
    config = {**CONFIG, "steps": 10**6, "stop_after": 10**6, "save_every": 10**6, "step_s": 0.02}
    process = launch(out, config, "--standalone", "--nproc-per-node", "2")
    log = out / "events.jsonl"
    deadline = time.monotonic() + LAUNCH_TIMEOUT_S
    while not (log.exists() and log.read_text().count('"RoundGathered"') >= 10):
        assert process.poll() is None and time.monotonic() < deadline, "no rounds came"
        time.sleep(0.2)
    process.send_signal(signal.SIGTERM)
    code, output = finish(process)
    assert code == 1  # torchrun's own on a signal (its agent raises SignalException)
    got = summary(out)
    assert got["status"] == "preempted"
    assert (got["before"], got["after"]) == (1, 1)
    seen = [json.loads((out / f"stop-{rank}.json").read_text()) for rank in (0, 1)]
    assert seen[0] == seen[1] == got["rounds"][-1][0]["step"]  # every rank, the same step
    checkpoints = sorted(p.name for p in (out / "run").glob("checkpoint_*"))
    assert checkpoints == [f"checkpoint_{seen[0]:06d}"]  # saved at the stop's step, as told
    counts = logged(out)  # the log whole: read to its end
    assert counts["RunStarted"] == counts["RunFinished"] == counts["AfterRun"] == 1
    assert "preempted in" in output
    # The one traceback is torchrun's agent's own, for the signal it got.
    assert output.count("Traceback") == 1 and "SignalException" in output


def test_a_failure_on_rank_0_itself_reaches_after_exception_as_raised(
    jobs: dict[str, Any],
) -> None:
    """Rank 0's worker reports in the run's own process: its exception is the one it
    raised (no text copy), and the restart resumes as after any rank's failure."""
    out = jobs["root"] / "rank0_fails"
    [(code, output)] = jobs["ended"]["rank0_fails"]
    assert code == 0, output[-3000:]
    failed, resumed = summary(out, 0), summary(out, 1)
    assert failed["status"] == "failed"
    assert failed["exceptions"] == [{"0": ["RuntimeError", "rank 0 broke at step 5"]}]
    assert [m[0]["step"] for m in resumed["rounds"]] == [4, 5, 6, 7]
    assert resumed["state"] == jobs["uninterrupted"]["state"]


def test_reports_made_just_before_a_failure_or_the_end_arrive_in_order(
    jobs: dict[str, Any],
) -> None:
    """Without ``sync``, a rank's reports go to rank 0 in batches: those still waiting
    when its worker fails or returns are sent first, in order, then its end."""
    out = jobs["root"] / "unsynced_fails"
    [(code, output)] = jobs["ended"]["unsynced_fails"]
    assert code != 0, output[-3000:]
    events = read_log(out / "events.jsonl").events
    from_rank_1 = [
        (type(e).__name__, getattr(e, "index", None))
        for e in events
        if type(e).__name__ in ("Report", "WorkerFailure") and e.rank == 1  # type: ignore[attr-defined]
    ]
    assert from_rank_1 == [("Report", i) for i in range(6)] + [("WorkerFailure", None)]
    failed = summary(out)
    assert failed["status"] == "failed"
    assert failed["exceptions"] == [{"1": ["WorkerError", "RuntimeError: rank 1 broke at step 6"]}]
    assert [[m["rank"] for m in metrics] for metrics in failed["rounds"]] == [[0, 1]] * len(
        failed["rounds"]
    )
    ended = summary(jobs["root"] / "unsynced")
    assert [code for code, _ in jobs["ended"]["unsynced"]] == [0]
    assert ended["status"] == "finished"
    steps = [[(m["rank"], m["step"]) for m in metrics] for metrics in ended["rounds"]]
    assert steps == [[(0, step), (1, step)] for step in range(8)]  # every step, in order
