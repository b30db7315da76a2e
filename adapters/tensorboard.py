"""``TensorBoardLogger``: a run's rounds and its callbacks' cost, as TensorBoard scalars
(docs/operations/trackers.md). A resumed run's event file starts with TensorBoard's purge
marker, so each redone step shows once."""

from __future__ import annotations

import os
import re
import time
from pathlib import Path
from typing import Any

from eventbus import RunResult, TrainRunContext
from eventbus._options import Seconds
from eventbus.options import checked

from ._tracker import TrackerCallback, flat_config, safe_text

__all__ = ["TensorBoardLogger", "summary_writer_class"]

#: The longest value the config's table shows, in characters.
_CELL_LIMIT = 1000
#: What UTF-8 cannot hold: a surrogate code point alone.
_SURROGATE = re.compile("[\ud800-\udfff]")


def _begin_after_the_newest_file(log_dir: str) -> None:
    """Wait (at most 1 s, once per resume) for a second later than the newest event file's:
    TensorBoard reads files in name order, so a resume begun in the same second could be
    read before the attempt it redoes."""
    begun = []
    for path in Path(log_dir).glob("events.out.tfevents.*"):
        second = path.name.split(".")[3]
        if second.isdigit():
            begun.append(int(second))
    if begun:
        time.sleep(min(1.0, max(0.0, max(begun) + 1 - time.time())))


def _cell(value: object) -> str:
    """``value`` as a cell of a Markdown table (TensorBoard's Text tab renders Markdown)."""
    text = safe_text(str(value))
    text = text if len(text) <= _CELL_LIMIT else f"{text[: _CELL_LIMIT - 1]}…"
    return text.replace("|", "\\|").replace("\n", " ")


def summary_writer_class() -> tuple[Any, Any]:
    """``torch.utils.tensorboard.SummaryWriter`` if torch (and tensorboard) are
    installed, else ``tensorboardX.SummaryWriter``, each with the ``Summary`` message
    its file writer takes; ``ImportError`` naming the extra."""
    try:
        from tensorboard.compat.proto.summary_pb2 import Summary
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        try:
            from tensorboardX import SummaryWriter
            from tensorboardX.proto.summary_pb2 import Summary
        except ImportError:
            raise ImportError(
                "adapters.tensorboard needs a TensorBoard writer: "
                "pip install 'train-eventbus[tensorboard]'"
            ) from None
    return SummaryWriter, Summary


class TensorBoardLogger(TrackerCallback, state_name="adapters.TensorBoardLogger"):
    """Writes the run to TensorBoard under ``log_dir``.

    Args:
        log_dir: the run's TensorBoard directory; a resumed run writes here again.
        step_metric: a metric whose value is the step (``"step"``); by default the
            round's index.
        per_rank: also write each rank's value.
        costs: write the callbacks' cost each health-check period.
        flush_secs: how often the writer flushes on its own, seconds (also at every
            checkpoint and at the end).
    """

    tracker = "TensorBoard"
    name_rule = "TensorBoard takes UTF-8 text, so a lone surrogate becomes '_'"
    state_args = ("log_dir", "step_metric", "per_rank", "costs")

    def __init__(
        self,
        log_dir: str | os.PathLike[str],
        *,
        step_metric: str | None = None,
        per_rank: bool = True,
        costs: bool = True,
        flush_secs: float = 10.0,
    ) -> None:
        super().__init__(step_metric=step_metric, per_rank=per_rank, costs=costs)
        self.log_dir = os.fspath(log_dir)
        self.flush_secs: float = checked("flush_secs", flush_secs, Seconds)
        self._writer_class, self._summary_class = summary_writer_class()

    @property
    def state_key(self) -> str:
        return f"TensorBoardLogger({self.log_dir!r})"

    def _open(self, run_context: TrainRunContext, resumed_after: int | None) -> None:
        purge_step = None if resumed_after is None else resumed_after + 1
        if purge_step is not None:
            _begin_after_the_newest_file(self.log_dir)
        self._summary: Any = self._writer_class(
            self.log_dir, purge_step=purge_step, flush_secs=self.flush_secs
        )
        if purge_step is not None:
            text = f"run {run_context.run_id} resumed: steps from {purge_step} on are redone"
            self._summary.add_text("resumes", text, purge_step)
        elif run_context.config:  # a resumed run's is there already, at step 0
            config = flat_config(run_context.config).items()
            rows = ["| key | value |", "| --- | --- |"]
            rows += [f"| {_cell(key)} | {_cell(value)} |" for key, value in config]
            self._summary.add_text("config", "\n".join(rows), 0)

    @staticmethod
    def _backend_rule(name: str) -> str:
        return _SURROGATE.sub("_", name)

    def _scalars(self, scalars: dict[str, float], step: int, wall_time: float) -> None:
        # What ``add_scalar`` writes, for all of them at once (both writers' file writer).
        value = self._summary_class.Value
        summary = self._summary_class(
            value=[value(tag=tag, simple_value=number) for tag, number in scalars.items()]
        )
        self._summary._get_file_writer().add_summary(summary, step, wall_time)

    def _text(self, tag: str, text: str, step: int, wall_time: float) -> None:
        self._summary.add_text(tag, safe_text(text), step, walltime=wall_time)

    def _checkpoint(self, checkpoint: str, round_: int, step: int, wall_time: float) -> None:
        self._text("checkpoints", f"round {round_}: {checkpoint}", step, wall_time)

    def _flush(self) -> None:
        self._summary.flush()

    def _end(self, result: RunResult) -> None:
        status = result.status + (f" (stopped by {result.stopped_by})" if result.stopped_by else "")
        self._summary.add_text("status", safe_text(status), self._step_now())
        self._summary.close()
