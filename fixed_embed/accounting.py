"""Parameter, FLOP and memory accounting: what each part of a model costs.

Built to run on the meta device, so the paper's 1.7B model is counted in seconds
without allocating a weight. :func:`memory_estimate` gives the per-GPU training memory
(weights, gradients, AdamW state, activations with and without checkpointing, the loss's
logits) and :func:`memory_warning` compares it with the device's memory at fit start.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch import nn

from fixed_embed.loss import DEFAULT_LOSS_CHUNK_TOKENS
from fixed_embed.model import Decoder

__all__ = [
    "GPU_KINDS",
    "FitOption",
    "MemoryEstimate",
    "ModuleCost",
    "ParameterReport",
    "activation_mode",
    "cheapest_fit",
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
#: The allocator's fragmentation, as a share of the allocated peak (reserved - allocated; typically
#: 2-10 % for a transformer's steady training step).
FRAGMENTATION = 0.05
#: CUDA context (~0.5 GiB on H100), cuBLAS/cuDNN workspaces and attention kernels' scratch.
CUDA_CONTEXT_BYTES = 1 * _GIB
#: NCCL's communicator buffers and channels, with more than one rank.
NCCL_BYTES = 1 * _GIB
#: The share of device memory an estimate may use: the rest is the margin for the estimate's error.
USABLE_FRACTION = 0.90
#: GPU kinds ``fixed-embed params`` plans for: the memory torch.cuda reports on each (approximate).
GPU_KINDS: dict[str, int] = {
    "A100-40": int(39.4 * _GIB),
    "A100-80": int(79.2 * _GIB),
    "H100-80": int(79.1 * _GIB),
    "H200-141": int(139.8 * _GIB),
}


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
    # What the tensors above leave out (see memory_estimate): counted in `allocated` and `required`.
    autocast_weights: int = 0  # autocast's 16-bit copies of the matmul weights, saved for backward
    backward_transient: int = 0  # gradients of one block's activations while backward runs through it
    fsdp_gathered: int = 0  # FSDP2: unsharded parameters (root, head, 2 blocks) and 2 blocks' gradients
    unsharded_gradients: int = 0  # FSDP2 accumulating without reduce-scatter: the full gradients
    accumulate: int = 1

    @property
    def model_state(self) -> int:
        return self.weights + self.gradients + self.optimizer

    @property
    def allocated(self) -> int:
        """The peak of live tensors: what ``torch.cuda.max_memory_allocated`` measures."""
        extra = self.autocast_weights + self.backward_transient + self.fsdp_gathered + self.unsharded_gradients
        return self.total + extra

    @property
    def fragmentation(self) -> int:
        """The caching allocator's reserved-but-unused memory: FRAGMENTATION of the allocated peak."""
        return int(FRAGMENTATION * self.allocated)

    @property
    def device_overhead(self) -> int:
        """CUDA context and library workspaces, plus NCCL's buffers with more than one rank."""
        return CUDA_CONTEXT_BYTES + (NCCL_BYTES if self.world_size > 1 else 0)

    @property
    def required(self) -> int:
        """Device memory the run needs: allocated + fragmentation + context and NCCL."""
        return self.allocated + self.fragmentation + self.device_overhead

    @property
    def step_growth(self) -> int:
        """What one forward + backward adds over the built model (gradients, activations, loss,
        transients): the part ``benchmarks/memory.py`` measures on CPU."""
        return self.allocated - self.weights - self.optimizer

    def fits(self, device_bytes: int) -> bool:
        """Whether :attr:`required` stays within USABLE_FRACTION of ``device_bytes`` (the margin)."""
        return self.required <= USABLE_FRACTION * device_bytes

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
            ("autocast: 16-bit weight copies saved for backward", self.autocast_weights),
            ("backward: gradients of one block's activations", self.backward_transient),
            ("FSDP2: gathered parameters (root, head, 2 blocks) + 2 blocks' gradients", self.fsdp_gathered),
            (f"FSDP2: unsharded gradients, accumulating {self.accumulate} micro-batches", self.unsharded_gradients),
            ("allocated peak (live tensors: torch.cuda.max_memory_allocated)", self.allocated),
            (f"allocator fragmentation ({100 * FRAGMENTATION:.0f} % of allocated)", self.fragmentation),
            ("CUDA context and workspaces" + (", NCCL buffers" if self.world_size > 1 else ""), self.device_overhead),
            (f"required per GPU (fits when <= {100 * USABLE_FRACTION:.0f} % of the device)", self.required),
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
    param_dtype: str | None = None,
    reduce_dtype: str = "float32",
    accumulate: int = 1,
    sync_every_micro_batch: bool = False,
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

    ``total`` is the sum above (the tensors autograd and the optimizer hold). ``allocated`` adds
    what the first formulas left out, the peak ``torch.cuda.max_memory_allocated`` sees:

    - autocast (``mixed``, unless FSDP2 already gathers 16-bit parameters): its 16-bit copy of every
      matmul weight, saved for backward (2 bytes per matmul parameter; with checkpointing they are
      the autocast cache at the end of forward, the same bytes);
    - backward: the gradients of one block's activations while backward runs through it (one
      block's activations again);
    - FSDP2 (``sharded``): the unsharded parameters in the compute dtype (``param_dtype``) of the
      root (the input interface, kept from forward to backward), the head and final norm (kept),
      and two blocks (the one running and the one prefetched), plus two blocks' unsharded
      gradients before their reduce-scatter; with ``accumulate`` > 1 and the reduce-scatter on
      the last micro-batch only (not ``sync_every_micro_batch``), the whole model's unsharded
      gradients in ``reduce_dtype``.

    ``required`` adds the allocator's fragmentation (:data:`FRAGMENTATION` of ``allocated``), the
    CUDA context (:data:`CUDA_CONTEXT_BYTES`) and NCCL's buffers (:data:`NCCL_BYTES`, with more
    than one rank); :meth:`MemoryEstimate.fits` compares it with :data:`USABLE_FRACTION` of the
    device, the rest being the margin for this estimate's own error. Calibrated on CPU against
    measured peaks of one step (``benchmarks/memory.py --calibrate``, docs/benchmarks.md).
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
    gathered_16bit = sharded and param_dtype == "bfloat16"
    matmul = sum({id(m.weight): m.weight.numel() for m in decoder.modules() if isinstance(m, nn.Linear)}.values())
    autocast_weights = 2 * matmul if mode == "mixed" and not gathered_16bit else 0
    fsdp_gathered = unsharded_gradients = 0
    if sharded:
        g = 2 if gathered_16bit or mode == "bfloat16" else 4
        block = _count(decoder.layers[0]) if layers else 0
        root = _count(decoder.interface)
        head = 0 if config.tie_embeddings else _count(decoder.head)
        fsdp_gathered = g * (root + head + _count(decoder.norm) + 2 * block) + g * 2 * block
        if accumulate > 1 and not sync_every_micro_batch:
            unsharded_gradients = (4 if reduce_dtype == "float32" else 2) * trainable
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
        autocast_weights=autocast_weights,
        backward_transient=tokens * per_block,
        fsdp_gathered=fsdp_gathered,
        unsharded_gradients=unsharded_gradients,
        accumulate=accumulate,
    )


