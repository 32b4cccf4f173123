"""Data: document sources, tokenizers, packing into fixed blocks, and the LightningDataModule.

The names below load on first use (PEP 562), so a ``fixed_embed.data.*`` module costs only its own imports
(only the datamodule needs Lightning)."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from fixed_embed.data.datamodule import TextDataModule as TextDataModule
    from fixed_embed.data.packing import PackedBlocks as PackedBlocks
    from fixed_embed.data.sources import DocumentSource as DocumentSource

_HOMES = {"DocumentSource": "sources", "PackedBlocks": "packing", "TextDataModule": "datamodule"}


def __getattr__(name: str) -> Any:
    if name not in _HOMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_HOMES[name]}"), name)
