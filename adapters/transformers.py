"""Hugging Face Trainer adapter: our callbacks, bus and state store behind one ``TrainerCallback``.

``EventBusCallback`` turns the Trainer's hooks into our events and hands
them to a bus stepped in the Trainer's own thread, in its hooks
(``adapters._stepped_bus``; ``bus_runs="in_thread"``: a thread of its own),
so our callbacks run where HF's own callbacks run, with no second thread
taking the GIL from the training loop:

- ``on_train_begin`` -> ``RunStarted`` (rank ``args.process_index``, world
  size ``args.world_size``; its config holds the non-default
  ``TrainingArguments`` as ``training_args``, the trackers' params, and
  ``step_metric="step"``: trackers plot at HF's global step), after restoring
  our callbacks' state when the Trainer resumes from a checkpoint;
- ``on_log`` -> ``Report`` (a copy of ``logs`` plus ``step``; the index
  counts this rank's reports), except HF's end-of-training log
  (``train_runtime``, ``train_loss``, ...), which describes the run, not a
  round: it is ``RunFinished.summary`` (``RunResult.summary`` in ``after_run``);
- ``on_save`` -> the ``checkpoint-<step>`` directory HF just wrote is the
  checkpoint of that step's round (the reports of a step that saves wait for
  its save), so ``after_report`` sees every save, as with ``open_run``; the
  round announces its ``CheckpointSaved``, as ``open_run``'s do, so the state
  store's snapshot, written into that directory, holds every callback's state
  as of the checkpoint and where the run stood; the states are also merged
  into the checkpoint's ``trainer_state.json`` (``stateful_callbacks``), atomically;
- ``on_train_end`` -> ``RunFinished``, then the bus is drained and closed.

A resume restores the callbacks you passed in place (``StateStore.restore``
with ``in_place=True``, as ``open_run`` does) and, from a checkpoint whose
``callback_state.json`` says where the run stood, continues that run as
``open_run`` does: the same run id, its log appended to, its rounds and
report indices continued, ``RunResumed`` after ``RunStarted``.

The Trainer has no hook for exceptions: ``run_with_failures(trainer)`` (or
``with callback.failures(): trainer.train()``) turns an exception escaping
``train()`` into a ``WorkerFailure`` and a failed ``RunFinished``. The other
way round, a callback that fails the run (``on_error="raise"``, or an
interrupt raised in it) ends the run, ``after_run`` included, and its
exception is raised into the Trainer at its next hook, so ``train()`` stops
with it.

Our callbacks ask to stop by setting ``should_stop`` (as ``EarlyStopping``
does); the next Trainer hook sets ``control.should_training_stop``: the
deciding report's own ``on_log`` when steps last longer than
``poll_interval``, else within ``poll_interval`` of it.

HF's ``trainer_state.json`` format (``to_hf_callbacks``, ``from_hf_callbacks``)
needs no ``transformers``: it is importable from here without it. The
Trainer's callback imports ``transformers`` on first use, and without it
fails with one line naming the extra to install.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ._hf_state import from_hf_callbacks, to_hf_callbacks

if TYPE_CHECKING:
    from ._hf_callback import EventBusCallback, run_with_failures

__all__ = [
    "EventBusCallback",
    "from_hf_callbacks",
    "run_with_failures",
    "to_hf_callbacks",
]

_NEEDS_TRANSFORMERS = frozenset({"EventBusCallback", "run_with_failures"})


def __getattr__(name: str) -> Any:
    """The Trainer callback and ``run_with_failures``: ``transformers`` imported on first use."""
    if name in _NEEDS_TRANSFORMERS:
        # Without transformers: an ImportError naming the extra to install.
        from ._hf_callback import EventBusCallback, run_with_failures

        return {"EventBusCallback": EventBusCallback, "run_with_failures": run_with_failures}[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
