"""Data: document sources, tokenizers, packing into fixed blocks, and the LightningDataModule."""

from fixed_embed.data.datamodule import TextDataModule
from fixed_embed.data.packing import PackedBlocks
from fixed_embed.data.sources import DocumentSource

__all__ = ["DocumentSource", "PackedBlocks", "TextDataModule"]
