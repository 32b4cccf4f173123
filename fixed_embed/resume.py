"""The resume policy: what a checkpoint may be written with, what a resume refuses, takes and re-applies.

- **Writing**: a checkpoint whose weights hold a NaN/inf is refused (:func:`refuse_poisoned`), on
  every rank together, so a good checkpoint on disk is never replaced by a poisoned one.
- **Loading** (:func:`check_resume`): the weights, optimizer moments, step, data position and RNG
  states come from the checkpoint; refused, naming both values, are another interface or backbone
  shape, a change of the optimizer's parameter groups (when fitting), and another number of ranks
  (:mod:`fixed_embed.data.loader_state`); every other setting that differs is printed, and the
  config given now wins.
- **Training start** (:func:`reapply_config`): Lightning restores the optimizer's and scheduler's
  settings from the checkpoint; the config's (LR, betas, weight decay, schedule length) are put back.

:class:`fixed_embed.module.LanguageModel`'s checkpoint hooks call these; the data position itself
lives with the data (:mod:`fixed_embed.data.loader_state`).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch.utilities import rank_zero_info

from fixed_embed.data.loader_state import take_own_loader_state
from fixed_embed.errors import CheckpointError
from fixed_embed.fsdp import UnsafeCheckpointError, load_weights_only
from fixed_embed.lightning_internals import attached_trainer, set_scheduler_last_lr
from fixed_embed.recipe import parameter_groups_change

__all__ = [
    "ResumePlan",
    "changed",
    "check_resume",
    "choose_checkpoint",
    "local_shard",
    "plan_resume",
    "read_checkpoint",
    "reapply_config",
    "refuse_incompatible",
    "refuse_poisoned",
]

# What a resume may not change: the function the weights compute and the token -> input mapping.
# init_std only matters at initialisation; max_seq_len only sizes the RoPE tables.
_RESUMABLE_DECODER_CHANGES = {"init_std", "max_seq_len"}


def local_shard(tensor: torch.Tensor) -> torch.Tensor:
    """This rank's shard of a DTensor (FSDP2), or the tensor itself."""
    return tensor.to_local() if hasattr(tensor, "to_local") else tensor


def refuse_poisoned(checkpoint: Mapping[str, Any], trainer: Any, step: int) -> None:
    """Raise if a weight about to be saved is non-finite; under a trainer, a vote of every rank.

    Raising in ``on_save_checkpoint`` aborts the save. A sharded tensor is checked shard by shard:
    the verdict is a vote, so every rank refuses together.
    """
    poisoned = next(
        (
            name
            for name, tensor in checkpoint.get("state_dict", {}).items()
            if (local := local_shard(tensor)).is_floating_point() and not bool(torch.isfinite(local).all())
        ),
        None,
    )
    if trainer is not None and trainer.strategy.reduce_boolean_decision(poisoned is not None, all=False):
        where = poisoned or "a parameter shard on another rank"
        raise FloatingPointError(f"refusing to write a checkpoint at step {step}: {where} has non-finite values")
    if trainer is None and poisoned is not None:
        raise FloatingPointError(f"refusing to write a checkpoint: {poisoned} has non-finite values")


def check_resume(checkpoint: dict[str, Any], module: Any) -> None:
    """Refuse what a resume cannot change, hand this rank its data position, print what the config changes."""
    saved = checkpoint.get("hyper_parameters") or {}
    refuse_incompatible(saved, module.hparams)
    trainer = attached_trainer(module)
    fitting = trainer is not None and trainer.state.fn == "fit"
    if fitting and (why := parameter_groups_change(saved.get("optimizer"), module.optimizer_config, module)):
        raise CheckpointError(why)
    take_own_loader_state(checkpoint, trainer)
    if getattr(module, "_resume_planned", False):
        return  # the CLI's resume plan printed the changes before any work
    for line in changed(saved, module.hparams):
        rank_zero_info(f"resume: {line}")


