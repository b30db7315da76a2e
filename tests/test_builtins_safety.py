"""``BestCheckpoints(delete_worse=True)`` deletes only inside the run's storage root (item 7).

A checkpoint location comes from a worker's report or from a snapshot file
anyone who can write the checkpoint can edit: neither may make the callback
delete a directory outside the run's storage (``run_context.storage``), the
root itself, or follow a symlink out of it. A snapshot cannot switch
``delete_worse`` on either: the value given now wins over the saved one. Each
deletion is one info line naming the checkpoint and why.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from structlog.testing import capture_logs

from eventbus import StatefulCallback, TrainRunContext
from eventbus.state import StateStore
from handlers import BestCheckpoints, Reporter, open_run


def context(storage: Path | str | None) -> TrainRunContext:
    return TrainRunContext(
        run_id="r", name="t", world_size=1, storage=None if storage is None else str(storage)
    )


def checkpoint(folder: Path) -> str:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "weights").write_text("w")
    return str(folder)


@pytest.fixture
def root(tmp_path: Path) -> Path:
    """The run's storage root; ``tmp_path / "outside"`` is a directory outside it."""
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "precious").write_text("keep me")
    storage = tmp_path / "storage"
    storage.mkdir()
    return storage


def outside(root: Path) -> Path:
    return root.parent / "outside"


def test_a_reported_checkpoint_outside_the_storage_root_is_never_deleted(root: Path) -> None:
    best = BestCheckpoints("loss", k=1, delete_worse=True)
    ctx = context(root)
    with capture_logs() as logs:
        best.after_report(ctx, [{"loss": 1.0}], str(outside(root)))
        best.after_report(ctx, [{"loss": 0.5}], checkpoint(root / "ck1"))
        best.after_report(ctx, [{"loss": 0.1}], checkpoint(root / "ck2"))
    assert (outside(root) / "precious").read_text() == "keep me"
    assert best.deleted == [str(root / "ck1")]
    refused = [entry for entry in logs if entry["log_level"] == "warning"]
    assert len(refused) == 1 and refused[0]["checkpoint"] == str(outside(root))
    assert "outside" in refused[0]["event"] and refused[0]["storage"] == str(root)


