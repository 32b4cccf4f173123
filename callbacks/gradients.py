"""GradientMonitor: global and per-part gradient norms after the reduction, before clipping
(README's tag table)."""

from __future__ import annotations

import lightning as L
import torch

from callbacks.update_boundary import UpdateCallback, global_norms, log_global


class GradientMonitor(UpdateCallback):
    """Args:
    every_n_steps: log every N optimizer updates.
    per_part: also log each block, the head, the final norm and a learned interface.
    parameter_norms: also log weight norms (``param/...``).
    enabled: the on/off switch.
    """

    def __init__(
        self,
        every_n_steps: int = 10,
        per_part: bool = True,
        parameter_norms: bool = False,
        enabled: bool = True,
    ) -> None:
        super().__init__(every_n_steps, enabled)
        self.per_part = per_part
        self.parameter_norms = parameter_norms

    def on_before_update_step(
        self, trainer: L.Trainer, pl_module: L.LightningModule, update: int
    ) -> None:
        if not self.due(update):
            return
        parts = self._parts(pl_module)
        groups = {
            "grad": {
                name: [p.grad for p in params if p.grad is not None]
                for name, params in parts.items()
            }
        }
        if self.parameter_norms:
            groups["param"] = {name: [p.detach() for p in params] for name, params in parts.items()}
        metrics = {}
        for kind, tensors in groups.items():
            if not (norms := global_norms({name: t for name, t in tensors.items() if t})):
                return  # no gradient
            # the parts' norms make the global one
            metrics[f"{kind}/norm"] = torch.linalg.vector_norm(torch.stack(list(norms.values())))
            if self.per_part:
                metrics |= {f"{kind}/{name}": norm for name, norm in norms.items()}
        clip = trainer.gradient_clip_val
        if clip and (trainer.gradient_clip_algorithm or "norm") == "norm":
            metrics["grad/clip_coef"] = torch.clamp(clip / (metrics["grad/norm"] + 1e-6), max=1.0)
        # Already global (DDP-reduced or all-reduced shards): identical on every rank.
        self.last_metrics = log_global(
            trainer, {k: (v, "max") for k, v in metrics.items()}, update - 1
        )

    @staticmethod
    def _parts(pl_module: L.LightningModule) -> dict[str, list[torch.nn.Parameter]]:
        decoder = pl_module.decoder
        modules = {
            "interface": decoder.interface,
            **{f"block_{i}": block for i, block in enumerate(decoder.layers)},
            "final_norm": decoder.norm,
            "head": decoder.head,
        }
        parts, seen = {}, set()
        for name, module in modules.items():
            # a tied head's weight is the interface's, counted there; a part without any: none
            params = [p for p in module.parameters() if p.requires_grad and id(p) not in seen]
            seen.update(map(id, params))
            if params:
                parts[name] = params
        return parts
