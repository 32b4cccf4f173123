"""Resume, decided in one place (docs/faults.md, "The resume plan, before any work" and "What a
resume keeps, takes and refuses"): which checkpoint a fit resumes and every refusal, before any
work (:func:`plan_fit`); the same refusals when LanguageModel loads a checkpoint, what it takes
from the config and re-applies; what a checkpoint may be written with."""

from __future__ import annotations

import importlib
import os
import shlex
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch.utilities import rank_zero_info

from fixed_embed.data.loader_state import take_own_loader_state
from fixed_embed.distributed.checkpoint import UnsafeCheckpointError, load_weights_only
from fixed_embed.distributed.ranks import is_launching_rank
from fixed_embed.errors import CheckpointError, ConfigError, RunComplete
from fixed_embed.lightning_internals import attached_trainer, set_scheduler_last_lr
from fixed_embed.model.recipe import parameter_groups_change
from fixed_embed.run.folder import LAST, benchmark_folder, step_checkpoints, step_of

# A resume may not change what the weights compute: init_std acts only at init, max_seq_len only
# bounds the input's length.
_RESUMABLE_DECODER_CHANGES = {"init_std", "max_seq_len"}
# The model settings a resume takes from the config instead of the checkpoint.
_TAKEN_FROM_CONFIG = (
    "optimizer",
    "schedule",
    "parallel",
    "token_budget",
    "on_nonfinite",
    "max_skipped_updates",
    "loss_chunk_tokens",
)


def _load(path: Path) -> Any:
    """A checkpoint file (a sharded folder: its ``meta.pt``, no shards), memory-mapped and
    weights-only."""
    return load_weights_only(path / "meta.pt" if path.is_dir() else path, path, mmap=True)


def read_checkpoint(path: str | os.PathLike) -> dict[str, Any]:
    """A checkpoint's contents (:func:`_load`), refused unless fixed-embed fit wrote it."""
    path = Path(path)
    try:
        checkpoint = _load(path)
    except UnsafeCheckpointError:
        raise
    except CheckpointError as error:
        raise CheckpointError(f"{error}{_instead(path)}") from error
    hparams = checkpoint.get("hyper_parameters") if isinstance(checkpoint, dict) else None
    readable = isinstance(hparams, Mapping) and all(
        isinstance(hparams.get(part, {}), Mapping) for part in ("decoder", "interface", "optimizer")
    )
    if not (readable and isinstance(checkpoint.get("global_step"), int)):
        what = (
            f"keys {sorted(checkpoint)[:8]}"
            if isinstance(checkpoint, dict)
            else type(checkpoint).__name__
        )
        raise CheckpointError(
            f"cannot read checkpoint {path}: it is not a checkpoint written by fixed-embed fit "
            f"({what}: no update count or model hyper-parameters){_instead(path)}"
        )
    return checkpoint


def _instead(path: Path) -> str:
    """The fix for an unreadable checkpoint: the newest step=N.ckpt beside it that loads, and
    how to resume it."""
    for other in reversed(step_checkpoints(path.resolve().parent)):
        if other.resolve() == path.resolve():
            continue
        try:  # CRC-32s checked (seconds a GB); plan_fit checks it against the config once passed
            step = _load(other)["global_step"]
        except Exception:
            continue
        return (
            f";\nrelaunch with --ckpt_path {other} to resume the newest readable one beside it "
            f"(update {step})"
        )
    return "; pass the run's last.ckpt or step=N.ckpt"


