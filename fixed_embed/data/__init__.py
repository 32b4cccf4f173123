"""Data: document sources, tokenizers, packing into fixed blocks, token shards, and the
LightningDataModule."""

from fixed_embed.public_names import exports

_HOMES = {"DocumentSource": "sources", "PackedBlocks": "packing", "TextDataModule": "datamodule"}
__getattr__ = exports(__name__, _HOMES)
