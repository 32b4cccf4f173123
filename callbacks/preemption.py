"""PreemptionCheckpoint: on SIGTERM, finish the update in flight, write a resumable checkpoint, exit 0.

SLURM sends SIGTERM before it preempts or times out a job (``--signal`` can make it earlier),
as do ``kill``, Kubernetes and torchrun when it is itself terminated. Lightning's own handler
raises at the next micro-batch -- possibly halfway through a gradient accumulation, whose
partial gradients are then lost -- and exits with an error. This callback instead:

1. records the signal (the handler only sets flags; nothing unsafe runs inside it) and asks
   :mod:`fixed_embed.rank_watch` to tell the other ranks (under the subprocess launcher only
   rank 0 is signalled);
2. after the next *optimizer update* (the boundary of :mod:`callbacks.update_boundary`), agrees
   across ranks that some rank was signalled (one tiny all-reduce per update);
3. saves through the run's checkpoint callback (:func:`callbacks.checkpointing.save_now`: its
   ``step=N`` name and its ``last`` link, one write) and stops the trainer, so the process exits
   with status 0 and ``--ckpt_path last`` continues with the next batch, the same LR and optimizer state.

With SIGTERM among its signals it also turns off Lightning's per-micro-batch broadcast of its own SIGTERM
flag (a collective and a host sync on every micro-batch with more than one rank), which only Lightning's
replaced handler could set (:func:`fixed_embed.lightning_internals.skip_sigterm_broadcast`).

An evaluation in flight (in-loop or end-of-run benchmarks) polls :meth:`stop_requested` between
forward passes and stops within one batch; see :mod:`callbacks.benchmarks`.
"""

from __future__ import annotations

import signal
from collections.abc import Callable
from typing import Any

import lightning as L
from lightning.pytorch.utilities import rank_zero_info

from callbacks.checkpointing import save_now
from callbacks.update_boundary import UpdateCallback
from fixed_embed import rank_watch
from fixed_embed.lightning_internals import skip_sigterm_broadcast

__all__ = ["PreemptionCheckpoint"]


class PreemptionCheckpoint(UpdateCallback):
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
        super().__init__(every_n_steps=1, enabled=enabled)  # every update: no interval to configure
        self.signals = [signal.Signals[n] for n in names]
        self.received: signal.Signals | None = None
        self._restore_broadcast: Callable[[], None] = _nothing
        self._previous: dict[signal.Signals, Any] = {}

    def _handle(self, signum: int, frame: Any) -> None:
        self.received = signal.Signals(signum)
        watch = rank_watch.current()
        if watch is not None:
            watch.request_stop()

    def stop_requested(self) -> bool:
        """This rank was signalled, or (through the rank watch) another one was."""
        watch = rank_watch.current()
        return self.received is not None or (watch is not None and watch.stop_requested)

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not self.enabled:
            return
        # Installed after Lightning's fit-time handler, which it replaces for the training loop.
        self.received = None
        self._previous = {s: signal.signal(s, self._handle) for s in self.signals}
        if signal.SIGTERM in self.signals:  # every rank alike: the broadcast is a collective
            self._restore_broadcast = skip_sigterm_broadcast(trainer)
        names = ", ".join(s.name for s in self.signals)
        rank_zero_info(f"PreemptionCheckpoint: on {names}, save a checkpoint at the end of the update and stop")

    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if not self._previous:  # disabled, or never installed
            return
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous = {}
        self._restore_broadcast()
        self._restore_broadcast = _nothing

    def on_update_end(self, trainer: L.Trainer, pl_module: L.LightningModule, update: int) -> None:
        # Only at the end of an update: stopping mid-accumulation would lose its partial gradients.
        if not self._previous:  # handlers not installed (on_train_start not run)
            return
        if not trainer.strategy.reduce_boolean_decision(self.stop_requested(), all=False):
            return
        path = save_now(trainer)
        trainer.should_stop = True
        # Lightning validates when a run stops early; inside a preemption grace period that is time
        # the scheduler may not give, and the resumed run validates on its own schedule.
        trainer.limit_val_batches = 0
        what = self.received.name if self.received is not None else "a signal on another rank"
        rank_zero_info(
            f"PreemptionCheckpoint: {what} -> saved {path} at step {trainer.global_step}; stopping. "
            "Relaunch the same command with --ckpt_path last to continue"
        )


def _nothing() -> None:
    return None
