"""Per-GPU training memory: the estimate, whether it fits, the cheapest fix, fit's refusal
(docs/design.md#memory)."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, replace
from typing import Any, Literal

import torch
from lightning.pytorch.utilities import rank_zero_warn
from torch import nn

from fixed_embed.distributed.fsdp import shards_parameters
from fixed_embed.errors import ConfigError
from fixed_embed.model.accounting import parameter_count
from fixed_embed.model.decoder import DecoderConfig
from fixed_embed.model.loss import DEFAULT_LOSS_CHUNK_TOKENS

ActivationMode = Literal["float32", "mixed", "bfloat16"]
_GIB = 2**30
FRAGMENTATION = 0.05  # the allocator's, as a share of the allocated peak (typically 2-10 %)
# CUDA context (~0.5 GiB on H100), cuBLAS/cuDNN workspaces, kernels' scratch
CUDA_CONTEXT_BYTES = 1 * _GIB
NCCL_BYTES = 1 * _GIB  # NCCL's buffers and channels, with more than one rank
USABLE_FRACTION = 0.90  # of device memory an estimate may use: the rest is the margin for its error
_GPU_GIB = {"A100-40": 39.4, "A100-80": 79.2, "H100-80": 79.1, "H200-141": 139.8}
#: GPU kinds ``fixed-embed params`` plans for: the memory torch.cuda reports on each (approximate).
GPU_KINDS = {kind: int(gib * _GIB) for kind, gib in _GPU_GIB.items()}
IGNORE_MEMORY_ENV = "FIXED_EMBED_IGNORE_MEMORY_ESTIMATE"
#: Stated relative costs of the ways out: AC recomputes each forward (~1/3), FSDP2 all-gathers,
#: each halving.
_COSTS = {"ac": 1.33, "fsdp": 1.05, "halving": 1.03}


def optimizer_state_bytes(n_trainable: int) -> int:
    """Bytes trainable parameters cost in training: fp32 weights + gradients + AdamW's two
    moments."""
    return 16 * n_trainable


@dataclass(frozen=True)
class RunShape:
    """What a run's memory depends on besides the model (``seq_len`` None: the model's context)."""

    micro_batch: int
    seq_len: int | None = None
    precision: Any = "32-true"
    world_size: int = 1
    sharded: bool = False
    accumulate: int = 1

    @classmethod
    def of(cls, trainer: Any) -> RunShape | None:
        """The shape of what ``trainer`` is about to fit (None without a datamodule giving
        ``batch_size``)."""
        datamodule = getattr(trainer, "datamodule", None)
        micro_batch = getattr(datamodule, "batch_size", None)
        if not isinstance(micro_batch, int):
            return None
        seq_len, sharded = getattr(datamodule, "seq_len", None), shards_parameters(trainer.strategy)
        accumulate = getattr(trainer, "accumulate_grad_batches", 1)
        return cls(micro_batch, seq_len, trainer.precision, trainer.world_size, sharded, accumulate)


@dataclass(frozen=True)
class MemoryEstimate:
    """Per-GPU training memory in bytes; activations and logits are per micro-batch."""

    weights: int
    gradients: int
    optimizer: int
    activations: int  # saved for backward, without activation checkpointing
    activations_checkpointed: int  # with checkpointing per block
    logits_full: int  # the loss's peak from the full fp32 logits (loss_chunk_tokens 0)
    logits_chunked: int  # the loss's peak, chunked (loss_chunk_tokens)
    activation_checkpointing: bool
    loss_chunk_tokens: int | None
    run: RunShape  # its seq_len the context estimated for
    mode: ActivationMode
    # What `total` leaves out and `allocated` counts:
    autocast_weights: int  # autocast's 16-bit copies of the matmul weights, saved for backward
    backward_transient: int  # gradients of one block's activations while backward runs through it
    recomputed_block: int  # one block's activations, recomputed in its backward under checkpointing
    # FSDP2: unsharded parameters (root, head, 2 blocks) and, syncing, 2 blocks' gradients
    fsdp_gathered: int
    unsharded_gradients: int  # FSDP2 accumulating without reduce-scatter: the full gradients

    @property
    def model_state(self) -> int:
        return self.weights + self.gradients + self.optimizer

    @property
    def saved_activations(self) -> int:
        return self.activations_checkpointed if self.activation_checkpointing else self.activations

    @property
    def loss(self) -> int:
        return self.logits_chunked if self.loss_chunk_tokens else self.logits_full

    @property
    def total(self) -> int:
        """The tensors autograd and the optimizer hold for the configured run."""
        return self.model_state + self.saved_activations + self.loss

    @property
    def allocated(self) -> int:
        """The peak of live tensors (``max_memory_allocated``): at the loss or in a block's
        backward, as traced."""
        ac = self.activation_checkpointing
        at_loss = self.loss + self.autocast_weights - (self.recomputed_block if ac else 0)
        in_backward = self.backward_transient + (0 if ac else self.autocast_weights)
        # accumulating under FSDP2 without reduce-scatter, the unsharded gradients replace them
        gradients = self.unsharded_gradients or self.gradients
        state = self.weights + gradients + self.optimizer + self.fsdp_gathered
        return state + self.saved_activations + max(at_loss, in_backward)

    @property
    def fragmentation(self) -> int:
        return int(FRAGMENTATION * self.allocated)

    @property
    def device_overhead(self) -> int:
        return CUDA_CONTEXT_BYTES + (NCCL_BYTES if self.run.world_size > 1 else 0)

    @property
    def required(self) -> int:
        """Device memory the run needs: allocated + fragmentation + context and NCCL."""
        return self.allocated + self.fragmentation + self.device_overhead

    def fits(self, device_bytes: int) -> bool:
        return self.required <= USABLE_FRACTION * device_bytes

    def rows(self) -> list[tuple[str, int]]:
        """(label, bytes); ``*`` marks the alternatives the configuration uses, which ``total``
        adds up."""
        world, sharded = self.run.world_size, self.run.sharded
        shard = f" / {world} (FSDP)" if sharded and world > 1 else ""
        ac, chunked = self.activation_checkpointing, bool(self.loss_chunk_tokens)
        chunk = self.loss_chunk_tokens or DEFAULT_LOSS_CHUNK_TOKENS
        synced = "" if self.unsharded_gradients else " + 2 blocks' gradients"
        return [
            (f"weights (fp32 master){shard}", self.weights),
            (f"gradients (fp32){shard}", self.gradients),
            (f"optimizer (AdamW fp32 moments){shard}", self.optimizer),
            (f"activations ({self.mode}), no checkpointing{'' if ac else ' *'}", self.activations),
            (
                f"activations ({self.mode}), checkpointing per block{' *' if ac else ''}",
                self.activations_checkpointed,
            ),
            (f"loss: full fp32 logits{'' if chunked else ' *'}", self.logits_full),
            (f"loss: chunked, {chunk} tokens{' *' if chunked else ''}", self.logits_chunked),
            ("total (weights, gradients, optimizer and the rows marked *)", self.total),
            ("autocast: 16-bit weight copies saved for backward", self.autocast_weights),
            ("backward: gradients of one block's activations", self.backward_transient),
            (f"FSDP2: gathered parameters (root, head, 2 blocks){synced}", self.fsdp_gathered),
            (
                f"FSDP2: unsharded gradients, accumulating {self.run.accumulate} micro-batches",
                self.unsharded_gradients,
            ),
            ("allocated peak (live tensors: torch.cuda.max_memory_allocated)", self.allocated),
            (
                f"allocator fragmentation ({100 * FRAGMENTATION:.0f} % of allocated)",
                self.fragmentation,
            ),
            (
                "CUDA context and workspaces" + (", NCCL buffers" if world > 1 else ""),
                self.device_overhead,
            ),
            (
                f"required per GPU (fits when <= {100 * USABLE_FRACTION:.0f} % of the device)",
                self.required,
            ),
        ]


def activation_mode(precision: Any, fsdp_param_dtype: str | None = None) -> ActivationMode:
    """How activations are stored, by ``precision`` and FSDP2's ``param_dtype``: mixed
    (autocast), bfloat16, float32."""
    text = str(precision)
    if "true" in text and text.startswith(("bf16", "16")):
        return "bfloat16"
    if "mixed" in text:
        return "mixed"
    return "bfloat16" if fsdp_param_dtype == "bfloat16" else "float32"


def memory_estimate(
    model: Any, run: RunShape, activation_checkpointing: bool | None = None
) -> MemoryEstimate:
    """Per-GPU training memory of a ``LanguageModel`` at ``run``, with its own settings
    (activation checkpointing unless given; docs/design.md#memory)."""
    decoder, parallel, chunk = model.decoder, model.parallel_config, model.loss_chunk_tokens
    config, param_dtype = decoder.config, parallel.param_dtype if run.sharded else None
    mode = activation_mode(run.precision, param_dtype)
    run = replace(run, seq_len=run.seq_len or config.max_seq_len)
    tokens = run.micro_batch * run.seq_len
    d, v, p = config.d_model, config.vocab_size, 4 if mode == "float32" else 2
    # HSDP: sharded in groups
    shards = min(parallel.shard_group_size or run.world_size, run.world_size) if run.sharded else 1
    total, trainable = parameter_count(decoder), parameter_count(decoder, trainable=True)
    copy = p if p < 4 else 0  # the 16-bit copy of an fp32 buffer
    fsdp_gathered = unsharded_gradients = 0
    if run.sharded:
        if run.accumulate > 1 and not parallel.sync_every_micro_batch:
            unsharded_gradients = (4 if parallel.reduce_dtype == "float32" else 2) * trainable
        g = 2 if param_dtype == "bfloat16" or mode == "bfloat16" else 4
        # unsharded at once: the root's parameters, the head's and 4 blocks' (2 accumulating)
        apart = config.n_layers - (2 if unsharded_gradients else 4)
        fsdp_gathered = g * (total - apart * parameter_count(decoder.layers[0]))
    matmul_weights = sum(m.weight.numel() for m in decoder.modules() if isinstance(m, nn.Linear))
    return MemoryEstimate(
        weights=-(-4 * total // shards),
        gradients=-(-4 * trainable // shards),
        optimizer=-(-8 * trainable // shards),
        **_activation_bytes(config, tokens, mode),
        logits_full=tokens * 12 * v,
        logits_chunked=min(chunk or DEFAULT_LOSS_CHUNK_TOKENS, tokens) * v * (4 + copy)
        + tokens * d * p
        + v * d * (4 + copy),
        activation_checkpointing=parallel.activation_checkpointing
        if activation_checkpointing is None
        else activation_checkpointing,
        loss_chunk_tokens=chunk,
        run=run,
        mode=mode,
        # a 16-bit param_dtype (sharded) gathers the copies autocast would make
        autocast_weights=2 * matmul_weights if mode == "mixed" and param_dtype != "bfloat16" else 0,
        fsdp_gathered=fsdp_gathered,
        unsharded_gradients=unsharded_gradients,
    )


def _activation_bytes(config: DecoderConfig, tokens: int, mode: ActivationMode) -> dict[str, int]:
    """What autograd saves for backward over ``tokens``, without and with checkpointing per
    block, and a block's backward adds."""
    d, f, p = config.d_model, config.ffn_dim, 4 if mode == "float32" else 2
    per_block = (
        16 * d
        + 8
        + p * (5 * d + 2 * config.kv_heads * config.head_dim + 4 * f)
        + (3 * p * d if mode == "mixed" else 0)
        + 4 * config.n_heads
    )
    final_norm = 8 * d + 12
    residual = 2 if mode == "bfloat16" else 4
    return {
        "activations": tokens * (config.n_layers * per_block + final_norm),
        "activations_checkpointed": tokens
        * (config.n_layers * residual * d + per_block + final_norm),
        # the gradients of gate, up and their product (p F each) and of two [B, T, d] (traced at
        # the paper's shape)
        "backward_transient": tokens * p * (3 * f + 2 * d),
        "recomputed_block": tokens * per_block,
    }


@dataclass(frozen=True)
class FitOption:
    """A way to run within a device's memory: its command-line change, its estimate and its
    stated cost."""

    flags: str
    estimate: MemoryEstimate
    cost: float


def cheapest_fit(model: Any, run: RunShape, device_bytes: int) -> FitOption | None:
    """The cheapest change (by :data:`_COSTS`) making ``run`` fit ``device_bytes``, or None; no
    flags: fits as is."""
    micro_batch, configured_ac = run.micro_batch, model.parallel_config.activation_checkpointing
    options = []
    for shard in sorted({run.sharded, run.sharded or run.world_size > 1}):
        for ac in sorted({configured_ac, True}):
            for mb in sorted(
                {micro_batch >> i for i in range(micro_batch.bit_length())}, reverse=True
            ):
                if micro_batch % mb:
                    continue
                more = run.accumulate * micro_batch // mb
                # FSDP2: fsdp.yaml's, with param_dtype
                precision = run.precision if shard == run.sharded else "32-true"
                changed = replace(
                    run, micro_batch=mb, precision=precision, sharded=shard, accumulate=more
                )
                est = memory_estimate(model, changed, activation_checkpointing=ac)
                if not est.fits(device_bytes):
                    continue
                new_ac, new_shard = ac and not configured_ac, shard and not run.sharded
                flags = ["--config experiments/strategies/fsdp.yaml"] if new_shard else []
                flags += ["--model.parallel.activation_checkpointing true"] if new_ac else []
                if mb != micro_batch:
                    flags.append(f"--data.batch_size {mb} --trainer.accumulate_grad_batches {more}")
                cost = (_COSTS["ac"] if new_ac else 1) * (_COSTS["fsdp"] if new_shard else 1)
                cost *= _COSTS["halving"] ** round(math.log2(micro_batch / mb))
                options.append(FitOption(" ".join(flags), est, cost))
    return min(options, key=lambda o: (o.cost, o.estimate.required), default=None)


def memory_warning(model: Any, trainer: Any, device_bytes: int | None = None) -> str | None:
    """Why the run does not fit the device (default: the trainer's, if CUDA) and the way out;
    None if it fits."""
    if device_bytes is None:
        device = trainer.strategy.root_device
        if device.type != "cuda":
            return None
        device_bytes = torch.cuda.get_device_properties(device).total_memory
    if (run := RunShape.of(trainer)) is None or (estimate := memory_estimate(model, run)).fits(
        device_bytes
    ):
        return None
    hints = []
    if option := cheapest_fit(model, run, device_bytes):
        hints.append(f"{option.flags} (estimated {option.estimate.required / _GIB:.1f} GiB)")
    if not estimate.activation_checkpointing:
        hints.append("--model.parallel.activation_checkpointing true")
    if not estimate.loss_chunk_tokens:
        hints.append(f"--model.loss_chunk_tokens {DEFAULT_LOSS_CHUNK_TOKENS}")
    if not estimate.run.sharded and estimate.run.world_size > 1:
        hints.append("--config experiments/strategies/fsdp.yaml")
    hints.append("a smaller data.batch_size with more trainer.accumulate_grad_batches")
    return (
        f"estimated training memory {estimate.required / _GIB:.1f} GiB per device exceeds "
        f"{100 * USABLE_FRACTION:.0f} % of the device's {device_bytes / _GIB:.1f} GiB (allocated "
        f"peak {estimate.allocated / _GIB:.1f} GiB: model state {estimate.model_state / _GIB:.1f} "
        f"GiB, activations {estimate.saved_activations / _GIB:.1f} GiB, loss "
        f"{estimate.loss / _GIB:.1f} GiB at micro-batch {run.micro_batch} x {estimate.run.seq_len} "
        f"tokens, {estimate.mode}; `fixed-embed params CONFIG` itemises it); "
        f"cheapest way out first: {'; '.join(dict.fromkeys(hints))}. To start anyway: "
        f"{IGNORE_MEMORY_ENV}=1"
    )


def refuse_unless_it_fits(model: Any, trainer: Any) -> None:
    """Fit's start: refuse a run estimated not to fit its CUDA device, or only warn with
    :data:`IGNORE_MEMORY_ENV`."""
    if problem := memory_warning(model, trainer):
        if os.environ.get(IGNORE_MEMORY_ENV, "") not in ("", "0"):
            rank_zero_warn(f"{problem} (starting anyway: {IGNORE_MEMORY_ENV} is set)")
        else:
            raise ConfigError(f"refusing to start: {problem}")
