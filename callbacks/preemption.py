"""PreemptionCheckpoint: on SIGTERM, finish the update in flight, save, exit 0 (docs/faults.md,
"Preemption"). Lightning's own handler raises at the next micro-batch, possibly
mid-accumulation, and exits with an error."""

from __future__ import annotations

import signal
from collections.abc import Callable
from typing import Any

import lightning as L
from lightning.pytorch.utilities import rank_zero_info

from callbacks.checkpointing import save_now
from callbacks.update_boundary import UpdateCallback
from fixed_embed.distributed import rank_watch
from fixed_embed.lightning_internals import skip_sigterm_broadcast


class PreemptionCheckpoint(UpdateCallback):
    """Args:
    signals: signal names to handle (``SIGTERM``, ``SIGUSR1``, ...).
    enabled: the on/off switch.
    """

    def __init__(self, signals: list[str] | None = None, enabled: bool = True) -> None:
        names = ["SIGTERM"] if signals is None else list(signals)
        unknown = [
            n for n in names if not isinstance(getattr(signal, str(n), None), signal.Signals)
        ]
        if unknown or not names:
            raise ValueError(
                f"signals must be non-empty signal names such as 'SIGTERM', got {names!r}"
            )
        super().__init__(every_n_steps=1, enabled=enabled)
        self.signals = [signal.Signals[n] for n in names]
        self.received: signal.Signals | None = None
        self._restore_broadcast: Callable[[], None] | None = None
        self._previous: dict[signal.Signals, Any] = {}

    def _handle(self, signum: int, frame: Any) -> None:
        self.received = signal.Signals(signum)
        if (watch := rank_watch.current()) is not None:
            watch.request_stop()

    def stop_requested(self) -> bool:
        """This rank was signalled, or (through the rank watch) another one was."""
        watch = rank_watch.current()
        return self.received is not None or (watch is not None and watch.stop_requested)

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not self.enabled:
            return
        self.received = None  # the handlers replace Lightning's, installed before fit
        self._previous = {s: signal.signal(s, self._handle) for s in self.signals}
        if signal.SIGTERM in self.signals:  # its broadcast now always says 0 (lightning_internals)
            self._restore_broadcast = skip_sigterm_broadcast(trainer)
        names = ", ".join(s.name for s in self.signals)
        rank_zero_info(
            f"PreemptionCheckpoint: on {names}, save a checkpoint at the end of the update and stop"
        )

    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if not self._previous:  # disabled, or never installed
            return
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous = {}
        if self._restore_broadcast is not None:
            self._restore_broadcast()
            self._restore_broadcast = None

    def on_update_end(self, trainer: L.Trainer, pl_module: L.LightningModule, update: int) -> None:
        if not self._previous:  # handlers not installed (on_train_start not run)
            return
        if not trainer.strategy.reduce_boolean_decision(self.stop_requested(), all=False):
            return
        path = save_now(trainer)
        trainer.should_stop = True
        trainer.limit_val_batches = 0  # no validation on stopping: the grace period is short
        what = self.received.name if self.received is not None else "a signal on another rank"
        rank_zero_info(
            f"PreemptionCheckpoint: {what} -> saved {path} at step {trainer.global_step}; "
            "stopping. "
            "Relaunch the same command with --ckpt_path last to continue"
        )
