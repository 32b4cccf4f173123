"""Many processes, one model: ranks, FSDP2, checkpoint files, the rank watch, the launch
agreement."""

from fixed_embed.public_names import exports

_HOMES = {"FSDP2Strategy": "fsdp", "AtomicCheckpointIO": "checkpoint"}
__getattr__ = exports(__name__, _HOMES)
