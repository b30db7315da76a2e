"""adapters: the edges where the runtime meets the outside.

- ``adapters.transformers``: our callbacks, bus and state store behind a
  Hugging Face ``TrainerCallback``, and HF's ``trainer_state.json`` format;
- ``adapters.lightning``: the same behind a PyTorch Lightning ``Callback``, with
  every rank's metrics gathered to rank 0 under DDP;
- ``adapters.ray``: our callbacks and bus behind a Ray Train v2 ``UserCallback``;
- ``adapters.torchrun``: ``open_run``'s workers as a ``torchrun`` job's processes, the
  run in rank 0 (``TorchrunEngine``);
- ``adapters.tensorboard``, ``adapters.mlflow``: the run's metrics and its callbacks'
  cost in TensorBoard and MLflow, continued, not duplicated, by a resumed run;
- ``adapters.otel``: a run in OpenTelemetry (``OpenTelemetryTap``, in any callback
  list): a span per round, spans for slow or failed handler calls, handler metrics;
- ``adapters.report``: a recorded run (or two) as one self-contained HTML
  page: summary, metrics over rounds, callback cost, failures;
- ``adapters.cli``: the ``eventbus`` command line (the demo trainer, the
  callback-overhead bench, show / replay / convert / stats for logs, and
  report).

The trainer adapters feed the bus through a bounded hand-off (``adapters._bus_host``).
Third-party libraries are imported only here, when the module or feature that needs them is
used, and are installed as extras.
"""

from ._options import AdapterOptions

__all__ = ["AdapterOptions"]
