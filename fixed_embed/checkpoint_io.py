"""Atomic checkpoint writes: a killed process never leaves a half-written checkpoint behind."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch.plugins.io import TorchCheckpointIO

from fixed_embed.atomic import atomic_write, remove_orphans


class AtomicCheckpointIO(TorchCheckpointIO):
    """Lightning's ``torch.save`` checkpoints through :func:`fixed_embed.atomic.atomic_write`; the temporary
    file of a save killed mid-write is removed by the next save."""

    def save_checkpoint(self, checkpoint: dict[str, Any], path: str | os.PathLike, storage_options: Any = None) -> None:
        if storage_options is not None:
            raise TypeError(f"AtomicCheckpointIO takes no storage_options, got {storage_options!r}")
        remove_orphans(Path(path).parent)
        with atomic_write(path, "wb") as file:
            torch.save(checkpoint, file)