def choose_checkpoint(folder: Path) -> tuple[Path | None, dict[str, Any] | None, list[str]]:
    """The checkpoint ``--ckpt_path last`` resumes in ``folder``, its contents, and notes. A
    stale ``last.ckpt`` link gives way to a newer ``step=N.ckpt``; a stale *regular* one is
    refused: it would fork the run's history."""
    if not folder.is_dir():
        return None, None, []
    steps = step_checkpoints(folder)
    newest, last = steps[-1] if steps else None, folder / LAST
    if last.is_symlink():
        target = folder / os.readlink(last)
        if not target.exists():
            stale = f"{last} links to the missing {target.name}"
        elif newest is not None and (step_of(target) or -1) < step_of(newest):
            stale = (
                f"{last} links to {target.name} but {newest.name} is newer (a save ended before "
                "the link moved)"
            )
        else:
            return target, read_checkpoint(target), []
        if newest is None:
            return None, None, [f"{stale}, and no step=N.ckpt is left"]
        return newest, read_checkpoint(newest), [f"{stale}: resuming {newest}"]
    if last.exists():
        checkpoint = read_checkpoint(last)
        if newest is not None and (step := checkpoint["global_step"]) < step_of(newest):
            raise CheckpointError(
                f"{last} is a regular file at update {step}, but {newest} (update "
                f"{step_of(newest)}) is newer: resuming it would roll the run back and fork its "
                f"history. Move the stale last.ckpt away to resume {newest.name}, or pass "
                f"--ckpt_path {last} to resume update {step} on purpose"
            )
        return last, checkpoint, []
    return (newest, read_checkpoint(newest), []) if newest is not None else (None, None, [])


def _chosen(ckpt_path: str | None, checkpoints: Path | None) -> tuple[Path, dict] | None:
    """The checkpoint a fit given ``--ckpt_path`` resumes (None: a fresh start); ``checkpoints``:
    the run folder's, if any."""
    if ckpt_path not in ("last", None):
        return Path(ckpt_path), read_checkpoint(ckpt_path)
    if checkpoints is None:
        if ckpt_path is None:
            return None
        raise ConfigError(
            "--ckpt_path last resumes the run folder's newest checkpoint, and with trainer.logger "
            "off this fit has no run folder: pass the checkpoint file, or keep the logger"
        )
    path, checkpoint, notes = choose_checkpoint(checkpoints)
    if ckpt_path is None and path is not None:
        raise ConfigError(
            f"run folder {checkpoints.parent} already holds checkpoints (newest: {path.name}, "
            f"update {checkpoint.get('global_step', '?')}): add --ckpt_path last to continue it, "
            "or --run NEW_NAME to start another run"
        )
    for note in notes:
        rank_zero_info(note)
    if path is None and ckpt_path == "last":
        rank_zero_info(f"no checkpoint in {checkpoints}: starting at update 0")
    return None if path is None else (path, checkpoint)


def plan_fit(
    config: Any, checkpoints: Path | None, max_steps: int, build: Callable[[Any], tuple]
) -> tuple[str | None, int | None]:
    """The ``ckpt_path`` for Lightning and its update ((None, None): a fresh start); prints what
    it changes. Raises every refusal at once (CheckpointError), RunComplete if nothing is left.
    ``build(config)``: the model, data module and world size the checkpoint must fit (passed in:
    the model's module imports this one)."""
    if (chosen := _chosen(config.ckpt_path, checkpoints)) is None:
        return None, None
    path, checkpoint = chosen
    model, datamodule, world_size = build(config)
    step = checkpoint["global_step"]
    beyond = []
    if step > max_steps:
        beyond.append(
            f"refusing to resume: {path} is at update {step}, beyond the run's length of "
            f"{max_steps} updates (trainer.max_steps or model.token_budget): nothing would be "
            f"trained. Raise --trainer.max_steps above {step} to train on, or evaluate the "
            f"checkpoint (fixed-embed eval {path})"
        )
    _refuse(checkpoint, model, datamodule, world_size, True, *beyond)
    into = checkpoints is not None and config.ckpt_path != "last"
    where = f" into {checkpoints.parent}" if into else ""
    rank_zero_info(f"resuming {path} at update {step} of {max_steps}{where}")
    _say_changes(checkpoint, model, datamodule)
    if step == max_steps:
        raise RunComplete(
            _complete_message(path, step, config.trainer.callbacks or [], checkpoints)
        )
    return str(path), step


def _complete_message(path: Path, step: int, callbacks: list, checkpoints: Path | None) -> str:
    """That the run is complete, and the command that writes its final benchmark if an
    interruption lost it."""
    message = (
        f"run complete: {path} is at update {step}, the run's length: nothing to train (raise "
        "--trainer.max_steps to train on)"
    )
    folder = benchmark_folder(checkpoints.parent, step) if checkpoints is not None else None
    if folder is None or (folder / "results.json").is_file():
        return message
    # the callback that writes a final benchmark says how (it is only built here)
    for spec in callbacks:
        spec = spec if isinstance(spec, dict) else spec.as_dict()
        module, name = str(spec.get("class_path")).rsplit(".", 1)
        cls = getattr(importlib.import_module(module), name, None)
        if hasattr(cls, "final_eval_command"):
            command = cls(**(spec.get("init_args") or {})).final_eval_command(path, folder)
            if command is not None:
                lost = f"the final benchmark at update {step} did not run (interrupted)"
                return f"{message}\n{lost}; get it with: {shlex.join(command)}"
    return message