def refuse_incompatible(saved: Mapping[str, Any], now: Mapping[str, Any]) -> None:
    problems = []
    if "interface" in saved and saved["interface"] != now.get("interface"):
        problems.append(f"model.interface: checkpoint {saved['interface']}, config {now.get('interface')}")
    for key, value in (saved.get("decoder") or {}).items():
        current = (now.get("decoder") or {}).get(key)
        if key not in _RESUMABLE_DECODER_CHANGES and value != current:
            problems.append(f"model.decoder.{key}: checkpoint {value!r}, config {current!r}")
    if problems:
        raise CheckpointError(
            "refusing to resume: the checkpoint's model differs from the config's in what a resume cannot change: "
            + "; ".join(problems)
            + ". Resume with the run's own config, or start a new run (--run NAME) without --ckpt_path."
        )


def changed(saved: Mapping[str, Any], now: Mapping[str, Any]) -> list[str]:
    """The settings a resume takes from the config instead of the checkpoint, where they differ."""
    lines = []
    for key in ("optimizer", "schedule", "parallel", "token_budget", "on_nonfinite", "max_skipped_updates",
                "loss_chunk_tokens"):  # fmt: skip
        old, new = saved.get(key), now.get(key)
        if key not in saved or old == new:
            continue
        if isinstance(old, Mapping) and isinstance(new, Mapping):
            lines += [
                f"model.{key}.{k}: {old.get(k)!r} in the checkpoint -> {new.get(k)!r} now"
                for k in sorted(set(old) | set(new))
                if old.get(k) != new.get(k)
            ]
        else:
            lines.append(f"model.{key}: {old!r} in the checkpoint -> {new!r} now")
    return lines


def reapply_config(optimizer: torch.optim.Optimizer, scheduler: Any, fresh_groups: list[dict[str, Any]]) -> None:
    """Put the config's optimizer settings (``fresh_groups``: ``configure_optimizers``' groups, without
    their parameters) back over those a resume restored, and the LR the config's schedule gives at this step."""
    for group, fresh in zip(optimizer.param_groups, fresh_groups, strict=True):
        group.update(fresh)
    scheduler.base_lrs = [fresh["initial_lr"] for fresh in fresh_groups]
    for group, base, factor in zip(optimizer.param_groups, scheduler.base_lrs, scheduler.lr_lambdas, strict=True):
        group["lr"] = base * factor(scheduler.last_epoch)
    set_scheduler_last_lr(scheduler, [group["lr"] for group in optimizer.param_groups])


# -- the resume plan: every refusal a checkpoint can tell, before any work ----------------------------------

_STEP_NAME = re.compile(r"step=(\d+)")
# The datamodule settings a saved data position depends on (beyond its stream fingerprint): the loader's
# layout changes between 0 and N workers, and each worker is a reader of its own share.


def read_checkpoint(path: str | os.PathLike) -> dict[str, Any]:
    """A checkpoint's contents, memory-mapped and weights-only (a sharded folder: its ``meta.pt``, no shards)."""
    path = Path(path)
    target = path / "meta.pt" if path.is_dir() else path
    try:
        checkpoint = load_weights_only(target, path, mmap=True)
    except UnsafeCheckpointError:
        raise
    except Exception as error:
        first = str(error).splitlines()[0] if str(error) else ""
        raise CheckpointError(
            f"cannot read checkpoint {path}: it is not a checkpoint written by fixed-embed fit "
            f"({type(error).__name__}: {first[:160]}); pass the run's last.ckpt or step=N.ckpt"
        ) from error
    hparams = checkpoint.get("hyper_parameters") if isinstance(checkpoint, dict) else None
    if (
        not isinstance(checkpoint, dict)
        or not isinstance(checkpoint.get("global_step"), int)
        or not isinstance(hparams, Mapping)
        or not all(isinstance(hparams.get(key, {}), Mapping) for key in ("decoder", "interface", "optimizer"))
    ):
        what = type(checkpoint).__name__ if not isinstance(checkpoint, dict) else f"keys {sorted(checkpoint)[:8]}"
        raise CheckpointError(
            f"cannot read checkpoint {path}: it is not a checkpoint written by fixed-embed fit ({what}: no update "
            "count or model hyper-parameters); pass the run's last.ckpt or step=N.ckpt"
        )
    return checkpoint


def _step_of(path: Path) -> int | None:
    match = _STEP_NAME.search(path.name)
    return int(match.group(1)) if match else None


