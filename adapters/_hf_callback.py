"""The Hugging Face ``TrainerCallback``: the part that imports ``transformers``, on first use."""

from __future__ import annotations

import contextlib
import dataclasses
import os
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, Unpack

import msgspec

try:
    from transformers import TrainerCallback
    from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR, get_last_checkpoint
except ImportError as _exc:  # pragma: no cover - depends on the environment
    raise ImportError(
        "adapters.transformers needs Hugging Face transformers: "
        "pip install 'train-eventbus[transformers]'"
    ) from _exc

from eventbus import EventBus, Report, StateRestored, StateSnapshotted
from eventbus._logging import get_logger
from eventbus._stages import Stage
from eventbus.state import StateStore
from eventbus.state._model import Snapshot, is_stateful
from handlers._attach import CallbackAttachment
from handlers._core import RunCore
from handlers._user import training_callbacks

from ._hf_state import TRAINER_STATE_NAME, merge_stateful_callbacks, read_hf_trainer_state
from ._options import AdapterKeywords, AdapterOptions
from ._threaded_run import ThreadedAdapter, ThreadedRun, log_path
from ._tracker import STEP_METRIC

__all__ = ["EventBusCallback", "run_with_failures"]

_log = get_logger("adapters.transformers")
#: A key only HF's end-of-training log has (``speed_metrics("train", ...)``).
_SUMMARY_KEY = "train_runtime"


