"""Which process this is, from the variables Lightning's launcher, torchrun and srun set: before
any process group."""

from __future__ import annotations

import os


def _all_zero(variables: tuple[str, ...]) -> bool:
    return all(os.environ.get(name, "0").strip() in ("", "0") for name in variables)


def is_launching_rank() -> bool:
    """Whether this is global rank 0's launching process: no rank variable the launchers set is
    other than 0."""
    return _all_zero(("RANK", "LOCAL_RANK", "NODE_RANK", "GROUP_RANK", "SLURM_PROCID"))


def is_node_leader() -> bool:
    """Whether this process is local rank 0 of its node: the one that checks files every rank on
    the node reads."""
    return _all_zero(("LOCAL_RANK", "SLURM_LOCALID"))
