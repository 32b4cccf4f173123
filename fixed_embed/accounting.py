"""Parameter, FLOP and memory accounting: what each part of a model costs.

Built to run on the meta device, so the paper's 1.7B model is counted in seconds
without allocating a weight. :func:`memory_estimate` gives the per-GPU training memory
(weights, gradients, AdamW state, activations with and without checkpointing, the loss's
logits) and :func:`memory_warning` compares it with the device's memory at fit start.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch import nn

from fixed_embed.loss import DEFAULT_LOSS_CHUNK_TOKENS
from fixed_embed.model import Decoder

__all__ = [
    "MemoryEstimate",
    "ModuleCost",
    "ParameterReport",
    "activation_mode",
    "memory_estimate",
    "memory_warning",
    "model_memory_estimate",
    "module_costs",
    "optimizer_state_bytes",
    "parameter_report",
    "training_memory_estimate",
]


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
    tied = decoder.config.tie_embeddings  # a tied head is counted once, under the interface that owns it
    head = decoder.head.flops_per_token()
    flops = {
        "interface": decoder.interface.flops_per_token() + (head if tied else 0),
        "layers": sum(layer.flops_per_token(t) for layer in decoder.layers),
        "norm": 0,
        "head": 0 if tied else head,
    }
    rows = []
    for name, module in decoder.named_children():
        if name not in flops:
            continue  # RoPE tables: derived, non-persistent
        kind = type(module).__name__
        if isinstance(module, nn.ModuleList):
            kind = f"{len(module)} x {type(module[0]).__name__}" if len(module) else "empty"
        persistent = dict(module.named_buffers()).keys() - _non_persistent(module)
        head_tied = name == "head" and tied
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


# -- memory ---------------------------------------------------------------------------------

ActivationMode = Literal["float32", "mixed", "bfloat16"]
_GIB = 2**30


@dataclass(frozen=True)
class MemoryEstimate:
    """Per-GPU training memory in bytes (see :func:`memory_estimate` for the formulas).

    Activations and logits are per micro-batch (gradient accumulation does not add to them).
    """

    weights: int
    gradients: int
    optimizer: int
    activations: int  # saved for backward, without activation checkpointing
    activations_checkpointed: int  # with checkpointing per block
    logits_full: int  # the loss's peak from the full fp32 logits (loss_chunk_tokens 0)
    logits_chunked: int  # the loss's peak, chunked (loss_chunk_tokens)
    activation_checkpointing: bool
    loss_chunk_tokens: int | None
    micro_batch: int
    seq_len: int
    world_size: int
    sharded: bool
    mode: ActivationMode

    @property
    def model_state(self) -> int:
        return self.weights + self.gradients + self.optimizer

    @property
    def total(self) -> int:
        """The estimate for the configured run: its checkpointing choice and its loss chunking."""
        acts = self.activations_checkpointed if self.activation_checkpointing else self.activations
        return self.model_state + acts + (self.logits_chunked if self.loss_chunk_tokens else self.logits_full)

    def rows(self) -> list[tuple[str, int]]:
        """(label, bytes); ``*`` marks the alternatives the configuration uses, which ``total`` adds up."""
        shard = f" / {self.world_size} (FSDP)" if self.sharded and self.world_size > 1 else ""
        ac, chunked = self.activation_checkpointing, bool(self.loss_chunk_tokens)
        return [
            (f"weights (fp32 master){shard}", self.weights),
            (f"gradients (fp32){shard}", self.gradients),
            (f"optimizer (AdamW fp32 moments){shard}", self.optimizer),
            (f"activations ({self.mode}), no checkpointing{'' if ac else ' *'}", self.activations),
            (f"activations ({self.mode}), checkpointing per block{' *' if ac else ''}", self.activations_checkpointed),
            (f"loss: full fp32 logits{'' if chunked else ' *'}", self.logits_full),
            (
                f"loss: chunked, {self.loss_chunk_tokens or DEFAULT_LOSS_CHUNK_TOKENS} tokens{' *' if chunked else ''}",
                self.logits_chunked,
            ),
            ("total (weights, gradients, optimizer and the rows marked *)", self.total),
        ]


def activation_mode(precision: Any, fsdp_param_dtype: str | None = None) -> ActivationMode:
    """How activations are stored, from Lightning's ``trainer.precision`` and FSDP2's ``param_dtype``.

    ``mixed``: autocast (``bf16-mixed``/``16-mixed``): matmul outputs in 16 bits, the residual stream fp32.
    ``bfloat16``: everything in 16 bits (``bf16-true``, or FSDP2 with ``param_dtype: bfloat16``).
    """
    text = str(precision)
    if "true" in text and text.startswith(("bf16", "16")):
        return "bfloat16"
    if "mixed" in text:
        return "mixed"
    return "bfloat16" if fsdp_param_dtype == "bfloat16" else "float32"


def memory_estimate(
    decoder: Decoder,
    micro_batch: int,
    seq_len: int | None = None,
    *,
    mode: ActivationMode = "float32",
    activation_checkpointing: bool = False,
    loss_chunk_tokens: int | None = None,
    world_size: int = 1,
    sharded: bool = False,
) -> MemoryEstimate:
    """Per-GPU training memory of ``decoder`` at ``micro_batch`` x ``seq_len`` tokens per step.

    Model state (as :func:`optimizer_state_bytes`): fp32 master weights (4 bytes per parameter,
    frozen ones included), fp32 gradients and AdamW's two fp32 moments (4 + 8 bytes per trainable
    parameter); under FSDP (``sharded``) each divided by ``world_size``.

    Activations: what autograd saves per token, counted for this implementation (Korthikanti et
    al., 2022, "Reducing Activation Recomputation in Large Transformer Models", counted the same
    way for a GPT block; here a Llama block, no dropout, SDPA flash attention so no T^2 term;
    checked against the bytes autograd saves on CPU in tests/test_memory.py).
    With p the bytes of a matmul output (4 for ``float32``, 2 otherwise), d the width, d_kv the
    key/value width, F the SwiGLU width and H the heads, one block saves per token

        16 d + 8                  two RMSNorms: fp32 input, fp32 normalised output, 1/rms each
      + p (5 d + 2 d_kv + 4 F)    attention and MLP inputs, rotated q and k, v, attention output
                                  and its [B, T, d] copy for o_proj (a view with kernels that
                                  return that layout), gate, up, silu(gate), silu(gate) x up
      + 3 p d                     only under autocast (``mixed``): q/k/v and gate/up each cast
                                  their shared input to 16 bits separately
      + 4 H                       attention's fp32 log-sum-exp per head

    plus 8 d + 12 outside the blocks (the final norm; the int64 ids a learned table keeps), times
    ``micro_batch x seq_len`` tokens and the layers. For the paper's block (d 2048, F 8192, H 32)
    under ``mixed`` that is 136 KiB per token per layer.
    With checkpointing per block only each block's input is kept (r d per token and layer,
    r = 2 under ``bfloat16``, else the fp32 residual stream's 4) and one block is recomputed at a
    time: L r d + (one block's activations) per token.

    Loss: the full path holds up to three fp32 ``[tokens, V]`` tensors at once (log-softmax,
    its gradient and the logits' gradient): 12 V bytes per token. The chunked path
    (:mod:`fixed_embed.loss`) holds one fp32 ``[chunk, V]`` buffer (plus its p-byte copy when
    p = 2), the hidden states' gradient (p d per token) and an fp32 ``[V, d]`` accumulator of the
    head's gradient (plus a p-byte copy when p = 2). Without ``loss_chunk_tokens`` the chunked row
    is for the default chunk (:data:`fixed_embed.loss.DEFAULT_LOSS_CHUNK_TOKENS`).

    Left out: FSDP's transient all-gathered parameters (one block and the head in the compute
    dtype), autocast's cached 16-bit weight copies, gradients of activations during backward
    (about one block's worth), the allocator's fragmentation, CUDA context and workspaces.
    """
    config = decoder.config
    t = seq_len or config.max_seq_len
    tokens = micro_batch * t
    d, f, h, layers, v = config.d_model, config.ffn_dim, config.n_heads, config.n_layers, config.vocab_size
    d_kv = config.kv_heads * config.head_dim
    p = 4 if mode == "float32" else 2
    residual = 2 if mode == "bfloat16" else 4
    per_block = 16 * d + 8 + p * (5 * d + 2 * d_kv + 4 * f) + (3 * p * d if mode == "mixed" else 0) + 4 * h
    final_norm = 8 * d + 12
    shards = world_size if sharded else 1
    total, trainable = _count(decoder), _count(decoder, trainable=True)
    chunk = min(loss_chunk_tokens or DEFAULT_LOSS_CHUNK_TOKENS, tokens)
    chunk_bytes = chunk * v * (4 + (p if p < 4 else 0)) + tokens * d * p + v * d * (4 + (p if p < 4 else 0))
    return MemoryEstimate(
        weights=-(-4 * total // shards),
        gradients=-(-4 * trainable // shards),
        optimizer=-(-8 * trainable // shards),
        activations=tokens * (layers * per_block + final_norm),
        activations_checkpointed=tokens * (layers * residual * d + per_block + final_norm),
        logits_full=tokens * 12 * v,
        logits_chunked=chunk_bytes,
        activation_checkpointing=activation_checkpointing,
        loss_chunk_tokens=loss_chunk_tokens,
        micro_batch=micro_batch,
        seq_len=t,
        world_size=world_size,
        sharded=sharded,
        mode=mode,
    )


def model_memory_estimate(
    model: Any, micro_batch: int, seq_len: int | None, *, precision: Any, world_size: int, sharded: bool
) -> MemoryEstimate:
    """:func:`memory_estimate` for a ``LanguageModel``: its decoder and its own settings (activation
    checkpointing, loss chunking, FSDP2's ``param_dtype``), at a run's micro-batch x ``seq_len``,
    Lightning ``precision``, world size and sharding.

    The one place a model's settings become :func:`memory_estimate` arguments, whether the run is
    a ``Trainer`` about to fit (:func:`training_memory_estimate`, fit's start warning) or an
    experiment config (``fixed_embed.experiment.training_memory``, ``fixed-embed params``), so
    the two cannot estimate the same run differently.
    """
    parallel = model.parallel_config
    return memory_estimate(
        model.decoder,
        micro_batch,
        seq_len,
        mode=activation_mode(precision, parallel.param_dtype if sharded else None),
        activation_checkpointing=parallel.activation_checkpointing,
        loss_chunk_tokens=model.loss_chunk_tokens,
        world_size=world_size,
        sharded=sharded,
    )


def training_memory_estimate(model: Any, trainer: Any) -> MemoryEstimate | None:
    """:func:`model_memory_estimate` for a ``LanguageModel`` about to be fitted by ``trainer`` (None
    without a datamodule giving ``batch_size``)."""
    datamodule = getattr(trainer, "datamodule", None)
    micro_batch = getattr(datamodule, "batch_size", None)
    if not isinstance(micro_batch, int):
        return None
    seq_len = getattr(datamodule, "seq_len", None) or model.decoder.config.max_seq_len
    from lightning.pytorch.strategies import FSDPStrategy, ModelParallelStrategy

    sharded = isinstance(trainer.strategy, (FSDPStrategy, ModelParallelStrategy))
    return model_memory_estimate(
        model, micro_batch, seq_len, precision=trainer.precision, world_size=trainer.world_size, sharded=sharded
    )


def memory_warning(model: Any, trainer: Any, device_bytes: int | None = None) -> str | None:
    """A warning if the estimated per-GPU training memory exceeds the device's, else None.

    ``device_bytes`` defaults to the total memory of ``trainer.strategy.root_device`` when it is a
    CUDA device; on other devices (CPU) there is nothing to compare with and the answer is None.
    """
    if device_bytes is None:
        device = trainer.strategy.root_device
        if device.type != "cuda":
            return None
        device_bytes = torch.cuda.get_device_properties(device).total_memory
    estimate = training_memory_estimate(model, trainer)
    if estimate is None or estimate.total <= device_bytes:
        return None
    acts = estimate.activations_checkpointed if estimate.activation_checkpointing else estimate.activations
    logits = estimate.logits_chunked if estimate.loss_chunk_tokens else estimate.logits_full
    hints = []
    if not estimate.activation_checkpointing:
        hints.append("--model.parallel.activation_checkpointing true")
    if not estimate.loss_chunk_tokens:
        hints.append(f"--model.loss_chunk_tokens {DEFAULT_LOSS_CHUNK_TOKENS}")
    if not estimate.sharded and estimate.world_size > 1:
        hints.append("--config experiments/strategies/fsdp.yaml")
    hints.append("a smaller data.batch_size with more trainer.accumulate_grad_batches")
    return (
        f"estimated training memory {estimate.total / _GIB:.1f} GiB per device exceeds the device's "
        f"{device_bytes / _GIB:.1f} GiB (model state {estimate.model_state / _GIB:.1f} GiB, activations "
        f"{acts / _GIB:.1f} GiB, loss {logits / _GIB:.1f} GiB at micro-batch {estimate.micro_batch} x "
        f"{estimate.seq_len} tokens, {estimate.mode}); consider " + ", ".join(hints)
    )
