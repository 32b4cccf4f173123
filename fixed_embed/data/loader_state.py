"""Every rank's data position in a checkpoint: gathered when saving, each rank's own taken back when resuming.

Lightning saves the training loader's state (the data position) inside its fit loop's state, from
global rank 0 only, so every rank would resume rank 0's stream. Every rank's state is kept in the
checkpoint under ``loader_states_per_rank`` instead (a key existing checkpoints hold: never renamed),
and on load each rank puts its own where Lightning restores the loader's from.

The state is the loop's to save and restore, and only a LightningModule's (or a callback's)
checkpoint hooks see the whole checkpoint -- a LightningDataModule's ``state_dict`` sees only its own
entry -- so :class:`fixed_embed.module.LanguageModel` calls these two from its hooks.

A text stream's position belongs to its reader (rank x worker), so a resume on another number of
ranks is refused. A token-shard position (:mod:`fixed_embed.data.block_order`) is global, the same
on every rank: a resume on any number of ranks hands it to each of them.
"""

from __future__ import annotations

from typing import Any

import torch

from fixed_embed.data.block_order import GLOBAL_POSITION, is_global_position
from fixed_embed.errors import CheckpointError
from fixed_embed.lightning_internals import COMBINED_LOADER, fit_loop_state

__all__ = ["LOADER_STATES", "gather_loader_states", "take_own_loader_state"]

LOADER_STATES = "loader_states_per_rank"


def gather_loader_states(checkpoint: dict[str, Any], world_size: int) -> None:
    """Every rank's loader state into ``checkpoint`` (collective: every rank calls it)."""
    slot = fit_loop_state(checkpoint)
    states: list[Any] = [None] * world_size
    torch.distributed.all_gather_object(states, None if slot is None else slot.get(COMBINED_LOADER))
    checkpoint[LOADER_STATES] = states


def take_own_loader_state(checkpoint: dict[str, Any], trainer: Any) -> None:
    """This rank's loader state where Lightning restores it from; refuses another number of ranks, unless
    the position is a token-shard one (global: every rank takes the same)."""
    states, slot = checkpoint.get(LOADER_STATES), fit_loop_state(checkpoint)
    if states is None or slot is None or trainer is None or trainer.state.fn != "fit":
        return  # validate/test need no data position (one rank's checkpoint: Lightning's own slot)
    if states and all(is_global_position(state) for state in states):
        positions = {tuple(s[GLOBAL_POSITION] for s in state) for state in states}
        if len(positions) != 1:
            raise CheckpointError(
                f"refusing to resume: the ranks' token-shard positions in the checkpoint differ ({sorted(positions)})"
            )
        slot[COMBINED_LOADER] = states[0]  # the same global position, whatever the world size now
        return
    if len(states) != trainer.world_size:
        raise CheckpointError(
            f"refusing to resume: the checkpoint holds the data position of {len(states)} ranks but this run has "
            f"{trainer.world_size}; resume on the same number of nodes x devices. A text stream's position belongs "
            "to its readers; to continue on another world size, train from token shards (fixed-embed pretokenize, "
            "data.train: SHARDS/), whose position is global"
        )
    slot[COMBINED_LOADER] = states[trainer.global_rank]
