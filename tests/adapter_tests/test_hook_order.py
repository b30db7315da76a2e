"""``before_run`` returns before the trainer's first step, through the Hugging Face and
Lightning adapters, on both hosts of their bus (DESIGN.md section 16; ``open_run``'s half is
``tests/test_lifecycle_order.py``, Ray's ``test_ray_engine.py``)."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import anyio
import pytest

for _name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_HUB_DISABLE_TELEMETRY"):
    os.environ.setdefault(_name, "1")

pytest.importorskip("torch", reason="torch is not installed (pip install '.[transformers]')")
pytest.importorskip(
    "transformers", reason="transformers is not installed (pip install '.[transformers]')"
)
pytest.importorskip("lightning", reason="lightning is not installed (pip install '.[lightning]')")

import _lightning_model  # noqa: E402
import test_hf  # noqa: E402
from test_resume_identity import bus_runs  # noqa: E402, F401  # the fixture: both hosts

from adapters import lightning as pl_adapter  # noqa: E402
from adapters import transformers as hf_adapter  # noqa: E402
from eventbus import RunResult, TrainRunContext  # noqa: E402
from handlers import UserCallback  # noqa: E402

#: How long the callback's ``before_run`` takes: a tracker opening its store, say.
SETTING_UP = 0.2


class SlowStart(UserCallback):
    """Notes when its ``before_run`` returned and when ``after_run`` came."""

    def __init__(self) -> None:
        self.before_run_returned: float | None = None
        self.after_run_came: float | None = None

    async def before_run(self, run_context: TrainRunContext) -> None:
        await anyio.sleep(SETTING_UP)
        self.before_run_returned = time.monotonic()

    def after_run(self, run_context: TrainRunContext, result: RunResult) -> None:
        self.after_run_came = time.monotonic()


class FirstStep:
    """Notes when the model's first training step began."""

    at: float | None = None

    def saw(self) -> None:
        if self.at is None:
            self.at = time.monotonic()


class HFModel(test_hf.TinyModel):
    def __init__(self, first: FirstStep) -> None:
        super().__init__()
        self.first = first

    def forward(self, x: Any, y: Any) -> dict[str, Any]:
        self.first.saw()
        return super().forward(x, y)


class LightningModel(_lightning_model.Regression):
    def __init__(self, first: FirstStep) -> None:
        super().__init__()
        self.first = first

    def training_step(self, batch: Any, batch_idx: int) -> Any:
        self.first.saw()
        return super().training_step(batch, batch_idx)


@pytest.mark.usefixtures("bus_runs")
@pytest.mark.parametrize("framework", ["hf", "lightning"])
def test_before_run_returns_before_the_first_training_step(tmp_path: Path, framework: str) -> None:
    slow, first = SlowStart(), FirstStep()
    if framework == "hf":
        callback: Any = hf_adapter.EventBusCallback([slow])
        test_hf.make_trainer(tmp_path, callback, model=HFModel(first)).train()
    else:
        callback = pl_adapter.EventBusCallback([slow])
        _lightning_model.make_trainer(tmp_path, [callback]).fit(LightningModel(first))
    assert slow.before_run_returned is not None and first.at is not None
    assert slow.before_run_returned <= first.at
    assert slow.after_run_came is not None and slow.after_run_came >= first.at
