"""L2 norms of whole tensors, whether each rank holds the full tensor (DDP) or a shard (FSDP2's ``DTensor``)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import torch
from torch.distributed.tensor import DTensor


def global_norms(groups: Mapping[str, Iterable[torch.Tensor]]) -> dict[str, torch.Tensor]:
    """The fp32 L2 norm of each named group; sharded, one all-reduce a group: all ranks call it with the same groups."""
    norms = {name: torch.nn.utils.get_total_norm([t for t in tensors if t.numel()]) for name, tensors in groups.items()}
    return {name: (n.full_tensor() if isinstance(n, DTensor) else n).float() for name, n in norms.items()}
