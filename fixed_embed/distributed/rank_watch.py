"""RankWatch: a failure or stop request on one rank reaches all within a second through the c10d
store, with no collective (a rank blocked in one would wait for the timeout); docs/faults.md ("A
failure on one rank")."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import time
from typing import Any

import torch.distributed as dist

from fixed_embed.errors import UserError

_FAILED, _STOP = "fixed_embed/failed", "fixed_embed/stop"


class RankWatch:
    def __init__(self, store: dist.Store, rank: int, poll_s: float = 1.0) -> None:
        self.store, self.rank, self.poll_s = store, rank, poll_s
        self.stop_requested = self._publish = self._failed = False
        self._closing = threading.Event()
        self._thread = threading.Thread(
            target=self._watch, name="fixed-embed-rank-watch", daemon=True
        )
        self._thread.start()

    def request_stop(self) -> None:
        """This rank wants every rank to stop (a flag: safe in a signal handler)."""
        self._publish = True

    def fail(self, message: str) -> None:
        """Tell every other rank that this one failed; they exit with status 1."""
        self._failed = True  # this rank ends with its own error: stop reading others'
        with contextlib.suppress(Exception):  # the store may be gone (rank 0 failed first)
            self.store.set(_FAILED, f"rank {self.rank}: {message}")

    def close(self) -> None:
        self._closing.set()
        self._thread.join(timeout=2 * self.poll_s + 1)

    def _watch(self) -> None:
        while not self._closing.wait(self.poll_s):
            try:
                if self._publish:
                    self.store.set(_STOP, str(self.rank))
                    self._publish = False
                if self.store.check([_STOP]):
                    self.stop_requested = True
                if not self._failed and self.store.check([_FAILED]):
                    message = self.store.get(_FAILED).decode(errors="replace")
                    if not message.startswith(f"rank {self.rank}:"):
                        _exit(f"rank {self.rank}: stopping because {message}")
            except Exception as error:
                if self._closing.is_set():
                    return
                _exit(
                    f"rank {self.rank}: stopping: the job's store is unreachable "
                    f"({type(error).__name__}: {error})"
                )


def _exit(message: str) -> None:
    print(f"fixed-embed: {message}", file=sys.stderr, flush=True)
    os._exit(1)  # the main thread may be blocked in a collective: only a hard exit ends it


_current: RankWatch | None = None


def start(poll_s: float) -> None:
    """The process's watch, started on the default process group's store (none in a process
    alone: its own stop request and failure reach all there is)."""
    global _current
    distributed = dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1
    if _current is None and distributed:
        _current = RankWatch(dist.distributed_c10d._get_default_store(), dist.get_rank(), poll_s)


def current() -> RankWatch | None:
    return _current


def stop() -> None:
    global _current
    if _current is not None:
        _current.close()
        _current = None


class RankLostError(UserError):
    """Another rank's process died (killed by the OS): already printed, exit status 1."""

    exit_status = 1
    printed = True


_lost: str | None = None


def note_lost_ranks(trainer: Any) -> None:
    """On rank 0 under Lightning's DDP launcher: print the first rank whose process has died
    (given a second to be reaped, as this runs while handling the exception its death caused)."""
    global _lost
    launcher = trainer.strategy.launcher  # its local ranks' processes, when it started them
    if not (procs := getattr(launcher, "procs", None)):
        return
    deadline = time.monotonic() + 1.0
    while not (
        dead := [
            (n, code) for n, p in enumerate(procs, start=1) if (code := p.poll()) not in (None, 0)
        ]
    ):
        if time.monotonic() >= deadline:
            return
        time.sleep(0.05)
    local, code = dead[0]
    rank = launcher.cluster_environment.node_rank() * launcher.num_processes + local
    name = signal.Signals(-code).name if -code in set(signal.Signals) else "?"
    how = f"exited with signal {-code} ({name})" if code < 0 else f"exited with status {code}"
    _lost = f"rank {rank} {how}; relaunch with --ckpt_path last"
    print(f"fixed-embed: {_lost}", file=sys.stderr, flush=True)


def lost_rank() -> str | None:
    """The lost rank :func:`note_lost_ranks` found in this process (once: reading it clears it)."""
    global _lost
    lost, _lost = _lost, None
    return lost
