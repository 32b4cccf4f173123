"""Parameter and FLOP accounting: what each part of a model costs.

Built to run on the meta device, so the paper's 1.7B model is counted in seconds
without allocating a weight.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn

from fixed_embed.model import Decoder

__all__ = ["ModuleCost", "ParameterReport", "module_costs", "optimizer_state_bytes", "parameter_report"]


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


@dataclass(frozen=True)
class ModuleCost:
    """One row of a model summary: what a sub-module holds and what it costs per token."""

    name: str
    kind: str
    trainable: int
    frozen: int
    fixed_state: int  # persistent buffers: e.g. the GF(2) matrix that fixes a code assignment
    flops_per_token: int


def module_costs(decoder: Decoder, seq_len: int | None = None) -> list[ModuleCost]:
    """Per top-level part of the decoder (interface, blocks, final norm, head), in forward order."""
    t = seq_len or decoder.config.max_seq_len
    flops = {
        "interface": decoder.interface.flops_per_token(),
        "layers": sum(layer.flops_per_token(t) for layer in decoder.layers),
        "norm": 0,
        "head": 0 if decoder.config.tie_embeddings else 6 * decoder.head.weight.numel(),
    }
    if decoder.config.tie_embeddings:  # a tied head is counted once, under the interface that owns it
        flops["interface"] += 6 * decoder.head.weight.numel()
    rows = []
    for name, module in decoder.named_children():
        if name not in flops:
            continue  # RoPE tables: derived, non-persistent
        kind = type(module).__name__
        if isinstance(module, nn.ModuleList):
            kind = f"{len(module)} x {type(module[0]).__name__}" if len(module) else "empty"
        persistent = dict(module.named_buffers()).keys() - _non_persistent(module)
        head_tied = name == "head" and decoder.config.tie_embeddings
        rows.append(
            ModuleCost(
                name=name,
                kind=kind + (" (tied)" if head_tied else ""),
                trainable=0 if head_tied else _count(module, trainable=True),
                frozen=0 if head_tied else _count(module, trainable=False),
                fixed_state=sum(dict(module.named_buffers())[b].numel() for b in persistent),
                flops_per_token=flops[name],
            )
        )
    return rows


def _non_persistent(module: nn.Module) -> set[str]:
    names = set()
    for prefix, sub in module.named_modules():
        names |= {f"{prefix}.{b}" if prefix else b for b in sub._non_persistent_buffers_set}
    return names


def optimizer_state_bytes(n_trainable: int, param_bytes: int = 4, grad_bytes: int = 4, adam_bytes: int = 8) -> int:
    """Bytes a set of trainable parameters costs in training: weights + gradients + AdamW's two moments."""
    return n_trainable * (param_bytes + grad_bytes + adam_bytes)
