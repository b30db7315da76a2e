"""A run's options: the bus's, plus its ranks, in one frozen struct checked once, where
the user gave them (``open_run``)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Annotated, Literal

from msgspec import Meta

from eventbus import BusOptions
from eventbus._options import MAX_SECONDS, BusKeywords
from eventbus.options import OptionError

#: Largest world size: the gathering keeps a slot per rank.
MAX_WORLD_SIZE = 1 << 17

WorldSize = Annotated[int, Meta(ge=1, le=MAX_WORLD_SIZE, description="whole number of ranks")]
Rank = Annotated[int, Meta(ge=0, lt=MAX_WORLD_SIZE, description="rank")]
#: At least 0.1 s, so the run's end is delivered behind a short backlog.
EndSeconds = Annotated[float, Meta(ge=0.1, le=MAX_SECONDS, description="number of seconds")]
#: How often a worker group may restart (``Run.workers(max_restarts=...)``).
Restarts = Annotated[int, Meta(ge=0, le=1_000_000, description="whole number of restarts")]


class RunOptions(BusOptions, frozen=True, kw_only=True):
    """How a run runs: its bus's options (``BusOptions``) and its ranks, ``world_size``,
    ``required_ranks``, ``drain_timeout``, ``preempt_grace`` and ``on_stall``, as
    ``open_run`` documents them (its keywords build one)."""

    world_size: WorldSize
    required_ranks: tuple[Rank, ...] | None = None
    drain_timeout: EndSeconds = 10.0
    preempt_grace: EndSeconds = 25.0
    on_stall: Literal["warn", "restart"] = "warn"

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.on_stall == "restart" and self.stall_periods is None:
            raise OptionError(
                "on_stall", "on_stall='restart' needs stall_periods (how long a rank may be silent)"
            )
        ranks = self.required_ranks
        if ranks is None:
            return
        if not ranks:
            raise OptionError("required_ranks", "required_ranks must name at least one rank")
        outside = sorted({rank for rank in ranks if rank >= self.world_size})
        if outside:
            raise OptionError(
                "required_ranks",
                f"required_ranks must be ranks of the run, from 0 to {self.world_size - 1} "
                f"(world_size={self.world_size}), got {list(ranks)}: {outside} outside",
            )


class RunKeywords(BusKeywords, total=False):
    """``RunOptions`` as keyword arguments (``required_ranks`` may be any iterable)."""

    world_size: int
    required_ranks: Iterable[int] | None
    preempt_grace: float
    on_stall: Literal["warn", "restart"]
