"""FailFast: an exception on one rank ends every rank within seconds, naming it, instead of a
collective's timeout (:mod:`fixed_embed.distributed.rank_watch`; docs/faults.md, "A failure on
one rank")."""

from __future__ import annotations

import lightning as L

from fixed_embed.config import PositiveFinite
from fixed_embed.distributed import rank_watch


class FailFast(L.Callback):
    """Args:
    poll_s: how often each rank looks for another rank's failure (seconds).
    enabled: the on/off switch.
    """

    def __init__(self, poll_s: PositiveFinite = 1.0, enabled: bool = True) -> None:
        self.poll_s = poll_s
        self.enabled = enabled
        self._failed = False

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if self.enabled:
            rank_watch.start(self.poll_s)

    def on_exception(
        self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException
    ) -> None:
        if not self.enabled:
            return
        self._failed = True
        if trainer.is_global_zero:
            rank_watch.note_lost_ranks(
                trainer
            )  # a rank killed by the OS: named, before Lightning kills the others
        if (watch := rank_watch.current()) is not None:
            watch.fail(f"{type(exception).__name__}: {exception}")

    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if not self.enabled or rank_watch.current() is None:
            return
        if not self._failed:  # a watch runs only with other ranks
            # Rank 0 hosts the store: all stop watching first, or an early exit looks like a lost
            # store.
            trainer.strategy.barrier("fail_fast_teardown")
        rank_watch.stop()
