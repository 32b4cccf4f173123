"""The decoder that every input interface feeds: its blocks, the chunked loss, parameter counts,
the AdamW recipe."""
