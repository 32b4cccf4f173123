"""FSDP2 over the whole data-parallel world, with link-swapped sharded checkpoints
(docs/design.md)."""

from __future__ import annotations

import importlib
import shutil
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

from lightning.pytorch.strategies import FSDPStrategy, ModelParallelStrategy, StrategyRegistry

from fixed_embed.atomic import atomic_symlink
from fixed_embed.lightning_internals import set_data_parallel_size

_SHARDS_PREFIX = ".shards-"  # a sharded checkpoint's hidden folder, named by its link (step=N.ckpt)


def shards_parameters(strategy: Any) -> bool:
    """Whether ``strategy`` (a Strategy, or a config's ``trainer.strategy``: name or
    ``{class_path}``) shards."""
    if isinstance(strategy, dict):
        module, _, name = strategy.get("class_path", "").rpartition(".")
        strategy = getattr(
            importlib.import_module(module or "lightning.pytorch.strategies"), name, None
        )
    elif isinstance(strategy, str):
        strategy = StrategyRegistry[strategy]["strategy"] if strategy in StrategyRegistry else None
    kind = strategy if isinstance(strategy, type) else type(strategy)
    return issubclass(kind, (FSDPStrategy, ModelParallelStrategy))


class FSDP2Strategy(ModelParallelStrategy):
    """Args:
    save_distributed_checkpoint: each rank writes its shards (a folder); ``False``: one file
    from rank 0. process_group_backend: ``nccl`` on GPUs, ``gloo`` on CPUs by default.
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
        set_data_parallel_size(
            self, self.num_nodes * self.num_processes
        )  # all ranks shard one model
        super().setup_environment()

    def save_checkpoint(
        self, checkpoint: dict[str, Any], filepath: Any, storage_options: Any = None
    ) -> None:
        if not self.save_distributed_checkpoint:
            return super().save_checkpoint(checkpoint, filepath, storage_options)
        # Shards go to a new hidden folder, then rank 0 swaps the link ``filepath`` onto it: always
        # complete.
        path = Path(self.broadcast(str(filepath)))
        name = self.broadcast(
            f"{_SHARDS_PREFIX}{checkpoint.get('global_step', 0)}-{time.time_ns()}"
        )
        super().save_checkpoint(checkpoint, path.parent / name, storage_options)
        self.barrier("fsdp2_checkpoint_written")
        if self.global_rank == 0:
            atomic_symlink(name, path)
            _remove_unreferenced_shards(path.parent)
        self.barrier("fsdp2_checkpoint_linked")

    def remove_checkpoint(self, filepath: Any) -> None:
        if (
            self.global_rank == 0 and (path := Path(filepath)).is_symlink()
        ):  # a sharded checkpoint's link
            path.unlink()
            _remove_unreferenced_shards(path.parent)
        else:
            super().remove_checkpoint(filepath)


def _remove_unreferenced_shards(folder: Path) -> None:
    referenced = {p.resolve() for p in folder.iterdir() if p.is_symlink()}
    for shards in folder.glob(f"{_SHARDS_PREFIX}*"):
        if shards.is_dir() and shards.resolve() not in referenced:
            shutil.rmtree(shards, ignore_errors=True)