def _refuse(
    checkpoint: Mapping[str, Any],
    module: Any,
    datamodule: Any,
    world_size: int | None,
    fitting: bool,
    *more: str,
) -> None:
    """Raise every reason ``checkpoint`` cannot resume as ``module``: another interface or
    backbone shape; and (``fitting``) parameter groups its optimizer state cannot follow, what
    ``datamodule`` refuses on ``world_size`` ranks, and ``more``."""
    saved, now = checkpoint.get("hyper_parameters") or {}, module.hparams
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
            "refusing to resume: the checkpoint's model differs from the config's in what a "
            f"resume cannot change: {'; '.join(problems)}. Resume with the run's own config, or "
            "start a new run (--run NAME) without --ckpt_path."
        )
    if fitting and (
        why := parameter_groups_change(saved.get("optimizer"), module.optimizer_config, module)
    ):
        refusals.append(why)
    if fitting and (data := getattr(datamodule, "resume_refusals", None)):
        refusals += data(checkpoint, world_size)
    if refusals := [*refusals, *more]:
        raise CheckpointError(" | ".join(refusals))


def _say_changes(checkpoint: Mapping[str, Any], module: Any, datamodule: Any = None) -> None:
    """Print the settings a resume takes from the config instead of the checkpoint, where they
    differ."""
    saved, now, lines = checkpoint.get("hyper_parameters") or {}, module.hparams, []
    for key in (key for key in _TAKEN_FROM_CONFIG if key in saved):
        old, new = saved.get(key), now.get(key)
        if isinstance(old, Mapping) and isinstance(new, Mapping):
            keys = [k for k in sorted(set(old) | set(new)) if old.get(k) != new.get(k)]
            lines += [
                f"model.{key}.{k}: {old.get(k)!r} in the checkpoint -> {new.get(k)!r} now"
                for k in keys
            ]
        elif old != new:
            lines.append(f"model.{key}: {old!r} in the checkpoint -> {new!r} now")
    then = (checkpoint.get("datamodule_hyper_parameters") or {}).get("batch_size")
    if datamodule is not None and then not in (None, datamodule.hparams.batch_size):
        lines.append(
            f"data.batch_size: {then!r} in the checkpoint -> {datamodule.hparams.batch_size!r} "
            "now (sequences per device per micro-batch: the global batch changes)"
        )
    for line in lines:
        rank_zero_info(f"resume: {line}")


def check_resume(checkpoint: dict[str, Any], module: Any, say_changes: bool = True) -> None:
    """At load: refuse what a resume cannot change, hand this rank its data position, print what
    the config changes."""
    trainer = attached_trainer(module)
    fitting = trainer is not None and trainer.state.fn == "fit"
    datamodule, world_size = (
        getattr(trainer, "datamodule", None),
        getattr(trainer, "world_size", None),
    )
    _refuse(checkpoint, module, datamodule, world_size, fitting)
    if fitting:
        take_own_loader_state(checkpoint, trainer.global_rank)
    if say_changes:
        _say_changes(checkpoint, module)


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


def purge_curve_after(trainer: Any, step: int) -> None:
    """Hide the TensorBoard events a crashed launch logged at steps >= ``step``, the resumed
    checkpoint's. As ``SummaryWriter(purge_step=...)``: readers drop earlier events from a
    ``SessionLog.START``'s step on."""
    from lightning.pytorch.loggers import TensorBoardLogger

    if not isinstance(trainer.logger, TensorBoardLogger) or not is_launching_rank():
        return
    from tensorboard.compat.proto.event_pb2 import Event, SessionLog

    trainer.logger.experiment.file_writer.add_event(
        Event(step=step, session_log=SessionLog(status=SessionLog.START))
    )


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
