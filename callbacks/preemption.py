"""PreemptionCheckpoint: on SIGTERM, finish the update in flight, write a resumable checkpoint, exit 0.

SLURM sends SIGTERM before it preempts or times out a job (``--signal`` can make it earlier),
as do ``kill``, Kubernetes and torchrun when it is itself terminated. Lightning's own handler
raises at the next micro-batch -- possibly halfway through a gradient accumulation, whose
partial gradients are then lost -- and exits with an error. This callback instead:

1. records the signal (the handler only sets a flag; nothing unsafe runs inside it);
2. after the next *optimizer update*, agrees across ranks that some rank was signalled
   (one tiny all-reduce per update; under the subprocess launcher only rank 0 is signalled);
3. saves ``last.ckpt`` in the ModelCheckpoint folder -- exactly what ``--ckpt_path last`` resumes --
   and stops the trainer, so the process exits with status 0 and the resumed run continues
   with the next batch, the same LR and optimizer state.
"""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

import lightning as L
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.utilities import rank_zero_info

__all__ = ["PreemptionCheckpoint"]


class PreemptionCheckpoint(L.Callback):
    """Save and stop cleanly at the first optimizer-update boundary after one of ``signals``.

    Args:
        signals: signal names to handle (``SIGTERM``, ``SIGUSR1``, ...).
        enabled: the on/off switch.
    """

    def __init__(self, signals: list[str] | None = None, enabled: bool = True) -> None:
        names = ["SIGTERM"] if signals is None else list(signals)
        unknown = [n for n in names if not isinstance(getattr(signal, str(n), None), signal.Signals)]
        if unknown or not names:
            raise ValueError(f"signals must be non-empty signal names such as 'SIGTERM', got {names!r}")
        self.signals = [signal.Signals[n] for n in names]
        self.enabled = enabled
        self.received: signal.Signals | None = None
        self._previous: dict[signal.Signals, Any] = {}
        self._step_at_batch_start = -1

    def _handle(self, signum: int, frame: Any) -> None:
        self.received = signal.Signals(signum)

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not self.enabled:
            return
        # Installed after Lightning's fit-time handler, which it replaces for the training loop.
        self.received = None
        self._previous = {s: signal.signal(s, self._handle) for s in self.signals}
        names = ", ".join(s.name for s in self.signals)
        rank_zero_info(f"PreemptionCheckpoint: on {names}, save {self.checkpoint_path(trainer)} and stop")

    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous = {}

    def checkpoint_path(self, trainer: L.Trainer) -> Path:
        callback = trainer.checkpoint_callback
        if isinstance(callback, ModelCheckpoint) and callback.dirpath:
            return Path(callback.dirpath) / f"{callback.CHECKPOINT_NAME_LAST}{callback.FILE_EXTENSION}"
        return Path(trainer.default_root_dir) / "checkpoints" / "last.ckpt"

    def on_train_batch_start(self, trainer: L.Trainer, *args: Any) -> None:
        self._step_at_batch_start = trainer.global_step

    def on_train_batch_end(self, trainer: L.Trainer, *args: Any) -> None:
        if not self._previous or trainer.global_step == self._step_at_batch_start:
            return  # disabled, or mid-accumulation: stopping here would lose partial gradients
        if not trainer.strategy.reduce_boolean_decision(self.received is not None, all=False):
            return
        path = self.checkpoint_path(trainer)
        trainer.save_checkpoint(path)
        trainer.should_stop = True
        what = self.received.name if self.received is not None else "a signal on another rank"
        rank_zero_info(
            f"PreemptionCheckpoint: {what} -> saved {path} at step {trainer.global_step}; stopping. "
            "Resume with --ckpt_path last"
        )
