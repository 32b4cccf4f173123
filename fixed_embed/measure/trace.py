"""One training update traced on fake CPU tensors, at any shape without the memory: the per-rank
peak of live tensors (MemTracker) and the FLOPs (FlopCounterMode); docs/benchmarks.md.
``compile`` is off: fusion only lowers the peak."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from typing import Any

import torch
import torch.distributed as dist
from torch.utils import flop_counter

from fixed_embed.distributed.parallel import apply_parallelism
from fixed_embed.measure.memory import RunShape
from fixed_embed.model.recipe import build_adamw

#: FlopCounterMode knows the CUDA attention kernels; the fake CPU tensors run the CPU one (same
#: FLOPs).
_ATTENTION = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
_ATTENTION_BACKWARD = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward
_CPU_ATTENTION_FLOPS = {
    _ATTENTION: lambda q, k, v, *_, **__: flop_counter.sdpa_flop_count(q, k, v),
    _ATTENTION_BACKWARD: lambda grad, q, k, v, *_, **__: flop_counter.sdpa_backward_flop_count(
        grad, q, k, v
    ),
}


@dataclass(frozen=True)
class TracedUpdate:
    """Per-rank bytes at the update's peak, by MemTracker's kinds; the FLOPs of one micro-batch."""

    peak: int
    kinds: dict[str, int]
    flops: int
    tokens: int  # targets of one micro-batch
    micro_batches: int
    seconds: float

    @property
    def flops_per_token(self) -> int:
        return self.flops // self.tokens


def trace_update(model: Any, run: RunShape, micro_batches: int | None = None) -> TracedUpdate:
    """Trace one update of ``model`` (a ``LanguageModel`` on the meta device) at ``run``,
    ``micro_batches`` of it (default: all): those between the second and the last allocate
    alike, so 3 give any longer one's peak."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker
    from torch.distributed._tools.mem_tracker import MemTracker

    start = time.perf_counter()
    count = min(micro_batches or run.accumulate, run.accumulate)
    seq_len = run.seq_len or model.config.max_seq_len
    sharded = run.sharded
    with contextlib.ExitStack() as stack:
        mesh = stack.enter_context(_fake_process_group(run.world_size)) if sharded else None
        # as configured but without compile; FSDP2 shards on the meta device, before the tensors
        # are made
        apply_parallelism(model.decoder, replace(model.parallel_config, compile=False), mesh)
        stack.enter_context(FakeTensorMode(allow_non_fake_inputs=True))
        model.to_empty(device="cpu")
        params = [p for p in model.parameters() if p.requires_grad]
        optimizer = _stepped_optimizer(model, params, sharded)
        micro_batch = _micro_batch(model, run, seq_len)
        # FLOPs apart: the counter's module hooks keep checkpointed blocks' recomputed activations
        # alive
        with flop_counter.FlopCounterMode(
            display=False, custom_mapping=_CPU_ATTENTION_FLOPS
        ) as flops:
            micro_batch(last=True)
        optimizer.zero_grad(set_to_none=sharded)
        tracker = FSDPMemTracker(model.decoder, optimizer) if sharded else MemTracker()
        tracker.track_external(model, optimizer)
        with tracker:
            for index in range(count):
                tracker.reset_mod_stats()  # MemTracker's per-module stats hold one iteration
                micro_batch(last=index == count - 1)
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            optimizer.step()
            optimizer.zero_grad()
        peak = tracker.get_tracker_snapshot("peak")[torch.device("cpu")]
    kinds = {
        str(getattr(kind, "value", kind)): size for kind, size in peak.items() if kind != "Total"
    }
    return TracedUpdate(
        peak["Total"],
        kinds,
        flops.get_total_flops(),
        run.micro_batch * seq_len,
        count,
        time.perf_counter() - start,
    )


def _stepped_optimizer(model: Any, params: list, sharded: bool) -> torch.optim.Optimizer:
    """The recipe's AdamW (``auto``: fused) after one step: its state and (DDP) the gradient
    buckets, as after the first update."""
    config = model.optimizer_config
    optimizer = build_adamw(
        model,
        replace(config, implementation="fused") if config.implementation == "auto" else config,
    )
    for p in params:
        p.grad = torch.zeros_like(p)
    optimizer.step()
    optimizer.zero_grad(set_to_none=sharded)
    return optimizer


def _micro_batch(model: Any, run: RunShape, seq_len: int) -> Callable[[bool], None]:
    """One micro-batch's forward and backward at ``run``'s shape and precision; ``last``: the
    one that syncs gradients."""
    block = torch.zeros(run.micro_batch, seq_len + 1, dtype=torch.long)
    autocast = "mixed" in str(run.precision) and not run.sharded
    half = torch.bfloat16 if str(run.precision).startswith("bf16") else torch.float16

    def micro_batch(last: bool) -> None:
        if run.sharded and not model.parallel_config.sync_every_micro_batch:
            model.decoder.set_requires_gradient_sync(last)
        with torch.autocast("cpu", dtype=half, enabled=autocast):
            loss, _ = model.block_loss(block)
        (loss / run.accumulate).backward()

    return micro_batch


@contextlib.contextmanager
def _fake_process_group(world_size: int) -> Iterator[Any]:
    """Rank 0 of ``world_size`` on torch's fake process group (collectives do nothing), and its
    mesh."""
    import torch.testing._internal.distributed.fake_pg as fake_pg  # registers the "fake" backend
    from torch.distributed.device_mesh import init_device_mesh

    dist.init_process_group("fake", store=fake_pg.FakeStore(), rank=0, world_size=world_size)
    try:
        yield init_device_mesh("cpu", (world_size,), mesh_dim_names=("data_parallel",))
    finally:
        dist.destroy_process_group()
