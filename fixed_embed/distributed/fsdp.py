"""FSDP2 over the whole data-parallel world, with link-swapped sharded checkpoints (docs/design.md)."""

from __future__ import annotations

import importlib
from datetime import timedelta
from typing import Any

from lightning.pytorch.strategies import FSDPStrategy, ModelParallelStrategy, StrategyRegistry

from fixed_embed.distributed.checkpoint import remove_sharded, save_sharded
from fixed_embed.lightning_internals import set_data_parallel_size


def shards_parameters(strategy: Any) -> bool:
    """Whether ``strategy`` (a Strategy, or a config's ``trainer.strategy``: name or ``{class_path}``) shards."""
    if isinstance(strategy, dict):
        module, _, name = strategy.get("class_path", "").rpartition(".")
        strategy = getattr(importlib.import_module(module or "lightning.pytorch.strategies"), name, None)
    elif isinstance(strategy, str):
        strategy = StrategyRegistry[strategy]["strategy"] if strategy in StrategyRegistry else None
    kind = strategy if isinstance(strategy, type) else type(strategy)
    return issubclass(kind, (FSDPStrategy, ModelParallelStrategy))


class FSDP2Strategy(ModelParallelStrategy):
    """Args:
    save_distributed_checkpoint: each rank writes its shards (a folder); ``False``: one file from rank 0.
    process_group_backend: ``nccl`` on GPUs, ``gloo`` on CPUs by default.
    timeout_minutes: collective timeout (long evaluations in the loop need it above their duration).
    """

    def __init__(
        self,
        save_distributed_checkpoint: bool = True,
        process_group_backend: str | None = None,
        timeout_minutes: float = 30.0,
    ) -> None:
        super().__init__(
            data_parallel_size="auto",
            tensor_parallel_size=1,
            save_distributed_checkpoint=save_distributed_checkpoint,
            process_group_backend=process_group_backend,
            timeout=timedelta(minutes=timeout_minutes),
        )
        self.save_distributed_checkpoint = save_distributed_checkpoint

    def setup_environment(self) -> None:
        set_data_parallel_size(self, self.num_nodes * self.num_processes)  # all ranks shard one model
        super().setup_environment()

    def save_checkpoint(self, checkpoint: dict[str, Any], filepath: Any, storage_options: Any = None) -> None:
        if not self.save_distributed_checkpoint:
            return super().save_checkpoint(checkpoint, filepath, storage_options)
        parent = super()
        save_sharded(self, checkpoint, filepath, lambda path: parent.save_checkpoint(checkpoint, path, storage_options))

    def remove_checkpoint(self, filepath: Any) -> None:
        if not (self.global_rank == 0 and remove_sharded(filepath)):
            super().remove_checkpoint(filepath)
