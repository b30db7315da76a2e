"""Callbacks have a readable name in every log line (item 19).

``repr`` of a ``UserCallback`` or ``StatefulCallback`` is its class name with
its ``state_key`` (``EarlyStopping(metric='loss', mode='min')``), or the class
name alone, never ``<... object at 0x...>``; the built-ins and the state store
log it.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from eventbus import StatefulCallback
from eventbus.state import StateStore
from eventbus.state._model import StateKeyConflict
from handlers import BestCheckpoints, EarlyStopping, MetricsLogger, UserCallback


class LossWatcher(UserCallback):
    pass


class Keyed(StatefulCallback):
    state_args = ("metric",)

    def __init__(self, metric: str = "acc") -> None:
        self.metric = metric

    @property
    def state_key(self) -> str:
        return self.metric


class Broken(UserCallback, StatefulCallback):
    @property
    def state_key(self) -> str:
        raise RuntimeError("no key")


def test_callbacks_are_named_by_class_and_state_key() -> None:
    assert repr(EarlyStopping("loss")) == "EarlyStopping(metric='loss', mode='min')"
    assert repr(BestCheckpoints("acc", k=2, mode="max")) == (
        "BestCheckpoints(metric='acc', mode='max', k=2)"
    )
    assert repr(LossWatcher()) == "LossWatcher"
    assert repr(MetricsLogger()) == "MetricsLogger"
    assert repr(Keyed("f1")) == "Keyed[f1]"
    assert repr(Broken()) == "Broken"  # a state_key that raises costs only the suffix


def test_a_state_key_conflict_names_both_callbacks_readably(tmp_path: Path) -> None:
    with pytest.raises(StateKeyConflict) as info:
        StateStore(tmp_path).register([Keyed("f1"), Keyed("f1")])
    assert "object at 0x" not in str(info.value)
    assert "#0 Keyed[f1] and #1 Keyed[f1]" in str(info.value)


SCRIPT = textwrap.dedent(
    """
    import anyio

    from eventbus import configure_logging
    from handlers import BestCheckpoints, EarlyStopping, open_run


    async def main() -> None:
        async with open_run(
            world_size=1,
            callbacks=[EarlyStopping("loss", patience=2), BestCheckpoints("loss", k=1)],
        ) as run:
            for _ in range(4):
                await run.reporter(0).report({"loss": 1.0})


    configure_logging()
    anyio.run(main)
    """
)


def test_the_early_stopping_line_of_a_real_run_names_the_callback(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text(SCRIPT)
    done = subprocess.run(
        [sys.executable, "train.py"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        check=False,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    (line,) = [line for line in done.stderr.splitlines() if "early stopping" in line]
    assert "callback=\"EarlyStopping(metric='loss', mode='min')\"" in line
    assert "object at 0x" not in done.stderr
