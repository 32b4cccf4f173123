"""Materialised blocks kept on disk (the validation set), keyed by everything they depend on."""

from __future__ import annotations

import hashlib
import json
import os
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from fixed_embed.atomic import atomic_write
from fixed_embed.data.corpus import cache_root

__all__ = ["BlockCache"]


class BlockCache:
    """Materialised blocks kept on disk, keyed by everything they depend on. It is a cache: an entry
    that cannot be read, or does not match, is rebuilt (with a warning), never trusted or fatal.

    The file is ``folder / <sha256 of key>.pt`` (``folder`` defaults to ``cache_root() / kind``)
    holding the blocks and that digest; it is written atomically (:mod:`fixed_embed.atomic`), so a
    reader never sees half a file, and concurrent writers just race to an identical result.
    """

    def __init__(self, key: dict[str, Any], kind: str = "blocks", folder: str | os.PathLike | None = None) -> None:
        self.digest = hashlib.sha256(json.dumps(key, sort_keys=True, default=str).encode()).hexdigest()
        self.path = Path(folder if folder is not None else cache_root() / kind) / f"{self.digest[:32]}.pt"

    def load(self, width: int | None = None) -> torch.Tensor | None:
        """The cached ``LongTensor[n, width]``, or ``None`` when absent or unusable."""
        try:
            saved = torch.load(self.path, map_location="cpu", weights_only=True)
        except FileNotFoundError:
            return None
        except Exception as error:  # truncated, corrupt, unreadable: any of many types
            reason = (str(error).splitlines() or [""])[0][:200]
            warnings.warn(
                f"block cache {self.path} is unreadable ({type(error).__name__}: {reason}); rebuilding", stacklevel=2
            )
            return None
        saved = saved if isinstance(saved, dict) else {}
        blocks = saved.get("blocks")
        usable = (
            saved.get("key") == self.digest
            and isinstance(blocks, torch.Tensor)
            and blocks.dtype == torch.int64
            and blocks.dim() == 2
            and len(blocks) > 0
            and (width is None or blocks.shape[1] == width)
        )
        if not usable:
            warnings.warn(f"block cache {self.path} does not hold the expected blocks; rebuilding", stacklevel=2)
            return None
        return blocks

    def save(self, blocks: torch.Tensor) -> bool:
        """Write ``blocks`` atomically; a failure (read-only or full disk) warns and returns False."""
        try:
            with atomic_write(self.path, "wb") as file:
                torch.save({"key": self.digest, "blocks": blocks.contiguous()}, file)
            return True
        except OSError as error:
            warnings.warn(f"could not write the block cache {self.path}: {error}", stacklevel=2)
            return False

    def get(self, build: Callable[[], torch.Tensor], width: int | None = None) -> tuple[torch.Tensor, float | None]:
        """The cached blocks, or ``build()`` saved; with the seconds the build took (``None``: from cache)."""
        blocks = self.load(width)
        if blocks is not None:
            return blocks, None
        start = time.perf_counter()
        blocks = build()
        seconds = time.perf_counter() - start
        self.save(blocks)
        return blocks, seconds
