"""Activation checkpointing, compile and FSDP2 applied to the decoder (docs/design.md, "How
parallelism is built")."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

from fixed_embed.config import PositiveInt
from fixed_embed.errors import ConfigError
from fixed_embed.model.decoder import Decoder


@dataclass
class ParallelConfig:
    """Args:
    activation_checkpointing: recompute each block's activations in backward (memory for compute).
    compile: ``torch.compile`` each block (regional).
    param_dtype: FSDP2 compute dtype of parameters (the fp32 master copy is what is sharded).
    reduce_dtype: FSDP2 dtype of the gradient reduce-scatter.
    reshard_after_forward: FSDP2 frees gathered parameters after forward (ZeRO-3), else keeps
    them to backward. shard_group_size: FSDP2 hybrid sharding over groups of this many ranks
    (e.g. a node's); ``None``: all ranks. sync_every_micro_batch: FSDP2 reduce-scatters every
    micro-batch, not accumulating unsharded gradients to the last.
    """

    activation_checkpointing: bool = False
    compile: bool = False
    param_dtype: Literal["float32", "bfloat16"] = "bfloat16"
    reduce_dtype: Literal["float32", "bfloat16"] = "float32"
    reshard_after_forward: bool = True
    shard_group_size: PositiveInt | None = None
    sync_every_micro_batch: bool = False


def apply_parallelism(decoder: Decoder, config: ParallelConfig, device_mesh=None) -> None:
    """Apply checkpointing, compile and (with a ``device_mesh``) FSDP2 to ``decoder``, in place."""
    decoder.activation_checkpointing = config.activation_checkpointing
    if config.compile:
        for block in decoder.layers:
            block.compile()
    if device_mesh is None:
        return
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    if decoder.config.tie_embeddings:
        raise ConfigError(
            "tie_embeddings=true cannot be sharded with FSDP2: the tied weight would belong to two "
            "FSDP groups "
            "(the head's and the root's). Untie it (model.decoder.tie_embeddings false, the "
            "paper's setting) "
            "or train with DDP (--config experiments/strategies/ddp.yaml)"
        )
    mesh = (
        device_mesh["data_parallel"]
        if "data_parallel" in (device_mesh.mesh_dim_names or ())
        else device_mesh
    )
    group, world = config.shard_group_size, mesh.size()
    if (
        group is not None and group != world
    ):  # HSDP: shard within groups of `group` ranks, replicate across
        if world % group:
            raise ConfigError(
                f"model.parallel.shard_group_size {group} must divide the {world} data-parallel "
                "ranks"
            )
        from torch.distributed.device_mesh import init_device_mesh

        mesh = init_device_mesh(
            mesh.device_type, (world // group, group), mesh_dim_names=("replicate", "shard")
        )
    policy = MixedPrecisionPolicy(
        param_dtype=getattr(torch, config.param_dtype),
        reduce_dtype=getattr(torch, config.reduce_dtype),
    )
    shard = {"mesh": mesh, "mp_policy": policy}
    for block in decoder.layers:
        fully_shard(block, reshard_after_forward=config.reshard_after_forward, **shard)
    # The head is used last in forward and first in backward: no point resharding it in between.
    fully_shard([decoder.norm, decoder.head], reshard_after_forward=False, **shard)
    fully_shard(
        decoder, **shard
    )  # the root: torch's default keeps its parameters from forward to backward
