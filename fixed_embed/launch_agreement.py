"""One verdict for every process a launcher starts at once (torchrun's ranks, srun's tasks, the nodes of a
multi-node Lightning launch): global rank 0 takes the run lock and plans first; the others read nothing of the
run until it has said "go" on the launcher's own store, then plan; every process then raises the first refusal
any of them met, in the same words, before a process group exists (so no rank waits for a store timeout).
A single launching process (Lightning's launcher starts its other ranks only after it) needs no agreement.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from datetime import timedelta
from typing import TypeVar

from torch.distributed import TCPStore

from fixed_embed.errors import UserError
from fixed_embed.resume_plan import RunComplete

T = TypeVar("T")
_PLAN_TIMEOUT = timedelta(minutes=30)  # the longest a peer waits for another's plan (a resume's checks included)
_stores: list[TCPStore] = []  # a store rank 0 hosts lives as long as the process: the process group reuses it


class RefusedOnAnotherRank(UserError):
    """Another process of this launch refused it: the same message on every process."""


def peers(num_nodes: int) -> tuple[int, int] | None:
    """(this process's index, how many) among the processes started at once, or ``None`` for a lone launcher."""
    env = os.environ
    if "TORCHELASTIC_RUN_ID" in env:  # torchrun
        return int(env["RANK"]), int(env["WORLD_SIZE"])
    if int(env.get("SLURM_NTASKS", "1")) > 1 and "SLURM_PROCID" in env:  # srun
        return int(env["SLURM_PROCID"]), int(env["SLURM_NTASKS"])
    if num_nodes > 1 and "LOCAL_RANK" not in env and {"NODE_RANK", "MASTER_PORT"} <= env.keys():
        return int(env["NODE_RANK"]), num_nodes  # a node of a Lightning launch: its local ranks start later
    return None


def _store(rank: int, count: int) -> tuple[TCPStore, bool]:
    """The store the process group will use: torchrun's agent hosts it; otherwise global rank 0 does, and
    ``init_process_group`` (multi-tenant, on the same port) takes it over."""
    from lightning.fabric.plugins.environments import LightningEnvironment, SLURMEnvironment

    env = SLURMEnvironment() if "SLURM_PROCID" in os.environ else LightningEnvironment()  # MASTER_ADDR/PORT first
    host = rank == 0 and os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True"
    store = TCPStore(env.main_address, env.main_port, count, is_master=host, multi_tenant=True,
                     timeout=_PLAN_TIMEOUT, wait_for_workers=False)  # fmt: skip
    _stores.append(store)
    return store, host


def in_turn(plan: Callable[[], T], num_nodes: int) -> T:
    """``plan()`` on global rank 0, then on every other process started with it; the first refusal raised
    by any process (a :class:`UserError`, or :class:`RunComplete`) is raised by all, a bug by its own."""
    if (where := peers(num_nodes)) is None:
        return plan()
    rank, count = where
    store, host = _store(rank, count)
    key = f"fixed-embed/launch/{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}/{{}}".format
    result, own, said = None, None, "go"
    if rank == 0 or (said := store.get(key(0)).decode()) == "go":  # a refusal of rank 0's: read nothing
        try:
            result = plan()
        except (UserError, RunComplete) as error:
            own, said = error, f"{'complete' if isinstance(error, RunComplete) else 'refused'} {error}"
        except BaseException:
            store.set(key(rank), f"failed global rank {rank} failed: its traceback says why")
            raise
    store.set(key(rank), said)
    keys = [key(other) for other in range(count)]
    store.wait(keys)
    words = [word.decode() for word in store.multi_get(keys)]
    read = store.add(key("read"), 1)
    while host and read < count and any(w != "go" for w in words):  # the store dies with this process: all read
        time.sleep(0.05)
        read = store.add(key("read"), 0)
    for word in words:
        kind, _, message = word.partition(" ")
        if kind != "go":
            if own is not None and said == word:
                raise own
            raise RunComplete(message) if kind == "complete" else RefusedOnAnotherRank(message)
    return result  # type: ignore[return-value]
