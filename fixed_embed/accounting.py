"""Parameter and FLOP accounting: what each part of a model costs.

Built to run on the meta device, so the paper's 1.7B model is counted in seconds
without allocating a weight.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn

from fixed_embed.model import Decoder

__all__ = ["ParameterReport", "parameter_report", "optimizer_state_bytes"]


def _count(module: nn.Module, trainable: bool | None = None) -> int:
    # De-duplicated by identity so a tied head is not counted twice.
    params = {id(p): p for p in module.parameters()}.values()
    return sum(p.numel() for p in params if trainable is None or p.requires_grad == trainable)


@dataclass(frozen=True)
class ParameterReport:
    total: int
    trainable: int
    frozen: int
    interface_trainable: int
    head: int
    backbone: int
    flops_per_token: int
    seq_len: int

    def rows(self) -> list[tuple[str, int]]:
        return [
            ("total", self.total),
            ("trainable", self.trainable),
            ("frozen", self.frozen),
            ("input interface (trainable)", self.interface_trainable),
            ("output head", self.head),
            ("backbone (blocks + final norm)", self.backbone),
        ]


def parameter_report(decoder: Decoder) -> ParameterReport:
    head = 0 if decoder.config.tie_embeddings else _count(decoder.head)
    backbone = _count(decoder.layers) + _count(decoder.norm)
    return ParameterReport(
        total=_count(decoder),
        trainable=_count(decoder, trainable=True),
        frozen=_count(decoder, trainable=False),
        interface_trainable=decoder.interface.trainable_parameters,
        head=head,
        backbone=backbone,
        flops_per_token=decoder.flops_per_token(),
        seq_len=decoder.config.max_seq_len,
    )


def optimizer_state_bytes(n_trainable: int, param_bytes: int = 4, grad_bytes: int = 4, adam_bytes: int = 8) -> int:
    """Bytes a set of trainable parameters costs in training: weights + gradients + AdamW's two moments."""
    return n_trainable * (param_bytes + grad_bytes + adam_bytes)
