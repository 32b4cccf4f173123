"""L2 norms of whole tensors, whether each rank holds the full tensor (DDP) or a shard (FSDP2).

A sharded ``DTensor``'s norm is the square root of the sum over ranks of the local sums of squares
(not of per-shard norms); replicated tensors (plain ones under DDP, replicated DTensors) count once.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor


def global_sq_sums(groups: Mapping[str, Iterable[torch.Tensor]]) -> dict[str, torch.Tensor]:
    """For each named group of tensors, the fp32 sum of squares of all elements of the full tensors.

    One all-reduce in total (over the shards' process group) when any tensor is sharded, so every
    rank must call it with the same groups.
    """
    if not groups:
        return {}
    replicated, sharded, group, device = [], [], None, None
    for tensors in groups.values():
        rep, shd = [], []
        for t in tensors:
            device = device or t.device
            is_sharded = isinstance(t, DTensor) and any(p.is_shard() for p in t.placements)
            if is_sharded:
                if t.device_mesh.ndim != 1:
                    raise NotImplementedError(f"norms of tensors sharded on a {t.device_mesh.ndim}-D mesh")
                group = t.device_mesh.get_group()
            (shd if is_sharded else rep).append(t.to_local() if isinstance(t, DTensor) else t)
        replicated.append(_local_sq_sum(rep, device))
        sharded.append(_local_sq_sum(shd, device))
    shard_sums = torch.stack(sharded)
    if group is not None and dist.is_available() and dist.is_initialized():
        dist.all_reduce(shard_sums, group=group)
    totals = torch.stack(replicated) + shard_sums
    return dict(zip(groups, totals.unbind(), strict=True))


def _local_sq_sum(tensors: list[torch.Tensor], device: torch.device | None) -> torch.Tensor:
    tensors = [t for t in tensors if t.numel()]
    if not tensors:
        return torch.zeros((), dtype=torch.float32, device=device)
    # Fused per device and dtype (foreach kernels), not one reduction per tensor.
    return torch.nn.utils.get_total_norm(tensors).float().pow(2).to(device)
