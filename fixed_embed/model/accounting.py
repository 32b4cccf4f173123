"""Parameter and FLOP accounting: what each part of a model holds and costs per token (on the
meta device)."""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn

from fixed_embed.model.decoder import Decoder


def parameter_count(module: nn.Module, trainable: bool | None = None) -> int:
    """Parameters of ``module`` (only the trainable or frozen ones, if given), a shared (tied)
    one once."""
    return sum(
        p.numel() for p in module.parameters() if trainable is None or p.requires_grad == trainable
    )


@dataclass(frozen=True)
class ParameterReport:
    total: int
    trainable: int
    interface_trainable: int
    head: int
    backbone: int
    flops_per_token: int
    seq_len: int

    def rows(self) -> list[tuple[str, int]]:
        return [
            ("total", self.total),
            ("trainable", self.trainable),
            ("frozen", self.total - self.trainable),
            ("input interface (trainable)", self.interface_trainable),
            ("output head", self.head),
            ("backbone (blocks + final norm)", self.backbone),
        ]


def parameter_report(decoder: Decoder) -> ParameterReport:
    head = 0 if decoder.config.tie_embeddings else parameter_count(decoder.head)
    backbone = parameter_count(decoder.layers) + parameter_count(decoder.norm)
    return ParameterReport(
        parameter_count(decoder),
        parameter_count(decoder, trainable=True),
        parameter_count(decoder.interface, trainable=True),
        head,
        backbone,
        decoder.flops_per_token(),
        decoder.config.max_seq_len,
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
    # a tied head is counted once, under the interface that owns it
    tied, head = decoder.config.tie_embeddings, 6 * decoder.head.weight.numel()
    flops = {
        "interface": head if tied else 0,
        "layers": decoder.flops_per_token(seq_len) - head,
        "norm": 0,
        "head": 0 if tied else head,
    }
    rows = []
    for name, module in decoder.named_children():
        kind = type(module).__name__
        if isinstance(module, nn.ModuleList):
            kind = f"{len(module)} x {type(module[0]).__name__}"
        if name == "head" and tied:
            kind, trainable, frozen = f"{kind} (tied)", 0, 0
        else:
            trainable, frozen = (
                parameter_count(module, trainable=True),
                parameter_count(module, trainable=False),
            )
        derived = derived_buffers(module)
        fixed_state = sum(b.numel() for key, b in module.named_buffers() if key not in derived)
        rows.append(
            ModuleCost(name, kind, trainable, frozen, fixed_state, flops_per_token=flops[name])
        )
    return rows


def derived_buffers(module: nn.Module) -> list[str]:
    """Names of the buffers ``module`` rebuilds rather than stores: non-persistent ones (GF(2)
    rows, random code tables)."""
    stored = module.state_dict(keep_vars=True).keys()
    return [name for name, _ in module.named_buffers() if name not in stored]
