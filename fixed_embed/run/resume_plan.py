"""The resume plan: which checkpoint a fit resumes, and every refusal, before any work
(docs/faults.md, "The resume plan, before any work"; the load-time checks:
:mod:`fixed_embed.train.resume`)."""

from __future__ import annotations

import importlib
import os
import shlex
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from lightning.pytorch.utilities import rank_zero_info

from fixed_embed.distributed.checkpoint import UnsafeCheckpointError, load_weights_only
from fixed_embed.errors import CheckpointError, ConfigError, RunComplete
from fixed_embed.run.folder import LAST, benchmark_folder, step_checkpoints, step_of
from fixed_embed.train.resume import changed, model_refusals


def read_checkpoint(path: str | os.PathLike) -> dict[str, Any]:
    """A checkpoint's contents, memory-mapped and weights-only (a sharded folder: its
    ``meta.pt``, no shards)."""
    path = Path(path)
    target = path / "meta.pt" if path.is_dir() else path
    try:
        checkpoint = load_weights_only(target, path, mmap=True)
    except UnsafeCheckpointError:
        raise
    except CheckpointError as error:
        raise CheckpointError(f"{error}{_instead(path)}") from error
    hparams = checkpoint.get("hyper_parameters") if isinstance(checkpoint, dict) else None
    parts = ("decoder", "interface", "optimizer")
    readable = isinstance(hparams, Mapping) and all(
        isinstance(hparams.get(part, {}), Mapping) for part in parts
    )
    if not (readable and isinstance(checkpoint.get("global_step"), int)):
        what = (
            type(checkpoint).__name__
            if not isinstance(checkpoint, dict)
            else f"keys {sorted(checkpoint)[:8]}"
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
            step = load_weights_only(
                other / "meta.pt" if other.is_dir() else other, other, mmap=True
            )["global_step"]
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
    newest = steps[-1] if steps else None
    last = folder / LAST
    if last.is_symlink():
        target = folder / os.readlink(last)
        if not target.exists():
            if newest is None:
                return (
                    None,
                    None,
                    [f"{last} links to the missing {target.name}, and no step=N.ckpt is left"],
                )
            return (
                newest,
                read_checkpoint(newest),
                [f"{last} links to the missing {target.name}: resuming {newest}"],
            )
        if newest is not None and (step_of(target) or -1) < step_of(newest):
            note = (
                f"{last} links to {target.name} but {newest.name} is newer (a save ended before "
                "the link moved)"
            )
            return newest, read_checkpoint(newest), [f"{note}: resuming {newest}"]
        return target, read_checkpoint(target), []
    if last.exists():
        checkpoint = read_checkpoint(last)
        step = checkpoint.get("global_step")
        if newest is not None and isinstance(step, int) and step < step_of(newest):
            raise CheckpointError(
                f"{last} is a regular file at update {step}, but {newest} (update "
                f"{step_of(newest)}) is newer: "
                "resuming it would roll the run back and fork its history. Move the stale "
                "last.ckpt away to "
                f"resume {newest.name}, or pass --ckpt_path {last} to resume update {step} on "
                "purpose"
            )
        return last, checkpoint, []
    return (newest, read_checkpoint(newest), []) if newest is not None else (None, None, [])


def plan_fit(
    config: Any, checkpoints: Path | None, max_steps: int
) -> tuple[str | None, int | None]:
    """The ``ckpt_path`` for Lightning and its update ((None, None): a fresh start;
    ``checkpoints``: the run folder's, if any); prints what it changes. Raises every refusal at
    once (CheckpointError), RunComplete if nothing is left."""
    ckpt_path = config.ckpt_path
    if ckpt_path in ("last", None) and checkpoints is not None:
        path, checkpoint, notes = choose_checkpoint(checkpoints)
        if ckpt_path is None and path is not None:
            raise ConfigError(
                f"run folder {checkpoints.parent} already holds checkpoints (newest: {path.name}, "
                "update "
                f"{checkpoint.get('global_step', '?')}): add --ckpt_path last to continue it, or "
                "--run "
                "NEW_NAME to start another run"
            )
        for note in notes:
            rank_zero_info(note)
        if path is None:
            if ckpt_path == "last":
                rank_zero_info(f"no checkpoint in {checkpoints}: starting at update 0")
            return None, None
    elif ckpt_path == "last":
        raise ConfigError(
            "--ckpt_path last resumes the run folder's newest checkpoint, and with trainer.logger "
            "off "
            "this fit has no run folder: pass the checkpoint file, or keep the logger"
        )
    elif ckpt_path is None:
        return None, None
    else:
        path = Path(ckpt_path)
        checkpoint = read_checkpoint(path)
    from fixed_embed.data import TextDataModule
    from fixed_embed.train.experiment import build_model, trainer_world_size

    model, datamodule = build_model(config.model.as_dict()), TextDataModule(**config.data.as_dict())
    step, saved = checkpoint["global_step"], checkpoint["hyper_parameters"]
    refusals = model_refusals(saved, model, fitting=True)
    refusals += datamodule.resume_refusals(checkpoint, trainer_world_size(config.trainer))
    if step > max_steps:
        refusals.append(
            f"refusing to resume: {path} is at update {step}, beyond the run's length of "
            f"{max_steps} "
            "updates (trainer.max_steps or model.token_budget): nothing would be trained. Raise "
            f"--trainer.max_steps above {step} to train on, or evaluate the checkpoint "
            "(fixed-embed eval "
            f"{path})"
        )
    if refusals:
        raise CheckpointError(" | ".join(refusals))
    where = f" into {checkpoints.parent}" if checkpoints is not None and ckpt_path != "last" else ""
    rank_zero_info(f"resuming {path} at update {step} of {max_steps}{where}")
    for line in changed(saved, model.hparams):
        rank_zero_info(f"resume: {line}")
    then, now = (
        (checkpoint.get("datamodule_hyper_parameters") or {}).get("batch_size"),
        datamodule.hparams.batch_size,
    )
    if then is not None and then != now:
        rank_zero_info(
            f"resume: data.batch_size: {then!r} in the checkpoint -> {now!r} now (sequences per "
            "device per "
            "micro-batch: the global batch changes)"
        )
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
    for (
        spec
    ) in callbacks:  # the callback that writes a final benchmark says how (it is only built here)
        spec = spec if isinstance(spec, dict) else spec.as_dict()
        module, name = str(spec.get("class_path")).rsplit(".", 1)
        cls = getattr(importlib.import_module(module), name, None)
        if hasattr(cls, "final_eval_command"):
            command = cls(**(spec.get("init_args") or {})).final_eval_command(path, folder)
            if command is not None:
                lost = f"the final benchmark at update {step} did not run (interrupted)"
                return f"{message}\n{lost}; get it with: {shlex.join(command)}"
    return message
