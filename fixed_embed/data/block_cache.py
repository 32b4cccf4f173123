"""Materialised blocks (the validation set) kept on disk, keyed by everything they depend on."""

from __future__ import annotations

import hashlib
import json
import time
import warnings
from collections.abc import Callable
from typing import Any

import torch

from fixed_embed.atomic import atomic_write
from fixed_embed.data.corpus import cache_root
from fixed_embed.errors import in_one_line


class BlockCache:
    """``cache_root() / kind / <sha256 of key>.pt``, with the blocks' SHA-256; a bad entry is
    rebuilt with a warning."""

    def __init__(self, key: dict[str, Any], kind: str) -> None:
        self.digest = hashlib.sha256(
            json.dumps(key, sort_keys=True, default=str).encode()
        ).hexdigest()
        self.path = cache_root() / kind / f"{self.digest[:32]}.pt"

    def load(self) -> torch.Tensor | None:
        """The cached blocks, or ``None`` when absent or unusable (their SHA-256 checks them)."""
        try:
            saved = torch.load(self.path, map_location="cpu", weights_only=True)
            intact = saved["key"] == self.digest and saved["sha256"] == _sha256(saved["blocks"])
        except FileNotFoundError:
            return None
        except Exception as error:  # truncated, corrupt, unreadable: any of many types
            warnings.warn(
                f"block cache {self.path} is unreadable ({in_one_line(error)}); rebuilding",
                stacklevel=2,
            )
            return None
        if not intact:
            warnings.warn(
                f"block cache {self.path} does not hold the expected blocks; rebuilding",
                stacklevel=2,
            )
            return None
        return saved["blocks"]

    def save(self, blocks: torch.Tensor) -> None:
        record = {"key": self.digest, "blocks": blocks.contiguous(), "sha256": _sha256(blocks)}
        try:
            with atomic_write(self.path, "wb") as file:
                torch.save(record, file)
        except OSError as error:  # a read-only or full disk
            warnings.warn(f"could not write the block cache {self.path}: {error}", stacklevel=2)

    def get(self, build: Callable[[], torch.Tensor]) -> tuple[torch.Tensor, float | None]:
        """The cached blocks, or ``build()`` saved; with the seconds the build took (``None``:
        from cache)."""
        if (blocks := self.load()) is not None:
            return blocks, None
        start = time.perf_counter()
        self.save(blocks := build())
        return blocks, time.perf_counter() - start


def _sha256(blocks: torch.Tensor) -> str:
    return hashlib.sha256(blocks.contiguous().numpy()).hexdigest()
