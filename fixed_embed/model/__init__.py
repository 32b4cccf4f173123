"""The decoder that every input interface feeds: its blocks, the chunked loss, parameter counts,
the AdamW recipe."""
# ruff: noqa: F401  (re-exports)

from fixed_embed.model.decoder import Decoder, DecoderConfig
from fixed_embed.model.recipe import AdamWConfig, ScheduleConfig
