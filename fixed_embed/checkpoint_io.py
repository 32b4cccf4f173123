"""Atomic checkpoint writes: a killed process never leaves a half-written checkpoint behind."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch.plugins.io import TorchCheckpointIO

__all__ = ["AtomicCheckpointIO"]


class AtomicCheckpointIO(TorchCheckpointIO):
    """Write to a temporary file in the same folder, fsync, then ``os.replace`` onto the target.

    ``os.replace`` is atomic on POSIX: at any instant the path holds either the previous
    complete checkpoint or the new complete one, even under SIGKILL mid-save. A temporary file
    orphaned by such a kill is removed by the next save of the same checkpoint name (only one
    process -- global rank 0 -- writes a given path).
    """

    def save_checkpoint(self, checkpoint: dict[str, Any], path: str | os.PathLike, storage_options: Any = None) -> None:
        if storage_options is not None:
            raise TypeError(f"AtomicCheckpointIO takes no storage_options, got {storage_options!r}")
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        for orphan in path.parent.glob(f".{path.name}.tmp-*"):
            orphan.unlink(missing_ok=True)
        tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
        try:
            with open(tmp, "wb") as f:
                torch.save(checkpoint, f)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        finally:
            tmp.unlink(missing_ok=True)
