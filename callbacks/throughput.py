"""SpeedMonitor: how fast are we? Tokens/s, samples/s, MFU, peak memory, time spent waiting for data.

Measured over windows of ``every_n_steps`` optimizer updates: a window closes after each update n
with ``n % every_n_steps == 0`` (the convention of :mod:`callbacks.update_boundary`; logged at step
n - 1) and the next one opens when the training loop fetches its next batch. The device is
synchronised only at window ends, so the measurement does not slow the run. Windows start after
``skip_first_steps`` updates of each launch (compilation, allocator and loader warm-up); a window
with a validation pass in it is dropped, and the next one opens at the next fetch.

- ``perf/tokens_per_sec``, ``perf/samples_per_sec``: global (all ranks), prediction tokens;
- ``perf/mfu``: model FLOPs (the model's own per-token report, from ``Decoder.flops_per_token``)
  x tokens/s / (devices x dense peak FLOP/s, :mod:`fixed_embed.peak_flops`) in the dtype the
  matmuls run in (:func:`fixed_embed.peak_flops.training_matmul_dtype`: autocast's dtype, FSDP2's
  ``param_dtype``, or the weights' dtype -- FSDP2 at ``32-true`` with bf16 parameters is a bf16
  peak, not fp32); not logged on devices without a known peak (CPU);
- ``perf/peak_mem_gb``: peak allocated device memory (CUDA), or the process's peak RSS (CPU);
  the maximum over ranks;
- ``perf/data_wait_frac``: share of the window spent inside the training loop's ``next()`` on the
  dataloader, i.e. waiting for data and nothing else (see :class:`fixed_embed.lightning_internals.FetchTimer`).

The work after a window's end -- the callbacks after this one (a checkpoint write, an in-loop
benchmark), validation -- falls between two windows and counts in neither.
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
from callbacks.update_boundary import UpdateCallback
from fixed_embed.lightning_internals import FetchTimer
from fixed_embed.peak_flops import peak_flops, training_matmul_dtype

__all__ = ["SpeedMonitor"]


class SpeedMonitor(UpdateCallback):
    """Args:
    every_n_steps: window length, in optimizer updates.
    skip_first_steps: updates of each launch excluded before the first window.
    enabled: the on/off switch.
    """

    def __init__(self, every_n_steps: int = 10, skip_first_steps: int = 3, enabled: bool = True) -> None:
        super().__init__(every_n_steps, enabled)
        if skip_first_steps < 0:
            raise ValueError(f"SpeedMonitor: skip_first_steps must be >= 0, got {skip_first_steps}")
        self.skip_first_steps = skip_first_steps
        self.last_metrics: dict[str, float] = {}
        self._first_update_logged = False
        self._peak: float | None = None
        self.matmul_dtype: str | None = None  # set at train start: the dtype of the peak MFU divides by
        self._seq_len = 0  # of the last micro-batch
        self._timer: FetchTimer | None = None
        self._updates = 0  # updates done in this fit
        self._reset(pending=False)

    def _reset(self, pending: bool) -> None:
        """Close the window; with ``pending``, the next one opens at the next fetch (or batch start)."""
        self._window_start: float | None = None
        self._pending = pending
        self._tokens = self._samples = 0
        self._wait = 0.0
        self._fetch_start: float | None = None

    def _open(self, now: float) -> None:
        if self._pending:
            self._pending, self._window_start = False, now

    # -- the fetch: the only time counted as data wait -------------------------------------------

    def _on_fetch_start(self) -> None:
        now = time.perf_counter()
        self._open(now)
        self._fetch_start = now if self._window_start is not None else None

    def _on_fetch_stop(self) -> None:
        if self._fetch_start is not None and self._window_start is not None:
            self._wait += time.perf_counter() - self._fetch_start
        self._fetch_start = None

    # -- hooks --------------------------------------------------------------------------------------

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not self.enabled:
            return
        self._updates = 0
        self._reset(pending=self.skip_first_steps == 0)
        try:  # from what runs: autocast's dtype, FSDP2's param_dtype, or the weights' own dtype
            self.matmul_dtype = training_matmul_dtype(trainer, pl_module)
        except ValueError:
            self.matmul_dtype = None
        self._peak = peak_flops(pl_module.device, self.matmul_dtype) if self.matmul_dtype else None
        self._timer = FetchTimer(trainer.profiler, self._on_fetch_start, self._on_fetch_stop)

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.teardown(trainer, pl_module, "fit")

    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if self._timer is not None:  # set only when enabled at on_train_start
            self._timer.remove()
            self._timer = None

    def on_micro_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any) -> None:
        self._open(time.perf_counter())  # no fetch was timed (the first batch, or no profiler hook)

    def on_micro_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any) -> None:
        self._seq_len = batch.shape[1] - 1
        if self._window_start is not None:
            self._tokens += batch.shape[0] * self._seq_len
            self._samples += batch.shape[0]

    def on_update_end(self, trainer: L.Trainer, pl_module: L.LightningModule, update: int) -> None:
        self._updates += 1
        if not self._first_update_logged:
            self._first_update_logged = True
            # Start-up cost (imports, data and validation set-up, resume, first forward/backward):
            # what every preemption pays again. Measured from the process's own start.
            since = time.time() - psutil.Process().create_time()
            rank_zero_info(f"First update done {since:.1f} s after the process started (update {update})")
            log_global(trainer, {"perf/time_to_first_update_s": (since, "max")}, update - 1)
        if self._window_start is None:  # still warming up
            if not self._pending and self._updates >= self.skip_first_steps:
                self._reset(pending=True)
            return
        if not self.due(update):
            return
        elapsed = self._now(pl_module) - self._window_start
        world = trainer.world_size
        tokens_per_sec = self._tokens * world / elapsed
        metrics = {
            "perf/tokens_per_sec": tokens_per_sec,
            "perf/samples_per_sec": self._samples * world / elapsed,
            "perf/data_wait_frac": self._wait / elapsed,
            "perf/peak_mem_gb": self._peak_memory_gb(pl_module.device),
        }
        if self._peak is not None:
            flops = pl_module.decoder.flops_per_token(self._seq_len)
            metrics["perf/mfu"] = flops * tokens_per_sec / (self._peak * world)
        reduce = {name: (value, "max" if name == "perf/peak_mem_gb" else "mean") for name, value in metrics.items()}
        self.last_metrics = log_global(trainer, reduce, update - 1)
        self._reset(pending=True)  # what the later callbacks do now is in no window

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.enabled and trainer.state.fn == "fit" and self._window_start is not None:
            self._reset(pending=True)

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
