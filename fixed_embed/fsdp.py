"""FSDP2 for the whole data-parallel world, with sharded checkpoints that are swapped in atomically.

:class:`FSDP2Strategy` is Lightning's ``ModelParallelStrategy`` with the device mesh fixed to
pure data parallelism (every rank one shard; Lightning's "auto" would make the mesh one node
wide) -- the sharding itself is applied by ``LanguageModel.configure_model``
(:mod:`fixed_embed.parallel`).

A sharded checkpoint is a folder written by every rank (torch.distributed.checkpoint) plus
Lightning's ``meta.pt``. Writing it in place would leave a half-new, half-old folder if the job
were killed mid-save, so each save goes to a fresh hidden folder ``.shards-<step>-<id>`` and the
checkpoint's name (``last.ckpt``, ``step=1000.ckpt``) is a symlink swapped onto it with an atomic
``os.replace`` once every rank has finished: the name always points at a complete checkpoint.
Folders no name points to any more (replaced, or orphaned by a kill) are removed at the next save.

:func:`consolidate` turns such a folder into one ordinary checkpoint file (weights and
hyper-parameters) for ``eval``, ``export`` or a single-device run.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch.strategies import ModelParallelStrategy

__all__ = ["FSDP2Strategy", "consolidate", "is_sharded_checkpoint"]

_SHARDS_PREFIX = ".shards-"
_META = "meta.pt"  # Lightning's metadata file inside a distributed checkpoint


def is_sharded_checkpoint(path: str | os.PathLike) -> bool:
    path = Path(path)
    return path.is_dir() and (path / _META).is_file() and (path / ".metadata").is_file()


class FSDP2Strategy(ModelParallelStrategy):
    """Args:
    save_distributed_checkpoint: each rank writes its shards (a folder); ``False`` gathers a single
        file on rank 0 (written by the trainer's CheckpointIO, atomically with AtomicCheckpointIO).
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

    def setup_environment(self) -> None:
        self._data_parallel_size = self.num_nodes * self.num_processes  # all ranks shard one model
        super().setup_environment()

    def save_checkpoint(self, checkpoint: dict[str, Any], filepath: Any, storage_options: Any = None) -> None:
        if not self._save_distributed_checkpoint:
            return super().save_checkpoint(checkpoint, filepath, storage_options)
        path = Path(self.broadcast(str(filepath)))
        name = self.broadcast(f"{_SHARDS_PREFIX}{checkpoint.get('global_step', 0)}-{time.time_ns()}")
        target = path.parent / name
        super().save_checkpoint(checkpoint, target, storage_options)
        self.barrier("fsdp2_checkpoint_written")
        if self.global_rank == 0:
            link = path.parent / f"{name}.link"
            os.symlink(name, link)
            if path.exists() and not path.is_symlink():  # a plain file or folder from elsewhere
                shutil.rmtree(path) if path.is_dir() else path.unlink()
            os.replace(link, path)  # atomic: the name now points at the complete new folder
            _remove_unreferenced_shards(path.parent)
        self.barrier("fsdp2_checkpoint_linked")

    def remove_checkpoint(self, filepath: Any) -> None:
        path = Path(filepath)
        if self.global_rank == 0 and path.is_symlink():
            path.unlink()
            _remove_unreferenced_shards(path.parent)
            return
        super().remove_checkpoint(filepath)


def _remove_unreferenced_shards(folder: Path) -> None:
    referenced = {p.resolve() for p in folder.iterdir() if p.is_symlink()}
    for shards in folder.glob(f"{_SHARDS_PREFIX}*"):
        if shards.is_dir() and shards.resolve() not in referenced:
            shutil.rmtree(shards, ignore_errors=True)


def consolidate(folder: str | os.PathLike, out: str | os.PathLike | None = None) -> dict[str, Any]:
    """One checkpoint dict (weights + Lightning metadata) from a sharded folder; written to ``out`` if given.

    Optimizer states are left out: FSDP2 stores them keyed by parameter name for resharding, a form
    a single-device optimizer cannot load; resume sharded runs from the folder itself.
    """
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    folder = Path(folder)
    if not is_sharded_checkpoint(folder):
        raise ValueError(f"{folder} is not a sharded checkpoint folder (needs {_META} and .metadata)")
    metadata = torch.load(folder / _META, map_location="cpu", weights_only=True)
    with tempfile.TemporaryDirectory() as tmp:
        full = Path(tmp) / "full.pt"
        dcp_to_torch_save(folder, full)
        state = torch.load(full, map_location="cpu", weights_only=True)
    checkpoint = {**metadata, "state_dict": state["state_dict"]}
    if out is not None:
        from fixed_embed.checkpoint_io import AtomicCheckpointIO

        AtomicCheckpointIO().save_checkpoint(checkpoint, out)
    return checkpoint
