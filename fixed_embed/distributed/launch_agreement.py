"""One verdict for every process a launcher starts at once (torchrun, srun, a multi-node
Lightning launch), before any process group: rank 0 plans first, the others after its "go" on
the store; all raise the first refusal any met."""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable
from datetime import timedelta
from typing import TypeVar

from lightning.fabric.plugins.environments import (
    LightningEnvironment,
    SLURMEnvironment,
    TorchElasticEnvironment,
)
from torch.distributed import TCPStore

from fixed_embed.errors import RunComplete, UserError, in_one_line

T = TypeVar("T")
# the longest a peer waits for another's plan (a resume's checks included)
_PLAN_TIMEOUT = timedelta(minutes=30)
# the longest a hosting rank 0 stays up, after the verdict, for its peers to read it
_READ_TIMEOUT_S = 60.0
# a store rank 0 hosts lives as long as the process: the process group reuses it
_stores: list[TCPStore] = []


class RefusedOnAnotherRank(UserError):
    """Another process of this launch refused it: the same message on every process."""


def peers(num_nodes: int) -> tuple[int, int, str, int] | None:
    """(index, count, store address, port) of the processes started at once, or ``None`` for a
    lone launcher."""
    # torchrun, or srun's tasks (an interactive SLURM allocation is not: Lightning launches there)
    if (elastic := TorchElasticEnvironment.detect()) or SLURMEnvironment.detect():
        env = TorchElasticEnvironment() if elastic else SLURMEnvironment()
        found = env.global_rank(), env.world_size(), env.main_address, env.main_port
    elif num_nodes > 1 and "LOCAL_RANK" not in os.environ and "MASTER_PORT" in os.environ:
        # a node's launching process: its local ranks start after this
        lightning = LightningEnvironment()
        found = lightning.node_rank(), num_nodes, lightning.main_address, lightning.main_port
    else:
        return None
    return found if found[1] > 1 else None


def in_turn(plan: Callable[[], T], num_nodes: int) -> T:
    """``plan()`` on global rank 0, then on every other process started with it; the first
    refusal raised by any process (a :class:`UserError`, or :class:`RunComplete`) is raised by
    all, a bug by its own process."""
    if (where := peers(num_nodes)) is None:
        return plan()
    rank, count, address, port = where
    # torchrun's agent hosts it
    host = rank == 0 and os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True"
    store = TCPStore(
        address,
        port,
        count,
        is_master=host,
        multi_tenant=True,
        timeout=_PLAN_TIMEOUT,
        wait_for_workers=False,
    )
    _stores.append(store)
    key = f"fixed-embed/launch/{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}/{{}}".format
    keys = [key(other) for other in range(count)]
    result, own, said, words = None, None, "go", []
    try:
        # a refusal of rank 0's: read nothing
        if rank == 0 or (said := store.get(key(0)).decode()) == "go":
            try:
                result = plan()
            except (UserError, RunComplete) as error:
                own, said = (
                    error,
                    f"{'complete' if isinstance(error, RunComplete) else 'refused'} {error}",
                )
            # its own process prints it in full: the others name it in one line
            except BaseException as error:
                own, said = error, f"failed global rank {rank} failed: {in_one_line(error)}"
        store.set(key(rank), said)
        store.wait(keys)
        words = [word.decode() for word in store.multi_get(keys)]
    finally:
        # all going: the process group takes the store over
        going = len(words) == count and all(word == "go" for word in words)
        _stay_until_read(store, key("read"), count, host and not going)
    if own is not None and not isinstance(own, (UserError, RunComplete)):
        raise own
    for word in words:
        kind, _, message = word.partition(" ")
        if kind != "go":
            if own is not None and said == word:
                raise own
            raise RunComplete(message) if kind == "complete" else RefusedOnAnotherRank(message)
    return result  # type: ignore[return-value]


def _stay_until_read(store: TCPStore, read_key: str, count: int, wait: bool) -> None:
    """Count this process as having read the verdict; with ``wait`` (a hosting rank 0), stay up
    until all ``count`` have, for at most ``_READ_TIMEOUT_S``: the store dies with this process."""
    # the host may be gone: then there is no one left to wait for
    with contextlib.suppress(RuntimeError):
        read, deadline = store.add(read_key, 1), time.monotonic() + _READ_TIMEOUT_S
        while wait and read < count and time.monotonic() < deadline:
            time.sleep(0.05)
            read = store.add(read_key, 0)
