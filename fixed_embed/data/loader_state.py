"""The data position in a checkpoint: Lightning saves rank 0's loader state only, so every
rank's is gathered under ``LOADER_STATES`` (a key checkpoints hold: never rename it), and each
rank's own is handed back at load."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import torch

from fixed_embed.data.block_order import GLOBAL_POSITION
from fixed_embed.lightning_internals import COMBINED_LOADER, fit_loop_state

LOADER_STATES = "loader_states_per_rank"


def gather_loader_states(checkpoint: dict[str, Any], world_size: int) -> None:
    """Every rank's loader state into ``checkpoint`` (collective: every rank calls it)."""
    slot = fit_loop_state(checkpoint)
    states: list[Any] = [None] * world_size
    torch.distributed.all_gather_object(states, None if slot is None else slot.get(COMBINED_LOADER))
    checkpoint[LOADER_STATES] = states


def saved_loader_state(checkpoint: Mapping[str, Any]) -> Any:
    """The loader states a checkpoint holds: every rank's (a fit of several ranks), else
    Lightning's one."""
    slot = fit_loop_state(checkpoint)
    return checkpoint.get(LOADER_STATES) or (None if slot is None else slot.get(COMBINED_LOADER))


def find_states(state: Any, key: str) -> list[dict[str, Any]]:
    """Every mapping holding ``key`` inside a loader state, whatever the loader's layout
    (workers nest them)."""
    if isinstance(state, Mapping):
        return [dict(state)] if key in state else find_states(list(state.values()), key)
    if isinstance(state, (list, tuple)):
        return [found for value in state for found in find_states(value, key)]
    return []


def fingerprint_refusal(saved: str, expected: Mapping[str, Any]) -> str | None:
    """Why a position saved with settings ``saved`` (JSON) cannot resume ``expected`` (naming
    each change), or None."""
    then, now = json.loads(saved), json.loads(json.dumps(expected))  # as saved: tuples become lists
    keys = sorted(key for key in set(then) | set(now) if then.get(key) != now.get(key))
    if not (
        changed := "; ".join(
            f"{key}: checkpoint {then.get(key)!r}, now {now.get(key)!r}" for key in keys
        )
    ):
        return None
    return (
        "refusing to resume: the checkpoint's data stream was made with other data settings "
        f"({changed}); "
        "resume with the run's own data settings, or start a new run (--run NAME)"
    )


def take_own_loader_state(checkpoint: dict[str, Any], rank: int) -> None:
    """Put rank ``rank``'s loader state where Lightning restores it from: a token-shard position
    is global (every rank takes the same), a text stream's is its rank's."""
    slot, states = fit_loop_state(checkpoint), checkpoint.get(LOADER_STATES)
    if slot is not None and states is not None:
        slot[COMBINED_LOADER] = states[0 if find_states(states, GLOBAL_POSITION) else rank]
