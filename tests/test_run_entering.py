"""Making a run or an attachment does nothing but check arguments; entering does the
rest, once: snapshot read, callbacks restored, subscriptions made, log created."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anyio
import pytest

from eventbus import EventBus, VirtualClock
from eventbus.state import StateRestoreError
from eventbus.state._files import STATE_FILENAME
from eventbus.state._model import StateFormatError
from handlers import EarlyStopping, Reporter, UserCallback, open_run
from handlers._attach import CallbackAttachment

pytestmark = pytest.mark.anyio


class Counter(UserCallback):
    def __init__(self) -> None:
        self.rounds = 0

    def after_report(self, run_context: Any, metrics: Any, checkpoint: Any) -> None:
        self.rounds += 1


async def _checkpointing(reporter: Reporter, out: Path) -> None:
    for step in range(2):
        folder = out / f"ck{step}"
        folder.mkdir(parents=True, exist_ok=True)
        await reporter.report({"loss": 1.0 / (step + 1)}, checkpoint=folder)


async def test_making_a_resumed_run_reads_and_subscribes_nothing(tmp_path: Path) -> None:
    out = tmp_path / "run"
    async with open_run(world_size=1, callbacks=[EarlyStopping("loss")], state_dir=out) as run:
        await run.workers(lambda r: _checkpointing(r, out))
    saved = json.loads((out / "ck1" / STATE_FILENAME).read_text())
    saved["run"]["world_size"] = 0  # a position no run can resume from
    (out / "ck1" / STATE_FILENAME).write_text(json.dumps(saved))
    early = EarlyStopping("loss", patience=99)
    log = tmp_path / "resumed.evlog"
    run = open_run(world_size=1, callbacks=[early], state_dir=out, resume_from=out / "ck1", log=log)
    assert run.resume is None and run.restored is None and run.bus.subscriptions == ()
    assert not log.exists()
    with pytest.raises(StateFormatError, match="world_size"):
        async with run:
            pytest.fail("the body must not run")
    assert early.patience == 99 and not log.exists()  # refused before anything changed


async def test_a_restore_error_is_raised_as_itself_on_entering(tmp_path: Path) -> None:
    (tmp_path / "old").mkdir()  # a checkpoint without saved states
    run = open_run(
        world_size=1, callbacks=[Counter()], state_dir=tmp_path, resume_from=tmp_path / "old"
    )
    with pytest.raises(StateRestoreError, match="allow_fresh_state"):
        async with run:
            pass
    assert run.status is None and run.attachment is None


async def test_an_attachment_subscribes_when_attached_and_once() -> None:
    async with EventBus(clock=VirtualClock(), period=1000) as bus:
        attachment = CallbackAttachment([Counter()], world_size=1)
        assert bus.subscriptions == () and attachment.subscriptions == []
        assert attachment.attach(bus) is attachment
        assert set(attachment.subscriptions) <= set(bus.subscriptions)
        with pytest.raises(RuntimeError, match="attached already"):
            attachment.attach(bus)


async def test_a_run_is_entered_once() -> None:
    run = open_run(world_size=1, clock=VirtualClock())
    with pytest.raises(RuntimeError, match="inside `async with open_run"):
        run.reporter(0)
    async with run:
        with pytest.raises(RuntimeError, match="already been entered"):
            async with run:
                pass
    with pytest.raises(RuntimeError, match="entered only once"):
        async with run:
            pass
    assert run.result is not None and run.result.status == "finished"


async def test_a_bus_is_started_once() -> None:
    bus = EventBus(clock=VirtualClock(), period=1000)
    async with bus:
        with pytest.raises(RuntimeError, match="already been entered"):
            async with bus:
                pass
    with pytest.raises(RuntimeError, match="started only once"):
        async with bus:
            pass


async def test_a_body_s_exception_leaves_run_and_bus_unwrapped() -> None:
    with pytest.raises(KeyError, match="body"):
        async with EventBus(clock=VirtualClock(), period=1000):
            raise KeyError("body")
    with pytest.raises(KeyError, match="body"):
        async with open_run(world_size=1, clock=VirtualClock()):
            raise KeyError("body")
    with anyio.CancelScope() as scope:
        async with open_run(world_size=1, clock=VirtualClock()) as run:
            scope.cancel()
            await anyio.sleep(1)
    assert scope.cancelled_caught and run.status == "cancelled"
