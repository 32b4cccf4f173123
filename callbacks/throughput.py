"""SpeedMonitor: tokens/s, samples/s, MFU, peak memory, data wait (README's ``perf/`` tags) over
``every_n_steps`` updates, first fetch to last update's end (one device sync); warm-up and
windows with a validation are left out."""

from __future__ import annotations

import resource
import time
from typing import Any

import lightning as L
import psutil
import torch
from lightning.pytorch.utilities import rank_zero_info

from callbacks.update_boundary import UpdateCallback, log_global
from fixed_embed.config import NonNegativeInt
from fixed_embed.lightning_internals import FetchTimer
from fixed_embed.measure.peak_flops import peak_flops, training_matmul_dtype


class SpeedMonitor(UpdateCallback):
    """Args:
    every_n_steps: window length, in optimizer updates.
    skip_first_steps: updates of each launch excluded before the first window.
    enabled: the on/off switch.
    """

    def __init__(
        self, every_n_steps: int = 10, skip_first_steps: NonNegativeInt = 3, enabled: bool = True
    ) -> None:
        super().__init__(every_n_steps, enabled)
        self.skip_first_steps = skip_first_steps
        self._peak: float | None = None
        self._seq_len = 0  # of the last micro-batch
        self._timer: FetchTimer | None = None
        self._updates = 0  # updates done in this fit
        self._reset(pending=False)

    def _reset(self, pending: bool) -> None:
        """Close the window; with ``pending``, the next one opens at the next fetch (or batch
        start)."""
        self._window_start: float | None = None
        self._pending = pending
        self._samples = 0
        self._wait = 0.0
        self._fetch_start: float | None = None

    def _open(self, now: float) -> None:
        if self._pending:
            self._pending, self._window_start = False, now

    def _on_fetch_start(self) -> None:
        now = time.perf_counter()
        self._open(now)
        self._fetch_start = now if self._window_start is not None else None

    def _on_fetch_stop(self) -> None:
        if self._fetch_start is not None:  # fetched inside a window
            self._wait += time.perf_counter() - self._fetch_start

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not self.enabled:
            return
        self._updates = 0
        self._reset(pending=self.skip_first_steps == 0)
        # the peak of the dtype the matmuls run in, which MFU divides by
        self._peak = peak_flops(pl_module.device, training_matmul_dtype(trainer, pl_module))
        self._timer = FetchTimer(trainer.profiler, self._on_fetch_start, self._on_fetch_stop)

    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if self._timer is not None:  # set only when enabled at on_train_start
            self._timer.remove()
            self._timer = None

    def on_micro_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any
    ) -> None:
        self._open(time.perf_counter())  # no fetch was timed (the first batch, or no profiler hook)

    def on_micro_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any
    ) -> None:
        self._seq_len = batch.shape[1] - 1  # every block's
        if self._window_start is not None:
            self._samples += batch.shape[0]

    def on_update_end(self, trainer: L.Trainer, pl_module: L.LightningModule, update: int) -> None:
        self._updates += 1
        if self._updates == 1:
            # Start-up cost, from the process's own start: what every preemption pays again.
            since = time.time() - psutil.Process().create_time()
            rank_zero_info(
                f"First update done {since:.1f} s after the process started (update {update})"
            )
            log_global(trainer, {"perf/time_to_first_update_s": (since, "max")}, update - 1)
        if self._window_start is None:  # still warming up
            if not self._pending and self._updates >= self.skip_first_steps:
                self._reset(pending=True)
            return
        if not self.due(update):
            return
        device = pl_module.device
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        elapsed, world = time.perf_counter() - self._window_start, trainer.world_size
        tokens_per_sec = self._samples * self._seq_len * world / elapsed
        peak_mem = (
            torch.cuda.max_memory_allocated(device) / 2**30
            if device.type == "cuda"
            else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB on Linux
        )
        metrics = {
            "perf/tokens_per_sec": (tokens_per_sec, "mean"),
            "perf/samples_per_sec": (self._samples * world / elapsed, "mean"),
            "perf/data_wait_frac": (self._wait / elapsed, "mean"),
            "perf/peak_mem_gb": (peak_mem, "max"),
        }
        if self._peak is not None:
            flops = pl_module.decoder.flops_per_token(self._seq_len)
            metrics["perf/mfu"] = (flops * tokens_per_sec / (self._peak * world), "mean")
        self.last_metrics = log_global(trainer, metrics, update - 1)
        self._reset(pending=True)  # what the later callbacks do now is in no window

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.enabled and trainer.state.fn == "fit" and self._window_start is not None:
            self._reset(pending=True)
