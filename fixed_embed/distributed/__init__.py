"""Many processes, one model: rank identity, FSDP2, sharded norms, checkpoint files, the rank watch, the launch
agreement."""