def choose_checkpoint(folder: Path) -> tuple[Path | None, dict[str, Any] | None, list[str]]:
    """The checkpoint ``--ckpt_path last`` resumes in a run's ``checkpoints`` folder, its contents, and notes.

    ``last.ckpt`` is a link to the newest ``step=N.ckpt``. A link left behind by a save interrupted
    before it moved (a newer ``step=N`` exists) gives way to the newest. A *regular* ``last.ckpt``
    (restored from a backup, copied by hand) older than the newest ``step=N`` is refused: resuming it
    would roll the run back and fork its history.
    """
    if not folder.is_dir():
        return None, None, []
    steps = sorted((p for p in folder.glob("step=*.ckpt") if _step_of(p) is not None), key=_step_of)
    newest = steps[-1] if steps else None
    last = folder / "last.ckpt"
    if last.is_symlink():
        target = folder / os.readlink(last)
        if not target.exists():
            if newest is None:
                return None, None, [f"{last} links to the missing {target.name}, and no step=N.ckpt is left"]
            return newest, read_checkpoint(newest), [f"{last} links to the missing {target.name}: resuming {newest}"]
        if newest is not None and (_step_of(target) or -1) < _step_of(newest):
            note = f"{last} links to {target.name} but {newest.name} is newer (a save ended before the link moved)"
            return newest, read_checkpoint(newest), [f"{note}: resuming {newest}"]
        return target, read_checkpoint(target), []
    if last.exists():
        checkpoint = read_checkpoint(last)
        step = checkpoint.get("global_step")
        if newest is not None and isinstance(step, int) and step < _step_of(newest):
            raise CheckpointError(
                f"{last} is a regular file at update {step}, but {newest} (update {_step_of(newest)}) is newer: "
                "resuming it would roll the run back and fork its history. Move the stale last.ckpt away to "
                f"resume {newest.name}, or pass --ckpt_path {last} to resume update {step} on purpose"
            )
        return last, checkpoint, []
    if newest is None:
        return None, None, []
    return newest, read_checkpoint(newest), []


@dataclass
class ResumePlan:
    """What a resume does, decided before any work: printed line by line; ``complete``: nothing to train."""

    path: Path
    step: int
    max_steps: int | None
    lines: list[str] = field(default_factory=list)
    complete: bool = False


def plan_resume(
    checkpoint: Mapping[str, Any],
    path: Path,
    model: Any,
    datamodule: Any,
    world_size: int | None,
    max_steps: int | None,
) -> ResumePlan:
    """Refuse what the checkpoint cannot resume under the config given now; say what it changes.

    ``model``: the config's ``LanguageModel`` (built on the meta device); ``datamodule``: its
    ``TextDataModule`` (not set up); ``world_size``: nodes x devices (None: not known before launch);
    ``max_steps``: the run's length in updates (None: unknown). Raises :class:`CheckpointError` with
    every refusal; the plan's lines otherwise.
    """
    step = checkpoint.get("global_step")
    step = step if isinstance(step, int) else 0
    plan = ResumePlan(path, step, max_steps)
    saved = checkpoint.get("hyper_parameters") or {}
    refusals: list[str] = []
    try:
        refuse_incompatible(saved, model.hparams)
    except CheckpointError as error:
        refusals.append(str(error))
    if why := parameter_groups_change(saved.get("optimizer"), model.optimizer_config, model):
        refusals.append(why)
    refusals += datamodule.resume_refusals(checkpoint, world_size)
    if max_steps is not None and max_steps > 0 and step > max_steps:
        refusals.append(
            f"refusing to resume: {path} is at update {step}, beyond the run's length of {max_steps} updates "
            f"(trainer.max_steps or model.token_budget): nothing would be trained. Raise --trainer.max_steps above "
            f"{step} to train on, or evaluate the checkpoint (fixed-embed eval {path})"
        )
    if refusals:
        raise CheckpointError("\n".join(refusals) if len(refusals) == 1 else " | ".join(refusals))
    plan.lines += [f"resume: {line}" for line in changed(saved, model.hparams)]
    saved_data, data_now = checkpoint.get("datamodule_hyper_parameters") or {}, datamodule.hparams
    if "batch_size" in saved_data and saved_data["batch_size"] != data_now.get("batch_size"):
        plan.lines.append(
            f"resume: data.batch_size: {saved_data['batch_size']!r} in the checkpoint -> "
            f"{data_now.get('batch_size')!r} now (sequences per device per micro-batch: the global batch changes)"
        )
    plan.complete = max_steps is not None and max_steps > 0 and step == max_steps
    return plan
