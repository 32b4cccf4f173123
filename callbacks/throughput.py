"""ThroughputMonitor: how fast are we? Tokens/s, samples/s, MFU, peak memory, time spent waiting for data.

Measured over windows of ``every_n_steps`` optimizer updates (the device is synchronised only at
window ends, so the measurement does not slow the run), after ``skip_first_steps`` updates
(compilation, allocator and loader warm-up). A window with a validation pass in it is restarted
at the end of validation rather than reported.

- ``perf/tokens_per_sec``, ``perf/samples_per_sec``: global (all ranks), prediction tokens;
- ``perf/mfu``: model FLOPs (the model's own per-token report, from ``Decoder.flops_per_token``)
  x tokens/s / (devices x dense peak FLOP/s, :mod:`fixed_embed.peak_flops`); not logged on
  devices without a known peak (CPU);
- ``perf/peak_mem_gb``: peak allocated device memory (CUDA), or the process's peak RSS (CPU);
  the maximum over ranks;
- ``perf/data_wait_frac``: share of the window spent between one batch's end and the next one's
  start -- waiting for the loader (plus the loop's own bookkeeping).
"""

from __future__ import annotations

import resource
import time
from typing import Any

import lightning as L
import psutil
import torch
from lightning.pytorch.utilities import rank_zero_info

from callbacks._global_metrics import log_global
from fixed_embed.peak_flops import matmul_dtype, peak_flops

__all__ = ["ThroughputMonitor"]


class ThroughputMonitor(L.Callback):
    """Args:
    every_n_steps: window length, in optimizer updates.
    skip_first_steps: updates excluded before the first window.
    enabled: the on/off switch.
    """

    def __init__(self, every_n_steps: int = 10, skip_first_steps: int = 3, enabled: bool = True) -> None:
        if every_n_steps < 1 or skip_first_steps < 0:
            raise ValueError(f"need every_n_steps >= 1, skip_first_steps >= 0, got {every_n_steps}, {skip_first_steps}")
        self.every_n_steps = every_n_steps
        self.skip_first_steps = skip_first_steps
        self._first_update_logged = False
        self.enabled = enabled
        self.last_metrics: dict[str, float] = {}
        self._peak: float | None = None
        self._reset(None)

    def _reset(self, now: float | None) -> None:
        self._window_start = now
        self._tokens = self._samples = 0
        self._wait = 0.0
        self._last_end: float | None = now

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._reset(None)
        try:
            dtype = matmul_dtype(trainer.precision)
        except ValueError:
            dtype = None
        self._peak = peak_flops(pl_module.device, dtype) if dtype else None

    def on_train_batch_start(self, trainer: L.Trainer, *args: Any) -> None:
        if self._window_start is not None and self._last_end is not None:
            self._wait += time.perf_counter() - self._last_end
        self._step_at_start = trainer.global_step

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if not self.enabled:
            return
        step = trainer.global_step
        if not self._first_update_logged and step != self._step_at_start:
            self._first_update_logged = True
            # Start-up cost (imports, data and validation set-up, resume, first forward/backward):
            # what every preemption pays again. Measured from the process's own start.
            since = time.time() - psutil.Process().create_time()
            rank_zero_info(f"First update done {since:.1f} s after the process started (update {step})")
            log_global(trainer, {"perf/time_to_first_update_s": (since, "max")}, step - 1)
        if self._window_start is None:  # still warming up
            if step != self._step_at_start and step >= self.skip_first_steps:
                self._reset(self._now(pl_module))
            return
        self._tokens += batch.shape[0] * (batch.shape[1] - 1)
        self._samples += batch.shape[0]
        self._last_end = time.perf_counter()
        if step == self._step_at_start or (step - 1) % self.every_n_steps:
            return  # mid-accumulation, or not a window end
        now = self._now(pl_module)
        elapsed = now - self._window_start
        world = trainer.world_size
        tokens_per_sec = self._tokens * world / elapsed
        seq_len = batch.shape[1] - 1
        metrics = {
            "perf/tokens_per_sec": tokens_per_sec,
            "perf/samples_per_sec": self._samples * world / elapsed,
            "perf/data_wait_frac": self._wait / elapsed,
            "perf/peak_mem_gb": self._peak_memory_gb(pl_module.device),
        }
        if self._peak is not None:
            flops = pl_module.decoder.flops_per_token(seq_len)
            metrics["perf/mfu"] = flops * tokens_per_sec / (self._peak * world)
        reduce = {name: (value, "max" if name == "perf/peak_mem_gb" else "mean") for name, value in metrics.items()}
        self.last_metrics = log_global(trainer, reduce, step - 1)  # the index of the window's last update
        self._reset(time.perf_counter())

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.state.fn == "fit" and self._window_start is not None:
            self._reset(self._now(pl_module))

    @staticmethod
    def _now(pl_module: L.LightningModule) -> float:
        if pl_module.device.type == "cuda":
            torch.cuda.synchronize(pl_module.device)
        return time.perf_counter()

    @staticmethod
    def _peak_memory_gb(device: torch.device) -> float:
        if device.type == "cuda":
            return torch.cuda.max_memory_allocated(device) / 2**30
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB on Linux
