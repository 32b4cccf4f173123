"""The resume policy, called by LanguageModel's checkpoint hooks (docs/faults.md, "What a resume
keeps, takes and refuses"): what a checkpoint may be written with, what a resume refuses, takes
and re-applies."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from lightning.pytorch.utilities import rank_zero_info

from fixed_embed.data.loader_state import take_own_loader_state
from fixed_embed.errors import CheckpointError
from fixed_embed.lightning_internals import attached_trainer, set_scheduler_last_lr
from fixed_embed.model.recipe import parameter_groups_change

# A resume may not change what the weights compute: init_std acts only at init, max_seq_len only
# sizes RoPE tables.
_RESUMABLE_DECODER_CHANGES = {"init_std", "max_seq_len"}


def local_shard(tensor: torch.Tensor) -> torch.Tensor:
    """This rank's shard of a DTensor (FSDP2), or the tensor itself."""
    return tensor.to_local() if hasattr(tensor, "to_local") else tensor


def refuse_poisoned(checkpoint: Mapping[str, Any], trainer: Any, step: int) -> None:
    """Raise ``FloatingPointError`` (aborting the save) if a weight is non-finite; under a
    trainer, all ranks vote."""
    state = checkpoint.get("state_dict", {}).items()
    poisoned = next(
        (
            name
            for name, t in state
            if t.is_floating_point() and not local_shard(t).isfinite().all()
        ),
        None,
    )
    anywhere = poisoned is not None
    if trainer is not None:
        anywhere = trainer.strategy.reduce_boolean_decision(anywhere, all=False)
    if anywhere:
        where = poisoned or "a parameter shard on another rank"
        raise FloatingPointError(
            f"refusing to write a checkpoint at step {step}: {where} has non-finite values"
        )


def check_resume(checkpoint: dict[str, Any], module: Any, say_changes: bool = True) -> None:
    """Refuse what a resume cannot change, hand this rank its data position, print what the
    config changes."""
    saved = checkpoint.get("hyper_parameters") or {}
    trainer = attached_trainer(module)
    if refusals := model_refusals(
        saved, module, fitting=trainer is not None and trainer.state.fn == "fit"
    ):
        raise CheckpointError(" | ".join(refusals))
    take_own_loader_state(checkpoint, trainer)
    for line in changed(saved, module.hparams) if say_changes else []:
        rank_zero_info(f"resume: {line}")


def model_refusals(saved: Mapping[str, Any], module: Any, fitting: bool) -> list[str]:
    """Why the checkpoint's model hyper-parameters (``saved``) cannot resume as ``module``:
    another interface or backbone shape, and (``fitting``) parameter groups the checkpoint's
    optimizer state cannot follow."""
    now = module.hparams
    problems = []
    if "interface" in saved and saved["interface"] != now.get("interface"):
        problems.append(
            f"model.interface: checkpoint {saved['interface']}, config {now.get('interface')}"
        )
    for key, value in (saved.get("decoder") or {}).items():
        current = (now.get("decoder") or {}).get(key)
        if key not in _RESUMABLE_DECODER_CHANGES and value != current:
            problems.append(f"model.decoder.{key}: checkpoint {value!r}, config {current!r}")
    refusals = []
    if problems:
        refusals.append(
            "refusing to resume: the checkpoint's model differs from the config's in what a resume "
            "cannot change: "
            + "; ".join(problems)
            + ". Resume with the run's own config, or start a new run (--run NAME) without "
            "--ckpt_path."
        )
    if fitting and (
        why := parameter_groups_change(saved.get("optimizer"), module.optimizer_config, module)
    ):
        refusals.append(why)
    return refusals


def changed(saved: Mapping[str, Any], now: Mapping[str, Any]) -> list[str]:
    """The settings a resume takes from the config instead of the checkpoint, where they differ."""
    lines = []
    for key in (
        "optimizer",
        "schedule",
        "parallel",
        "token_budget",
        "on_nonfinite",
        "max_skipped_updates",
        "loss_chunk_tokens",
    ):
        old, new = saved.get(key), now.get(key)
        if key not in saved or old == new:
            continue
        if isinstance(old, Mapping) and isinstance(new, Mapping):
            keys = [k for k in sorted(set(old) | set(new)) if old.get(k) != new.get(k)]
            lines += [
                f"model.{key}.{k}: {old.get(k)!r} in the checkpoint -> {new.get(k)!r} now"
                for k in keys
            ]
        else:
            lines.append(f"model.{key}: {old!r} in the checkpoint -> {new!r} now")
    return lines


def reapply_config(
    optimizer: torch.optim.Optimizer, scheduler: Any, fresh_groups: list[dict[str, Any]]
) -> None:
    """Put the config's optimizer settings (``fresh_groups``: ``configure_optimizers``' groups,
    without their parameters) back over those a resume restored, and the LR the config's
    schedule gives at this step."""
    for group, fresh, factor in zip(
        optimizer.param_groups, fresh_groups, scheduler.lr_lambdas, strict=True
    ):
        group.update(fresh, lr=fresh["initial_lr"] * factor(scheduler.last_epoch))
    scheduler.base_lrs = [fresh["initial_lr"] for fresh in fresh_groups]
    set_scheduler_last_lr(scheduler, [group["lr"] for group in optimizer.param_groups])
