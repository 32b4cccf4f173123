"""InputNormMonitor: norms of the interface's output on real batches, drift, fixed codes checked
(README's tags), by a hook on a logged update's first forward: no extra compute, and under FSDP
the table is unsharded only then."""

from __future__ import annotations

from typing import Any

import lightning as L
import torch
from lightning.pytorch.loggers import TensorBoardLogger

from callbacks.update_boundary import UpdateCallback, global_norms, log_global


class InputNormMonitor(UpdateCallback):
    """Args:
    every_n_steps: log every N optimizer updates.
    histogram: also log a histogram of the per-token norms (TensorBoard only).
    track_drift: learned tables: keep a copy of the initial table (V x d, on its device) for drift.
    probe_ids: fixed interfaces: how many ids, spread over the vocabulary, are re-encoded as a
    check. enabled: the on/off switch.
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
        self.histogram, self.track_drift, self.probe_ids = histogram, track_drift, probe_ids
        self._captured: tuple[torch.Tensor, torch.Tensor] | None = None  # norms, expected
        self._armed = False
        self._update = 0  # the update whose first forward is (to be) captured
        self._hook = None
        self._reference: Any = None

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not self.enabled:
            return
        interface = pl_module.decoder.interface
        self._hook = interface.register_forward_hook(self._capture)
        if interface.fixed:
            vocab = interface.vocab_size
            probe = torch.linspace(
                0, vocab - 1, min(self.probe_ids, vocab), device=pl_module.device
            )
            probe = probe.round().long().unique()
            with torch.no_grad():
                self._reference = (probe, interface(probe).clone())
        elif self.track_drift:
            self._reference = [
                p.detach().clone() for p in interface.parameters() if p.requires_grad
            ]

    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if self._hook is not None:  # set only when enabled at on_train_start
            self._hook.remove()
            self._hook = None
        self._reference = None

    def on_update_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, update: int
    ) -> None:
        if self.due(update):
            self._armed, self._update, self._captured = True, update, None  # its first micro-batch

    def _capture(self, module: torch.nn.Module, args: tuple, output: torch.Tensor) -> None:
        if not self._armed:
            return
        self._armed = False  # once per logged update (activation checkpointing re-runs forwards)
        with torch.no_grad():
            norms = output.detach().float().norm(dim=-1).flatten()
            self._captured = norms, module.expected_norm(args[0]).float().flatten().to(norms.device)

    def on_update_end(self, trainer: L.Trainer, pl_module: L.LightningModule, update: int) -> None:
        if update != self._update or self._captured is None:
            return  # not a logged update
        (norms, expected), self._captured = self._captured, None
        interface = pl_module.decoder.interface
        # each statistic reduced over the ranks by the same statistic
        metrics = {
            f"input/norm_{how}": (getattr(norms, how)(), how) for how in ("mean", "min", "max")
        }
        if (
            interface.fixed
        ):  # their analytic norm; a learned table's norms are its own (or rescaled to one): error 0
            metrics |= {
                "input/norm_expected": (expected.mean(), "mean"),
                "input/norm_error": ((norms - expected).abs().max(), "max"),
            }
            probe, codes = self._reference
            with torch.no_grad():
                moved = (interface(probe) != codes).any(-1).nonzero().flatten()
            if moved.numel():
                raise RuntimeError(
                    f"the fixed {type(interface).__name__} changed during training (step "
                    f"{update}): the "
                    f"codes of {moved.numel()} of {probe.numel()} probe ids differ from the start, "
                    "e.g. "
                    f"id {int(probe[moved[0]])}"
                )
        elif self.track_drift and self._reference:
            params = [p.detach() for p in interface.parameters() if p.requires_grad]
            delta = [p - r for p, r in zip(params, self._reference, strict=True)]
            drift = global_norms({"delta": delta, "start": self._reference})
            metrics["input/drift"] = (drift["delta"] / drift["start"], "mean")
        self.last_metrics = log_global(trainer, metrics, update - 1)
        if self.histogram and trainer.is_global_zero:
            for logger in trainer.loggers:
                if isinstance(logger, TensorBoardLogger):
                    logger.experiment.add_histogram("input/norms", norms.cpu(), update - 1)