def model_memory_estimate(
    model: Any,
    micro_batch: int,
    seq_len: int | None,
    *,
    precision: Any,
    world_size: int,
    sharded: bool,
    accumulate: int = 1,
    activation_checkpointing: bool | None = None,
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
    if activation_checkpointing is None:
        activation_checkpointing = parallel.activation_checkpointing
    return memory_estimate(
        model.decoder,
        micro_batch,
        seq_len,
        mode=activation_mode(precision, parallel.param_dtype if sharded else None),
        activation_checkpointing=activation_checkpointing,
        loss_chunk_tokens=model.loss_chunk_tokens,
        world_size=world_size,
        sharded=sharded,
        param_dtype=parallel.param_dtype if sharded else None,
        reduce_dtype=parallel.reduce_dtype,
        accumulate=accumulate,
        sync_every_micro_batch=parallel.sync_every_micro_batch,
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
        model,
        micro_batch,
        seq_len,
        precision=trainer.precision,
        world_size=trainer.world_size,
        sharded=sharded,
        accumulate=getattr(trainer, "accumulate_grad_batches", 1),
    )


#: Environment variable that turns fit's refusal into a warning (the estimate may be wrong for a new setup).
IGNORE_MEMORY_ENV = "FIXED_EMBED_IGNORE_MEMORY_ESTIMATE"
#: The stated relative cost of each way out, for choosing the cheapest: activation checkpointing
#: recomputes each block's forward (~1/3 more compute); FSDP2 adds all-gathers (a few % on NVLink);
#: each halving of the micro-batch (accumulation doubled, same tokens per update) a few % of speed.
_COSTS = {"ac": 1.33, "fsdp": 1.05, "halving": 1.03}


@dataclass(frozen=True)
class FitOption:
    """A way to run within a device's memory: its command-line change, its estimate and its stated cost."""

    flags: str
    estimate: MemoryEstimate
    cost: float


def cheapest_fit(
    model: Any,
    micro_batch: int,
    seq_len: int | None,
    *,
    precision: Any,
    world_size: int,
    sharded: bool,
    accumulate: int,
    device_bytes: int,
) -> FitOption | None:
    """The cheapest change (by :data:`_COSTS`) that makes the run fit ``device_bytes``: activation
    checkpointing, FSDP2 (``experiments/strategies/fsdp.yaml``, with more than one GPU), a smaller
    micro-batch with more accumulation (same tokens per update), or a combination; None if none fits.
    An option with no flags means the run fits as configured."""
    configured_ac = bool(model.parallel_config.activation_checkpointing)
    options = []
    for shard in sorted({sharded, sharded or world_size > 1}):
        for ac in sorted({configured_ac, True}):
            for mb in sorted({micro_batch >> i for i in range(micro_batch.bit_length())} - {0}, reverse=True):
                if micro_batch % mb:
                    continue
                est = model_memory_estimate(
                    model, mb, seq_len, precision=precision if shard == sharded else "32-true",
                    world_size=world_size, sharded=shard, accumulate=accumulate * micro_batch // mb,
                    activation_checkpointing=ac,
                )  # fmt: skip
                if not est.fits(device_bytes):
                    continue
                halvings = round(math.log2(micro_batch / mb))
                cost = (_COSTS["ac"] if ac and not configured_ac else 1.0) * (
                    _COSTS["fsdp"] if shard and not sharded else 1.0) * _COSTS["halving"] ** halvings  # fmt: skip
                flags = []
                if shard and not sharded:
                    flags.append("--config experiments/strategies/fsdp.yaml")
                if ac and not configured_ac:
                    flags.append("--model.parallel.activation_checkpointing true")
                if mb != micro_batch:
                    flags.append(
                        f"--data.batch_size {mb} --trainer.accumulate_grad_batches {accumulate * micro_batch // mb}"
                    )
                options.append(FitOption(" ".join(flags), est, cost))
    return min(options, key=lambda o: (o.cost, o.estimate.required), default=None)


def memory_warning(model: Any, trainer: Any, device_bytes: int | None = None) -> str | None:
    """Why the run does not fit the device, and the cheapest way out; None when it fits.

    The estimate's :attr:`MemoryEstimate.required` is compared with :data:`USABLE_FRACTION` of
    ``device_bytes``, by default the total memory of ``trainer.strategy.root_device`` when it is a
    CUDA device; on other devices (CPU) there is nothing to compare with and the answer is None.
    ``fit`` refuses to start on this message (``LanguageModel.setup``) unless
    ``FIXED_EMBED_IGNORE_MEMORY_ESTIMATE=1``.
    """
    if device_bytes is None:
        device = trainer.strategy.root_device
        if device.type != "cuda":
            return None
        device_bytes = torch.cuda.get_device_properties(device).total_memory
    estimate = training_memory_estimate(model, trainer)
    if estimate is None or estimate.fits(device_bytes):
        return None
    acts = estimate.activations_checkpointed if estimate.activation_checkpointing else estimate.activations
    logits = estimate.logits_chunked if estimate.loss_chunk_tokens else estimate.logits_full
    hints = []
    option = cheapest_fit(
        model, estimate.micro_batch, estimate.seq_len, precision=trainer.precision, world_size=estimate.world_size,
        sharded=estimate.sharded, accumulate=estimate.accumulate, device_bytes=device_bytes,
    )  # fmt: skip
    if option is not None:
        hints.append(f"{option.flags} (estimated {option.estimate.required / _GIB:.1f} GiB)")
    if not estimate.activation_checkpointing:
        hints.append("--model.parallel.activation_checkpointing true")
    if not estimate.loss_chunk_tokens:
        hints.append(f"--model.loss_chunk_tokens {DEFAULT_LOSS_CHUNK_TOKENS}")
    if not estimate.sharded and estimate.world_size > 1:
        hints.append("--config experiments/strategies/fsdp.yaml")
    hints.append("a smaller data.batch_size with more trainer.accumulate_grad_batches")
    return (
        f"estimated training memory {estimate.required / _GIB:.1f} GiB per device exceeds "
        f"{100 * USABLE_FRACTION:.0f} % of the device's {device_bytes / _GIB:.1f} GiB (allocated peak "
        f"{estimate.allocated / _GIB:.1f} GiB: model state {estimate.model_state / _GIB:.1f} GiB, activations "
        f"{acts / _GIB:.1f} GiB, loss {logits / _GIB:.1f} GiB at micro-batch {estimate.micro_batch} x "
        f"{estimate.seq_len} tokens, {estimate.mode}; `fixed-embed params CONFIG` itemises it); "
        f"cheapest way out first: " + "; ".join(dict.fromkeys(hints)) + f". To start anyway: {IGNORE_MEMORY_ENV}=1"
    )
