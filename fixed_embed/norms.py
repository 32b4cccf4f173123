"""L2 norms of whole tensors, whether each rank holds the full tensor (DDP) or a shard (FSDP2).

Under FSDP2 a parameter (and its gradient) is a ``DTensor`` sharded across a 1-D device mesh:
the norm of the full tensor is the square root of the *sum over ranks of the local sums of
squares*. Lightning's gradient monitor refuses sharded strategies, and summing per-shard norms
(instead of squares) is a common mistake; this module is the one place that gets it right.
Replicated tensors (plain tensors under DDP, whose gradients are already averaged, or replicated
DTensors) are counted once, without a collective.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

__all__ = ["global_sq_sums"]


def global_sq_sums(groups: Mapping[str, Iterable[torch.Tensor]]) -> dict[str, torch.Tensor]:
    """For each named group of tensors, the fp32 sum of squares of all elements of the full tensors.

    One all-reduce in total (over the shards' process group) when any tensor is sharded, so every
    rank must call it with the same groups.
    """
    names = list(groups)
    replicated, sharded, group, device = [], [], None, None
    for name in names:
        rep, shd = [], []
        for t in groups[name]:
            device = device or t.device
            if isinstance(t, DTensor):
                is_sharded = any(p.is_shard() for p in t.placements)
                if is_sharded and t.device_mesh.ndim != 1:
                    raise NotImplementedError(f"norms of tensors sharded on a {t.device_mesh.ndim}-D mesh")
                if is_sharded:
                    group = t.device_mesh.get_group()
                (shd if is_sharded else rep).append(t.to_local())
            else:
                rep.append(t)
        replicated.append(_local_sq_sum(rep, device))
        sharded.append(_local_sq_sum(shd, device))
    if not names:
        return {}
    shard_sums = torch.stack(sharded)
    if group is not None and dist.is_available() and dist.is_initialized():
        dist.all_reduce(shard_sums, group=group)
    totals = torch.stack(replicated) + shard_sums
    return dict(zip(names, totals.unbind(), strict=True))


def _local_sq_sum(tensors: list[torch.Tensor], device: torch.device | None) -> torch.Tensor:
    tensors = [t for t in tensors if t.numel()]
    if not tensors:
        return torch.zeros((), dtype=torch.float32, device=device)
    # Fused per device and dtype (foreach kernels), not one reduction per tensor.
    return torch.nn.utils.get_total_norm(tensors).float().pow(2).to(device)
