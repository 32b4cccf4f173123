"""InputNormMonitor: is the input what we think it is? Norms of the interface output on real batches.

For every update n with ``n % every_n_steps == 0`` (the convention of :mod:`callbacks.update_boundary`),
a forward hook on the input interface captures its output during that update's first training
forward (no extra compute; also inside FSDP, where the table is only unsharded during the model's
own forward); after the update the per-token L2 norms are logged at step n - 1:

- ``input/norm_mean``, ``input/norm_min``, ``input/norm_max`` (reduced across ranks);
- ``input/norm_expected``: the interface's analytic value (tiled 0/1 codes: sqrt(popcount x d/K)),
  and ``input/norm_error``, the largest |norm - expected| -- exactly 0 for a fixed code;
- learned tables: ``input/drift`` = ||W_n - W_0|| / ||W_0|| since the start of this fit;
- fixed interfaces: the codes are re-computed on probe ids and compared with those at the start:
  a fixed code that moved is an error (``RuntimeError``), not a chart;
- optionally a TensorBoard histogram of the norms (``input/norms``).
"""

from __future__ import annotations

from typing import Any

import lightning as L
import torch
from lightning.pytorch.loggers import TensorBoardLogger

from callbacks._global_metrics import log_global
from callbacks.update_boundary import UpdateCallback
from fixed_embed.norms import global_sq_sums

__all__ = ["InputNormMonitor"]


class InputNormMonitor(UpdateCallback):
    """Args:
    every_n_steps: log every N optimizer updates.
    histogram: also log a histogram of the per-token norms (TensorBoard only).
    track_drift: learned tables: keep a copy of the initial table (V x d, on its device) for drift.
    probe_ids: fixed interfaces: how many ids (spread over the vocabulary, 0 and V-1 included)
        are re-encoded to check the codes never change.
    enabled: the on/off switch.
    """

    def __init__(
        self,
        every_n_steps: int = 50,
        histogram: bool = False,
        track_drift: bool = True,
        probe_ids: int = 1024,
        enabled: bool = True,
    ) -> None:
        super().__init__(every_n_steps, enabled)
        if probe_ids < 2:
            raise ValueError(f"InputNormMonitor: probe_ids must be >= 2, got {probe_ids}")
        self.histogram = histogram
        self.track_drift = track_drift
        self.probe_ids = probe_ids
        self.last_metrics: dict[str, float] = {}
        self._captured: dict[str, torch.Tensor] | None = None
        self._armed = False
        self._update = 0  # the update whose first forward is (to be) captured
        self._hook = None
        self._reference: Any = None

    # -- set-up ----------------------------------------------------------------------------

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not self.enabled:
            return
        interface = pl_module.decoder.interface
        self._hook = interface.register_forward_hook(self._capture)
        if interface.fixed:
            probe = self._probe(interface, pl_module.device)
            with torch.no_grad():
                self._reference = (probe, interface(probe).clone())
        elif self.track_drift:
            self._reference = [p.detach().clone() for p in interface.parameters() if p.requires_grad]

    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if self._hook is not None:  # set only when enabled at on_train_start
            self._hook.remove()
            self._hook = None
        self._reference = None

    def _probe(self, interface: torch.nn.Module, device: torch.device) -> torch.Tensor:
        n = min(self.probe_ids, interface.vocab_size)
        return torch.linspace(0, interface.vocab_size - 1, n, device=device).round().long().unique()

    # -- capture on the real forward ----------------------------------------------------------

    def on_update_start(self, trainer: L.Trainer, pl_module: L.LightningModule, update: int) -> None:
        if self.due(update):
            self._armed, self._update, self._captured = True, update, None  # its first micro-batch

    def _capture(self, module: torch.nn.Module, args: tuple, output: torch.Tensor) -> None:
        if not self._armed:
            return
        self._armed = False  # once per logged update (activation checkpointing re-runs forwards)
        with torch.no_grad():
            norms = output.detach().float().norm(dim=-1).flatten()
            expected = module.expected_norm(args[0]).float().flatten().to(norms.device)
            self._captured = {"norms": norms, "expected": expected}

    def on_update_end(self, trainer: L.Trainer, pl_module: L.LightningModule, update: int) -> None:
        if update != self._update or self._captured is None:
            return  # not a logged update
        captured, self._captured = self._captured, None
        norms, expected = captured["norms"], captured["expected"]
        metrics = {
            "input/norm_mean": (norms.mean(), "mean"),
            "input/norm_min": (norms.min(), "min"),
            "input/norm_max": (norms.max(), "max"),
            "input/norm_expected": (expected.mean(), "mean"),
            "input/norm_error": ((norms - expected).abs().max(), "max"),
        }
        interface = pl_module.decoder.interface
        if interface.fixed:
            self._check_unchanged(interface, update)
        elif self.track_drift and self._reference:
            params = [p.detach() for p in interface.parameters() if p.requires_grad]
            sums = global_sq_sums(
                {"delta": [p - r for p, r in zip(params, self._reference, strict=True)], "start": self._reference}
            )
            metrics["input/drift"] = ((sums["delta"] / sums["start"]).sqrt(), "mean")
        self.last_metrics = log_global(trainer, metrics, update - 1)
        if self.histogram and trainer.is_global_zero:
            for logger in trainer.loggers:
                if isinstance(logger, TensorBoardLogger):
                    logger.experiment.add_histogram("input/norms", norms.cpu(), update - 1)

    def _check_unchanged(self, interface: torch.nn.Module, step: int) -> None:
        probe, codes = self._reference
        with torch.no_grad():
            now = interface(probe)
        if not torch.equal(now, codes):
            moved = (now != codes).any(-1).nonzero().flatten()
            raise RuntimeError(
                f"the fixed {type(interface).__name__} changed during training (step {step}): the codes of "
                f"{moved.numel()} of {probe.numel()} probe ids differ from the start, e.g. id {int(probe[moved[0]])}"
            )