class EventBusCallback(ThreadedAdapter, TrainerCallback):  # type: ignore[misc]  # untyped to mypy
    """Runs ``callbacks`` (``handlers.UserCallback``s) on a bus fed by the Trainer's hooks.

    ``state_root``: where callback states are kept (default: the Trainer's ``output_dir``;
    saved checkpoints must lie inside it); ``state=False`` turns the store off. ``log``:
    record the run's events to that path, or with ``True`` to
    ``<output_dir>/eventbus-<run_id>.msgpack``. ``options`` (``adapters.AdapterOptions``)
    or its keywords configure the bus and its hand-off.

    A resume restores the callbacks in place, as ``open_run`` does; one that cannot take
    its state is replaced by a rebuilt instance, with a warning (read ``callbacks``).
    """

    def __init__(
        self,
        callbacks: Iterable[Any] = (),
        *,
        name: str | None = None,
        run_id: str | None = None,
        state: bool = True,
        state_root: str | os.PathLike[str] | None = None,
        strict_state: bool = False,
        log: bool | str | os.PathLike[str] = False,
        options: AdapterOptions | None = None,
        **keywords: Unpack[AdapterKeywords],
    ) -> None:
        self._callbacks = training_callbacks(callbacks)
        self.name = name
        self.requested_run_id = run_id
        self.state_enabled = state
        self.state_root = state_root
        self.strict_state = strict_state
        self.log = log
        self._run = ThreadedRun("eventbus-hf", AdapterOptions.build(options, **keywords))
        #: Checkpoint the next ``train()`` resumes from, when it cannot be inferred.
        self.resume_from: str | None = None

        self.restored: StateRestored | None = None
        self.log_path: Path | None = None
        self._store: StateStore | None = None
        self._rank = 0
        self._world_size = 1
        self._index = 0
        #: This step's reports, held back in ``on_log`` because a save follows.
        self._held: list[tuple[int, dict[str, Any]]] = []
        #: HF's end-of-training figures (its last ``on_log``), for ``RunFinished.summary``.
        self._summary: dict[str, Any] = {}
        self._watch_stops(self._callbacks)
        self._make_report: Callable[[int, dict[str, Any]], Report] = _ReportMaker("", 0, 1)

    # --- what users read -------------------------------------------------------------

    @property
    def callbacks(self) -> list[Any]:
        """Our callbacks, as the bus calls them (restored ones after a resume)."""
        return self._callbacks

    # --- Trainer hooks (the training thread) ---------------------------------------------

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self._run.running:
            self._close("failed", "train() ended without on_train_end (an exception?)")
        self._rank = int(args.process_index)
        self._world_size = int(args.world_size)
        self._index = 0
        self._held = []
        self._summary = {}
        root = Path(self.state_root if self.state_root is not None else args.output_dir)
        self._store = StateStore(root, strict=self.strict_state) if self.state_enabled else None
        checkpoint = self._resume_checkpoint(args, state)
        # Only the process that saves continues the run its snapshot names.
        writes = bool(args.should_save)
        resume = self._resume_of(self._store if writes else None, checkpoint)
        self.restored = (
            self._restore_from(self._store, checkpoint, self._saved_states)
            if checkpoint is not None
            else None
        )
        if self._store is not None:
            self._store.register(self._callbacks)
        self._watch_stops(self._callbacks)
        core = RunCore(
            self._callbacks,
            name=self._run_name(args),
            # Each process runs its own bus and sees only its own rank's logs.
            world_size=self._world_size,
            required_ranks=[self._rank],
            run_id=self.requested_run_id,
            config={
                "output_dir": str(args.output_dir),
                "max_steps": int(state.max_steps),
                "rank": self._rank,
                "resumed_from": checkpoint,
                "global_step": int(state.global_step),
                # The trackers' x-axis: HF's global step, which each report carries.
                STEP_METRIC: "step",
                **_training_args(args),
            },
            storage=str(root),
            store=self._store if writes else None,
        )
        core.resumed(resume, restored=self.restored)
        self._index = core.first_index(self._rank)
        self.log_path = log_path(self.log, args.output_dir, core.run_id)
        self._make_report = _ReportMaker(core.run_id, self._rank, self._world_size)
        setup = self._merge_states_into_trainer_state if core.store is not None else None
        self._start_run(core, setup, log=self.log_path, name=f"eventbus-hf-rank{self._rank}")

    def on_log(
        self,
        args: Any,
        state: Any,
        control: Any,
        logs: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        """The hot hook: a copy of ``logs`` into a ``Report``, appended to the hand-off.

        A log followed by a save in the same step is held until ``on_save``, so the saved
        checkpoint is its round's. With a callback that can stop the run, the hook waits
        for it, so a stop it decides ends training at this step (not for a log without
        any metric such callbacks name in ``stops_on``).
        """
        run = self._run
        thread = run.thread
        if logs is None or thread is None or not thread.running:
            run.check()
        else:
            metrics = dict(logs)  # HF's PrinterCallback pops from the shared dict
            if "step" not in metrics:
                metrics["step"] = state.global_step
            if _SUMMARY_KEY in metrics:
                self._summary = metrics
                return
            index = self._index
            self._index = index + 1
            if control.should_save:
                self._held.append((index, metrics))
                return
            deferred = (self._make_report, index, metrics)
            decides = self._may_stop_on(metrics)
            if thread.offer(deferred):
                if not decides:
                    thread.poll(handed_off=True)
            else:
                run.handoff(deferred)  # also raises a callback's failure of the run
            if decides:  # the stop this report decides is this step's
                run.wait_for_stoppers()
        if self._stop or (self._stoppers and self.stop_requested):
            control.should_training_stop = True

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self._held:  # a save was due and never came (it raised?): the reports go alone
            self._release(None)
        if self._signalled is not None and args.save_strategy != "no":
            control.should_save = True  # the preemption checkpoint, at this step
        self._check(control)

    def on_evaluate(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._check(control)

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """The round of this step's last report names the checkpoint HF just wrote (a step
        without a log gets a round of ``{"step": N}``); the store snapshots into it."""
        if not self._run.running:
            return
        checkpoint = Path(args.output_dir, f"{PREFIX_CHECKPOINT_DIR}-{state.global_step}")
        location = str(checkpoint.resolve())
        if not self._held:  # a save at a step that did not log: its round has the step alone
            metrics = {"step": state.global_step}
            self._held.append((self._index, metrics))
            self._index += 1
        self._release(location)
        self._check(control, handed_off=True)

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._end_training(self._summary)

    # --- failures -----------------------------------------------------------------------

    def fail(self, exc: BaseException) -> None:
        """End the current run because ``exc`` escaped ``train()``: failed, or cancelled
        for an interrupt."""
        self._fail(exc, self._rank)

    @contextlib.contextmanager
    def failures(self) -> Iterator[None]:
        """``with callback.failures(): trainer.train()``: an escaping exception ends the run
        (``fail``) and propagates."""
        try:
            yield
        except BaseException as exc:
            self.fail(exc)
            raise

    # --- internals ------------------------------------------------------------------------

    def _release(self, checkpoint: str | None) -> None:
        """Hand off the held reports, the last naming ``checkpoint`` (its round's)."""
        held, self._held = self._held, []
        for position, (index, metrics) in enumerate(held, 1):
            report = self._make_report(index, metrics)
            if position == len(held) and checkpoint is not None:
                report = msgspec.structs.replace(report, checkpoint=checkpoint)
            self._run.handoff(report)

    def _check(self, control: Any, handed_off: bool = False) -> None:
        """Raise a callback's failure now; a callback's wish to stop ends this step."""
        if self._looked(handed_off):
            control.should_training_stop = True

    def _run_name(self, args: Any) -> str:
        if self.name:
            return self.name
        run_name = getattr(args, "run_name", None)
        return str(run_name) if run_name else Path(str(args.output_dir)).name or "hf-trainer"

    def _resume_checkpoint(self, args: Any, state: Any) -> str | None:
        """The checkpoint this ``train()`` resumed from, or None: ``resume_from``, else
        ``<output_dir>/checkpoint-<global_step>`` past step 0 (the Trainer does not say)."""
        explicit, self.resume_from = self.resume_from, None
        if explicit is not None:
            return str(Path(explicit).resolve())
        step = int(state.global_step)
        if step <= 0:
            return None
        candidate = Path(args.output_dir, f"{PREFIX_CHECKPOINT_DIR}-{step}")
        if candidate.is_dir():
            return str(candidate.resolve())
        _log.warning(
            "resumed at a step whose checkpoint is not in output_dir; callback states not "
            "restored (train through run_with_failures(trainer, resume_from_checkpoint=...))",
            global_step=step,
            looked_for=str(candidate),
        )
        return None

    def _saved_states(self, store: StateStore, checkpoint: str) -> Snapshot | None:
        """Our snapshot file in ``checkpoint``, else our classes' ``stateful_callbacks`` in
        its ``trainer_state.json``."""
        try:
            return store.load(checkpoint)  # the operator's checkpoint: it may be anywhere
        except FileNotFoundError:
            pass
        trainer_state = Path(checkpoint, TRAINER_STATE_NAME)
        if not trainer_state.is_file():
            return None
        hf = read_hf_trainer_state(trainer_state)
        # HF keeps its own callbacks' states there too: take only our classes'.
        ours = {type(cb).__name__ for cb in self._callbacks if is_stateful(cb)}
        states = {k: v for k, v in hf.states.items() if k.split("[", 1)[0] in ours}
        if not states:
            return None
        return Snapshot(checkpoint=checkpoint, keyed_by="class_name", states=states)

    def _merge_states_into_trainer_state(
        self, bus: EventBus, attachment: CallbackAttachment
    ) -> None:
        """Each snapshot of our states goes into its checkpoint's ``trainer_state.json`` too."""
        store = self._store
        assert store is not None  # subscribed only for a run that saves states

        def merge(event: StateSnapshotted) -> None:
            path = Path(event.checkpoint, TRAINER_STATE_NAME)
            if not event.error and event.path and path.is_file():
                merge_stateful_callbacks(path, store.load(event.checkpoint))

        name = "adapters.transformers.trainer_state"
        bus.subscribe(StateSnapshotted, merge, name=name, order=Stage.HANDOFF)


def _training_args(args: Any) -> dict[str, Any]:
    """``{"training_args": ...}``: the ``TrainingArguments`` that differ from their fields'
    defaults, as JSON values. Compared with field defaults, not a default instance:
    making one resets accelerate's state, which the running Trainer uses."""
    given = args.to_dict()
    changed: dict[str, Any] = {}
    for field in dataclasses.fields(args):
        if field.name not in given:
            continue
        if field.default is not dataclasses.MISSING:
            default: Any = field.default
        elif field.default_factory is not dataclasses.MISSING:
            default = field.default_factory()
        else:  # required: always worth showing
            default = dataclasses.MISSING
        value = getattr(args, field.name)  # as given (a token, not to_dict's mask)
        # A falsy default worked out as another falsy value (None as False) is no change.
        if value != default and (value or default):
            changed[field.name] = given[field.name]
    if not changed:
        return {}
    return {"training_args": msgspec.to_builtins(changed, str_keys=True, enc_hook=repr)}


class _ReportMaker:
    """Makes ``on_log``'s reports in the bus's loop (a class: it stays picklable)."""

    __slots__ = ("rank", "run_id", "world_size")
    event_type = Report  # what warnings call a report still in the hand-off

    def __init__(self, run_id: str, rank: int, world_size: int) -> None:
        self.run_id, self.rank, self.world_size = run_id, rank, world_size

    def __call__(self, index: int, metrics: dict[str, Any]) -> Report:
        return Report(
            run_id=self.run_id,
            rank=self.rank,
            world_size=self.world_size,
            index=index,
            metrics=metrics,
        )


def run_with_failures(trainer: Any, **train_kwargs: Any) -> Any:
    """``trainer.train(**train_kwargs)`` with our ``EventBusCallback`` told about failures.

    An escaping exception ends the run failed, then propagates. ``resume_from_checkpoint``
    is passed to the callback, so the exact checkpoint's states are restored.
    """
    matches = [cb for cb in trainer.callback_handler.callbacks if isinstance(cb, EventBusCallback)]
    if len(matches) != 1:
        raise ValueError(
            f"run_with_failures needs exactly one EventBusCallback on the trainer, found "
            f"{len(matches)}"
        )
    callback = matches[0]
    resume = train_kwargs.get("resume_from_checkpoint")
    if resume is True:
        resume = get_last_checkpoint(trainer.args.output_dir)
    if isinstance(resume, str | os.PathLike):
        callback.resume_from = os.fspath(resume)
    with callback.failures():
        return trainer.train(**train_kwargs)
