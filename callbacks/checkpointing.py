"""CheckpointPolicy: bounded, requeue-safe checkpoints -- a few recent ones, a few permanent ones, ``last`` a link.

At paper scale one checkpoint (fp32 weights + AdamW moments) is ~21 GB; keeping one every 1,000 of
381,470 updates would need ~8 TB. The policy, a Lightning ``Checkpoint`` that saves through
``trainer.save_checkpoint``:

- after every update n with ``n % every_n_steps == 0`` (:mod:`callbacks.update_boundary`) a
  checkpoint ``step=00001000.ckpt`` is written (atomically: the trainer's ``AtomicCheckpointIO``,
  or the FSDP strategy's swapped folder), and one line says so on the console;
- the ``keep_last`` most recent are kept, older ones are deleted (the one a run resumed from too), except
- those at a multiple of ``keep_every`` updates, which are never deleted (the permanent record);
- ``last.ckpt`` is a symlink to the newest, swapped atomically (:func:`fixed_embed.atomic.atomic_symlink`):
  what ``--ckpt_path last`` resumes (:func:`fixed_embed.resume_plan.choose_checkpoint`), never a second copy;
- the last update of the run is always saved (when it ends, before any end-of-run evaluation
  starts), and :func:`save_now` saves at once (preemption) through the same names.

At fit start it prints the size of one checkpoint, computed from the real model and optimizer
state, and the most disk the policy can hold for the whole run.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import lightning as L
import torch
from lightning.pytorch.callbacks import Checkpoint
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn

from callbacks.update_boundary import UpdateCallback
from fixed_embed.atomic import atomic_symlink
from fixed_embed.run_folder import STEP_FILENAME, step_checkpoints, step_of

__all__ = ["CheckpointPolicy", "checkpoint_bytes", "save_now"]


class CheckpointPolicy(UpdateCallback, Checkpoint):
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
        super().__init__(every_n_steps)
        self.keep_last, self.keep_every = keep_last, keep_every
        self.dirpath, self.save_weights_only = dirpath, save_weights_only
        self._saved_step = -1

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if self.dirpath is None:
            self.dirpath = trainer.strategy.broadcast(str(_run_folder(trainer) / "checkpoints"))

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

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._saved_step = trainer.global_step  # a resumed run's update is on disk already

    def on_update_end(self, trainer: L.Trainer, pl_module: L.LightningModule, update: int) -> None:
        # The run's last update is saved here, before any end-of-run evaluation (on_train_end).
        if not trainer.fast_dev_run and (self.due(update) or 0 < trainer.max_steps <= update):
            self.save(trainer)

    def save(self, trainer: L.Trainer) -> Path:
        """Save this update as ``step=N.ckpt`` (unless saved already), link ``last.ckpt`` to it, delete the
        expired ones; returns ``last.ckpt``. Every rank must call it (the save is collective)."""
        folder, step = Path(self.dirpath), trainer.global_step
        if step == self._saved_step:
            return folder / "last.ckpt"
        path = folder / f"{STEP_FILENAME.format(step=step)}.ckpt"
        trainer.save_checkpoint(path, weights_only=self.save_weights_only)
        self._saved_step = step
        rank_zero_info(f"checkpoint at update {step}: {path}")
        if trainer.is_global_zero:
            atomic_symlink(path.name, folder / "last.ckpt")
            # Newer ones than this update belong to another history and are left alone.
            older = [p for p in step_checkpoints(folder) if step_of(p) <= step][: -self.keep_last]
            for expired in older:
                if not (self.keep_every and step_of(expired) % self.keep_every == 0):
                    trainer.strategy.remove_checkpoint(expired)
        trainer.strategy.barrier("checkpoint_linked")
        return folder / "last.ckpt"


def save_now(trainer: L.Trainer) -> Path:
    """Save the current state at once; return the path that resumes it.

    Through the trainer's :class:`CheckpointPolicy` (its names, its ``last``; nothing if it saved this
    update already), or else as ``last.ckpt`` in the checkpoint callback's folder. Every rank must call it.
    """
    callback = trainer.checkpoint_callback
    if isinstance(callback, CheckpointPolicy):
        return callback.save(trainer)
    path = Path(getattr(callback, "dirpath", None) or Path(trainer.default_root_dir) / "checkpoints") / "last.ckpt"
    trainer.save_checkpoint(path)
    return path


def _run_folder(trainer: L.Trainer) -> Path:
    """Where Lightning's ``ModelCheckpoint`` puts ``checkpoints/``: the first logger's run folder, or the root."""
    if not trainer.loggers:
        return Path(trainer.default_root_dir)
    logger = trainer.loggers[0]
    version = logger.version if isinstance(logger.version, str) else f"version_{logger.version}"
    return Path(logger.save_dir or trainer.default_root_dir, str(logger.name), version)


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
