"""FSDP2 on 2 gloo processes: gradients accumulated with the reduce-scatter on the last
micro-batch only (``set_requires_gradient_sync``, as ``LanguageModel.on_train_batch_start`` sets
it) equal those reduced after every micro-batch (Lightning's behaviour before), flat and hybrid
(2 x 1 mesh) sharding. Prints one JSON line.

    python tests/fsdp_grad_sync.py   (used by tests/test_fsdp2.py)
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

TINY = {
    "vocab_size": 64,
    "d_model": 32,
    "n_layers": 2,
    "n_heads": 4,
    "ffn_dim": 64,
    "max_seq_len": 16,
}
MICRO = 3


def grads(rank: int, sync_every: bool, shard_group_size: int | None) -> dict[str, torch.Tensor]:
    from torch.distributed.device_mesh import init_device_mesh

    from fixed_embed.distributed.parallel import ParallelConfig, apply_parallelism
    from fixed_embed.interfaces import LearnedInput
    from fixed_embed.model.decoder import Decoder, DecoderConfig

    torch.manual_seed(0)
    config = DecoderConfig(**TINY)
    decoder = Decoder(config, LearnedInput(config.vocab_size, config.d_model))
    mesh = init_device_mesh("cpu", (2,), mesh_dim_names=("data_parallel",))
    apply_parallelism(
        decoder, ParallelConfig(param_dtype="float32", shard_group_size=shard_group_size), mesh
    )
    generator = torch.Generator().manual_seed(100 + rank)
    for i in range(MICRO):
        ids = torch.randint(0, config.vocab_size, (2, 9), generator=generator)
        decoder.set_requires_gradient_sync(sync_every or i == MICRO - 1)
        decoder(ids[:, :-1], ids[:, 1:]).backward()
    return {name: p.grad.full_tensor().clone() for name, p in decoder.named_parameters()}


def worker(rank: int, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    reference = grads(rank, sync_every=True, shard_group_size=None)
    last_only = grads(rank, sync_every=False, shard_group_size=None)
    hybrid = grads(rank, sync_every=False, shard_group_size=1)
    diff = {
        name: max(float((last_only[k] - reference[k]).abs().max()) for k in reference)
        for name, last_only in (("last_only", last_only), ("hybrid", hybrid))
    }
    if rank == 0:
        Path(out).write_text(json.dumps({"max_abs_diff": diff, "params": len(reference)}) + "\n")
    dist.destroy_process_group()


if __name__ == "__main__":
    os.environ.setdefault("MASTER_PORT", str(29500 + os.getpid() % 2000))
    out = sys.argv[1]
    mp.spawn(worker, args=(out,), nprocs=2, join=True)
