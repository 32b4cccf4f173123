"""CheckpointPolicy: bounded, requeue-safe checkpoints -- a few recent ones, a few permanent ones, ``last`` a link.

At paper scale one checkpoint (fp32 weights + AdamW moments) is ~21 GB; keeping one every 1,000 of
381,470 updates would need ~8 TB. The policy, in Lightning's own ``ModelCheckpoint``:

- after every update n with ``n % every_n_steps == 0`` (Lightning's ``every_n_train_steps`` counts
  as :mod:`callbacks.update_boundary` does) a checkpoint ``step=00001000.ckpt`` is written
  (atomically: the trainer's ``AtomicCheckpointIO``, or the FSDP strategy's swapped folder), and
  one line says so on the console;
- the ``keep_last`` most recent are kept (top-k on the step), older ones are deleted, except
- those at a multiple of ``keep_every`` updates, which are never deleted (the permanent record);
- ``last.ckpt`` is a symlink to the newest, swapped atomically: what ``--ckpt_path last`` resumes,
  never a second copy;
- the last update of the run is always saved (in ``on_train_batch_end``, before any end-of-run
  evaluation starts), and :func:`save_now` saves at once (preemption) through the same names.

At fit start it prints the size of one checkpoint, computed from the real model and optimizer
state, and the most disk the policy can hold for the whole run.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn

from fixed_embed.lightning_internals import save_through
from fixed_embed.run_folder import STEP_FILENAME, step_of

__all__ = ["CheckpointPolicy", "checkpoint_bytes", "save_now"]

class CheckpointPolicy(ModelCheckpoint):
    """Args:
    every_n_steps: save every N optimizer updates.
    keep_last: how many of the most recent checkpoints to keep (>= 1).
    keep_every: never delete the checkpoints at multiples of this many updates (``None``: none kept).
    dirpath: the folder (default: ``<run folder>/checkpoints``).
    save_weights_only: leave out the optimizer state (the run can then not be resumed exactly).
    """

    def __init__(
        self,
        every_n_steps: int = 1000,
        keep_last: int = 2,
        keep_every: int | None = None,
        dirpath: str | None = None,
        save_weights_only: bool = False,
    ) -> None:
        if every_n_steps < 1 or keep_last < 1:
            raise ValueError(f"every_n_steps and keep_last must be >= 1, got {every_n_steps} and {keep_last}")
        if keep_every is not None and (keep_every < 1 or keep_every % every_n_steps):
            raise ValueError(
                f"keep_every ({keep_every}) must be a positive multiple of every_n_steps ({every_n_steps})"
            )
        super().__init__(
            dirpath=dirpath,
            filename=STEP_FILENAME,
            auto_insert_metric_name=False,
            monitor="step",
            mode="max",
            save_top_k=keep_last,
            every_n_train_steps=every_n_steps,
            save_last="link",
            save_weights_only=save_weights_only,
            save_on_train_epoch_end=False,
            enable_version_counter=False,
        )
        self.every_n_steps, self.keep_last, self.keep_every = every_n_steps, keep_last, keep_every

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        size = checkpoint_bytes(pl_module, with_optimizer=not self.save_weights_only)
        steps = trainer.max_steps
        permanent = steps // self.keep_every if self.keep_every and steps > 0 else 0
        most = permanent + self.keep_last + 1  # + the one being written before the oldest is deleted
        rank_zero_info(
            f"Checkpoints: {_gb(size)} each; every {self.every_n_steps} updates into {self.dirpath}, "
            f"keeping the last {self.keep_last}"
            + (f" and every {self.keep_every}th ({permanent} over {steps:,} updates)" if self.keep_every else "")
            + f": at most {most} on disk = {_gb(most * size)}"
        )
        if trainer.is_global_zero and self.dirpath:
            free = shutil.disk_usage(_existing_parent(Path(self.dirpath))).free
            if most * size > free:
                rank_zero_warn(
                    f"the checkpoint policy may need {_gb(most * size)} but {self.dirpath} has {_gb(free)} free; "
                    "lower keep_last or raise keep_every"
                )

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, *args: Any, **kwargs: Any) -> None:
        super().on_train_batch_end(trainer, pl_module, *args, **kwargs)
        # The run's last update is saved here, before any end-of-run evaluation (on_train_end).
        if trainer.max_steps > 0 and trainer.global_step >= trainer.max_steps:
            save_now(trainer)

    # The four protected methods below override ModelCheckpoint's (listed in
    # fixed_embed.lightning_internals.LIGHTNING_OVERRIDES, checked by tests/test_lightning_internals.py).

    def _save_checkpoint(self, trainer: L.Trainer, filepath: str) -> None:
        super()._save_checkpoint(trainer, filepath)
        rank_zero_info(f"checkpoint at update {trainer.global_step}: {filepath}")

    def _remove_checkpoint(self, trainer: L.Trainer, filepath: str) -> None:
        step = step_of(filepath)
        if self.keep_every and step is not None and step % self.keep_every == 0:
            return  # permanent: out of the rolling top-k, but never deleted
        super()._remove_checkpoint(trainer, filepath)

    def _should_remove_checkpoint(self, trainer: L.Trainer, previous: str, current: str) -> bool:
        # Lightning never deletes the checkpoint a run resumed from; with a relaunch per preemption
        # that would leak one checkpoint per launch. A newer one has just been written: it may go.
        return previous != current and Path(self.dirpath).absolute() in Path(previous).absolute().parents

    @staticmethod
    def _link_checkpoint(trainer: L.Trainer, filepath: str, linkpath: str) -> None:
        # Lightning removes the old link before making the new one; a kill in between would leave no
        # `last`. Make the link under a temporary name and rename it over the old one (atomic).
        if trainer.is_global_zero and os.path.abspath(filepath) != os.path.abspath(linkpath):
            tmp = f"{linkpath}.tmp-{os.getpid()}"
            if os.path.lexists(tmp):
                os.remove(tmp)
            os.symlink(os.path.relpath(filepath, os.path.dirname(linkpath)), tmp)
            if os.path.isdir(linkpath) and not os.path.islink(linkpath):
                shutil.rmtree(linkpath)
            os.replace(tmp, linkpath)
        trainer.strategy.barrier()


def save_now(trainer: L.Trainer) -> Path:
    """Save the current state through the trainer's ModelCheckpoint (its names, its ``last``); return ``last``.

    Saves nothing if that callback already saved this update. Every rank must call it (the save is collective).
    """
    callback = trainer.checkpoint_callback
    if not isinstance(callback, ModelCheckpoint):
        path = Path(trainer.default_root_dir) / "checkpoints" / "last.ckpt"
        trainer.save_checkpoint(path)
        return path
    save_through(callback, trainer)
    return Path(callback.last_model_path or callback.best_model_path)


def checkpoint_bytes(module: torch.nn.Module, with_optimizer: bool = True) -> int:
    """Bytes of one full checkpoint: every state tensor (whole, also when sharded), plus AdamW's two fp32
    moments per trainable parameter (created lazily by the first step, so counted from the parameters)."""
    size = sum(t.numel() * t.element_size() for t in module.state_dict().values() if isinstance(t, torch.Tensor))
    if with_optimizer:
        size += sum(2 * p.numel() * 4 for p in module.parameters() if p.requires_grad)
    return size


def _gb(n: float) -> str:
    return f"{n / 1e9:,.1f} GB" if n >= 1e8 else f"{n / 1e6:,.1f} MB"


def _existing_parent(path: Path) -> Path:
    while not path.exists() and path != path.parent:
        path = path.parent
    return path if path.exists() else Path(".")
