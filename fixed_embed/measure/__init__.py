"""What a run costs before it runs: the memory estimate, the traced update, peak FLOP/s for MFU."""
