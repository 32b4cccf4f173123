"""How the decoder is made to run fast and fit: activation checkpointing, compile, FSDP2 -- in that order.

One place fixes the order of wrapping (as in torchtitan), applied once from
``LanguageModel.configure_model``:

1. **Activation checkpointing** per block (``Decoder.activation_checkpointing``): each block's
   forward is recomputed in backward; the block itself is not wrapped, so parameter names and
   checkpoints do not change.
2. **Regional compile**: ``block.compile()`` compiles each block's forward *in place* -- one graph
   reused by all identical blocks, much faster to compile than the whole model, and again no
   ``_orig_mod.`` prefix in the state dict. Off by default (CPU runs gain nothing).
3. **FSDP2** (``fully_shard``) under Lightning's ``ModelParallelStrategy``: each block, then the
   head with the final norm, then the root (the input interface and whatever is left), sharded
   over the data-parallel mesh, with bf16 parameters for compute and fp32 master weights and
   gradient reduction (``MixedPrecisionPolicy``). Under DDP only steps 1 and 2 apply.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

from fixed_embed.model import Decoder

__all__ = ["ParallelConfig", "apply_parallelism"]

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


@dataclass
class ParallelConfig:
    """Args:
    activation_checkpointing: recompute each block's activations in backward (memory for compute).
    compile: ``torch.compile`` each block (regional).
    param_dtype: FSDP2 compute dtype of parameters (the fp32 master copy is what is sharded).
    reduce_dtype: FSDP2 dtype of the gradient reduce-scatter.
    reshard_after_forward: FSDP2 frees the gathered parameters after forward (ZeRO-3) or keeps them
        until backward (ZeRO-2-like: more memory, one all-gather fewer).
    """

    activation_checkpointing: bool = False
    compile: bool = False
    param_dtype: Literal["float32", "bfloat16"] = "bfloat16"
    reduce_dtype: Literal["float32", "bfloat16"] = "float32"
    reshard_after_forward: bool = True

    def __post_init__(self) -> None:
        for name in ("param_dtype", "reduce_dtype"):
            if getattr(self, name) not in _DTYPES:
                raise ValueError(f"{name} must be one of {sorted(_DTYPES)}, got {getattr(self, name)!r}")


def apply_parallelism(decoder: Decoder, config: ParallelConfig, device_mesh=None) -> None:
    """Apply checkpointing, compile and (with a ``device_mesh``) FSDP2 to ``decoder``, in place."""
    decoder.activation_checkpointing = config.activation_checkpointing
    if config.compile:
        for block in decoder.layers:
            block.compile()
    if device_mesh is None:
        return
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    mesh = device_mesh["data_parallel"] if "data_parallel" in (device_mesh.mesh_dim_names or ()) else device_mesh
    policy = MixedPrecisionPolicy(param_dtype=_DTYPES[config.param_dtype], reduce_dtype=_DTYPES[config.reduce_dtype])
    shard = {"mesh": mesh, "mp_policy": policy}
    for block in decoder.layers:
        fully_shard(block, reshard_after_forward=config.reshard_after_forward, **shard)
    # The head is used last in forward and first in backward: no point resharding it in between.
    fully_shard([decoder.norm, decoder.head], reshard_after_forward=False, **shard)
    fully_shard(decoder, reshard_after_forward=config.reshard_after_forward, **shard)