def test_a_relative_location_climbing_out_of_the_root_is_outside(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(root)
    (root / "ck").mkdir()  # so that the path exists through it
    best = BestCheckpoints("loss", k=1, delete_worse=True)
    ctx = context(root)
    for loss, location in enumerate(["ck/../../outside", "..", "."]):
        best.after_report(ctx, [{"loss": 10.0 - loss}], location)
    best.after_report(ctx, [{"loss": 0.0}], checkpoint(root / "last"))
    assert best.deleted == []
    assert (outside(root) / "precious").exists() and root.is_dir()


def test_the_storage_root_itself_is_never_deleted(root: Path) -> None:
    best = BestCheckpoints("loss", k=1, delete_worse=True)
    ctx = context(root)
    best.after_report(ctx, [{"loss": 1.0}], str(root))
    best.after_report(ctx, [{"loss": 0.5}], checkpoint(root / "ck1"))
    best.after_report(ctx, [{"loss": 0.1}], checkpoint(root / "ck2"))
    assert root.is_dir() and (root / "ck2").is_dir() and best.deleted == [str(root / "ck1")]


def test_a_symlink_inside_the_root_is_unlinked_never_followed(root: Path) -> None:
    link = root / "ck-link"
    link.symlink_to(outside(root), target_is_directory=True)
    best = BestCheckpoints("loss", k=1, delete_worse=True)
    ctx = context(root)
    best.after_report(ctx, [{"loss": 1.0}], str(link))
    best.after_report(ctx, [{"loss": 0.5}], checkpoint(root / "ck1"))
    best.after_report(ctx, [{"loss": 0.1}], checkpoint(root / "ck2"))
    assert not link.is_symlink() and best.deleted == [str(link), str(root / "ck1")]
    assert (outside(root) / "precious").read_text() == "keep me"


def test_a_path_through_a_symlinked_parent_leading_out_is_outside(root: Path) -> None:
    (root / "escape").symlink_to(outside(root), target_is_directory=True)
    (outside(root) / "ck0").mkdir()
    best = BestCheckpoints("loss", k=1, delete_worse=True)
    ctx = context(root)
    best.after_report(ctx, [{"loss": 1.0}], str(root / "escape" / "ck0"))
    best.after_report(ctx, [{"loss": 0.5}], checkpoint(root / "ck1"))
    best.after_report(ctx, [{"loss": 0.1}], checkpoint(root / "ck2"))
    assert (outside(root) / "ck0").is_dir() and best.deleted == [str(root / "ck1")]


def test_without_a_storage_root_nothing_is_deleted_and_one_warning_says_why(
    tmp_path: Path,
) -> None:
    best = BestCheckpoints("loss", k=1, delete_worse=True)
    with capture_logs() as logs:
        for i in range(4):
            best.after_report(
                context(None), [{"loss": 1.0 - i / 10}], checkpoint(tmp_path / f"{i}")
            )
    assert best.deleted == [] and len(list(tmp_path.iterdir())) == 4
    (warning,) = logs
    assert warning["log_level"] == "warning"
    assert "storage" in warning["event"] and "storage=" in warning["hint"]
    assert warning["callback"] == "BestCheckpoints(metric='loss', mode='min', k=1)"


def test_each_deletion_is_one_info_line_naming_the_checkpoint_and_why(root: Path) -> None:
    best = BestCheckpoints("loss", k=2, delete_worse=True)
    ctx = context(root)
    with capture_logs() as logs:
        for i, loss in enumerate([0.9, 0.8, 0.7, 0.6]):
            best.after_report(ctx, [{"loss": loss}], checkpoint(root / f"ck{i}"))
    assert [entry["checkpoint"] for entry in logs] == [str(root / "ck0"), str(root / "ck1")]
    for entry in logs:
        assert entry["log_level"] == "info" and entry["event"] == "deleted a checkpoint"
        assert entry["callback"] == "BestCheckpoints(metric='loss', mode='min', k=2)"
        assert entry["reason"] == "it left the top 2 by loss (min)"


# --- a snapshot cannot switch deletion on ----------------------------------------------------


def test_live_args_win_over_the_saved_ones_when_a_class_declares_them(tmp_path: Path) -> None:
    class Pruner(StatefulCallback):
        state_args = ("k", "prune")
        state_live_args = ("prune",)

        def __init__(self, k: int = 1, prune: bool = False) -> None:
            self.k, self.prune = k, prune

    (tmp_path / "ck").mkdir()
    store = StateStore(tmp_path)
    store.register([Pruner(k=2, prune=False)])
    store.snapshot(str(tmp_path / "ck"))
    state_file = tmp_path / "ck" / "callback_state.json"
    snapshot = json.loads(state_file.read_text())
    (state,) = snapshot["states"].values()
    state["args"]["prune"] = True
    state_file.write_text(json.dumps(snapshot))

    live = Pruner(k=5, prune=False)
    _, report = StateStore(tmp_path).restore([live], str(tmp_path / "ck"), in_place=True)
    assert (live.k, live.prune) == (2, False)  # the saved k, the live prune
    (warning,) = report.warnings
    assert "prune=False given now, not the saved prune=True" in warning


@pytest.fixture
def here(tmp_path: Path) -> Iterator[Path]:
    previous = Path.cwd()
    os.chdir(tmp_path)
    try:
        yield tmp_path
    finally:
        os.chdir(previous)


async def train(reporter: Reporter) -> None:
    step = 0
    if reporter.latest_checkpoint is not None:
        saved = await anyio.Path(reporter.latest_checkpoint, "step.json").read_text()
        step = json.loads(saved)["step"]
    while step < 12:
        step += 1
        location = None
        if step % 4 == 0:
            folder = anyio.Path("runs/a", f"checkpoint_{step:06d}")
            await folder.mkdir(parents=True, exist_ok=True)
            await (folder / "step.json").write_text(json.dumps({"step": step}))
            location = str(folder)
        await reporter.report({"loss": 1 / step}, location)


async def run(best: BestCheckpoints, resume_from: str | None = None) -> Any:
    async with open_run(
        world_size=1,
        callbacks=[best],
        state_dir="runs/a",
        storage=str(await anyio.Path("runs/a").resolve()),
        resume_from=resume_from,
    ) as opened:
        await opened.workers(train)
    return opened


def on_disk() -> list[str]:
    return sorted(p.name for p in Path("runs/a").iterdir() if p.name.startswith("checkpoint_"))


def edit_snapshot(location: str, victim: Path) -> None:
    """What an attacker with write access to a checkpoint does: switch deletion on and
    point a (bad) top entry at a directory outside the run's storage."""
    state_file = Path(location, "callback_state.json")
    snapshot = json.loads(state_file.read_text())
    (key,) = [k for k in snapshot["states"] if "BestCheckpoints" in k]
    state = snapshot["states"][key]
    state["args"]["delete_worse"] = True
    state["attributes"]["top"] = [[1e9, str(victim)]]
    state_file.write_text(json.dumps(snapshot))


@pytest.mark.anyio
async def test_an_edited_snapshot_cannot_switch_deletion_on_through_open_run(here: Path) -> None:
    await run(BestCheckpoints("loss", k=1))
    victim = here / "victim"
    victim.mkdir()
    (victim / "precious").write_text("keep me")
    edit_snapshot("runs/a/checkpoint_000008", victim)

    best = BestCheckpoints("loss", k=1, delete_worse=False)
    resumed = await run(best, resume_from="runs/a/checkpoint_000008")
    assert best.delete_worse is False and best.deleted == []
    assert (victim / "precious").read_text() == "keep me"
    assert on_disk() == ["checkpoint_000004", "checkpoint_000008", "checkpoint_000012"]
    assert any("delete_worse=False given now" in w for w in resumed.restored.warnings)


@pytest.mark.anyio
async def test_an_edited_snapshot_never_deletes_outside_the_root_even_with_deletion_on(
    here: Path,
) -> None:
    await run(BestCheckpoints("loss", k=1))
    victim = here / "victim"
    victim.mkdir()
    (victim / "precious").write_text("keep me")
    edit_snapshot("runs/a/checkpoint_000008", victim)

    best = BestCheckpoints("loss", k=1, delete_worse=True)
    await run(best, resume_from="runs/a/checkpoint_000008")
    assert (victim / "precious").read_text() == "keep me"
    # Inside the root it does prune: the resumed-from checkpoint left the top once 12 came.
    assert best.deleted == ["runs/a/checkpoint_000008"]
    assert best.checkpoints == ["runs/a/checkpoint_000012"]
