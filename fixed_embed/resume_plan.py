"""The resume plan: which checkpoint a fit resumes, and everything it can refuse, before any work.

The checkpoint is read once (memory-mapped, weights-only) and checked against the config's model
(built on the meta device) and data module (not set up): every refusal at once, what the config
changes, and whether the run is already complete. The checks at load time, for runs that do not
come through ``fixed-embed fit``, are :mod:`fixed_embed.resume`'s.
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lightning.pytorch.utilities import rank_zero_info

from fixed_embed.errors import CheckpointError, ConfigError
from fixed_embed.fsdp import UnsafeCheckpointError, load_weights_only
from fixed_embed.recipe import parameter_groups_change
from fixed_embed.resume import changed, refuse_incompatible
from fixed_embed.run_folder import step_checkpoints, step_of

__all__ = ["ResumePlan", "RunComplete", "choose_checkpoint", "plan_fit", "plan_resume", "read_checkpoint"]


class RunComplete(Exception):
    """The checkpoint to resume is at the run's length: nothing to train (the message says so, and what is left)."""


@dataclass
class ResumePlan:
    """What a resume does, decided before any work: printed line by line; ``complete``: nothing to train."""

    path: Path
    step: int
    max_steps: int | None
    lines: list[str] = field(default_factory=list)
    complete: bool = False


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


def choose_checkpoint(folder: Path) -> tuple[Path | None, dict[str, Any] | None, list[str]]:
    """The checkpoint ``--ckpt_path last`` resumes in a run's ``checkpoints`` folder, its contents, and notes.

    ``last.ckpt`` is a link to the newest ``step=N.ckpt``. A link left behind by a save interrupted
    before it moved (a newer ``step=N`` exists) gives way to the newest. A *regular* ``last.ckpt``
    (restored from a backup, copied by hand) older than the newest ``step=N`` is refused: resuming it
    would roll the run back and fork its history.
    """
    if not folder.is_dir():
        return None, None, []
    steps = step_checkpoints(folder)
    newest = steps[-1] if steps else None
    last = folder / "last.ckpt"
    if last.is_symlink():
        target = folder / os.readlink(last)
        if not target.exists():
            if newest is None:
                return None, None, [f"{last} links to the missing {target.name}, and no step=N.ckpt is left"]
            return newest, read_checkpoint(newest), [f"{last} links to the missing {target.name}: resuming {newest}"]
        if newest is not None and (step_of(target) or -1) < step_of(newest):
            note = f"{last} links to {target.name} but {newest.name} is newer (a save ended before the link moved)"
            return newest, read_checkpoint(newest), [f"{note}: resuming {newest}"]
        return target, read_checkpoint(target), []
    if last.exists():
        checkpoint = read_checkpoint(last)
        step = checkpoint.get("global_step")
        if newest is not None and isinstance(step, int) and step < step_of(newest):
            raise CheckpointError(
                f"{last} is a regular file at update {step}, but {newest} (update {step_of(newest)}) is newer: "
                "resuming it would roll the run back and fork its history. Move the stale last.ckpt away to "
                f"resume {newest.name}, or pass --ckpt_path {last} to resume update {step} on purpose"
            )
        return last, checkpoint, []
    if newest is None:
        return None, None, []
    return newest, read_checkpoint(newest), []


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


def plan_fit(config: Any, checkpoints: Path | None, max_steps: int) -> tuple[str | None, ResumePlan | None]:
    """The checkpoint a fit resumes (the ``ckpt_path`` to give Lightning) and its plan, printed; no plan: a
    fresh start (or Lightning's own ``last`` without a run folder). Every refusal is raised here;
    :class:`RunComplete` when there is nothing to train.

    ``config``: the ``fit`` command's parsed config; ``checkpoints``: the run folder's (None without one).
    """
    ckpt_path = config.ckpt_path
    if ckpt_path in ("last", None) and checkpoints is not None:
        path, checkpoint, notes = choose_checkpoint(checkpoints)
        if ckpt_path is None and path is not None:
            raise ConfigError(
                f"run folder {checkpoints.parent} already holds checkpoints (newest: {path.name}, update "
                f"{checkpoint.get('global_step', '?')}): add --ckpt_path last to continue it, or --run NEW_NAME to "
                "start another run"
            )
        for note in notes:
            rank_zero_info(note)
        if path is None:
            if ckpt_path == "last":
                rank_zero_info(f"no checkpoint in {checkpoints}: starting at update 0")
            return None, None
    elif ckpt_path in ("last", None):
        return ckpt_path, None
    else:
        path = Path(ckpt_path)
        checkpoint = read_checkpoint(path)
    from fixed_embed.data import TextDataModule
    from fixed_embed.experiment import build_model, trainer_world_size

    model, datamodule = build_model(config.model.as_dict()), TextDataModule(**config.data.as_dict())
    plan = plan_resume(checkpoint, path, model, datamodule, trainer_world_size(config.trainer), max_steps)
    where = f" into {checkpoints.parent}" if checkpoints is not None and ckpt_path != "last" else ""
    rank_zero_info(f"resuming {path} at update {plan.step} of {plan.max_steps}{where}")
    for line in plan.lines:
        rank_zero_info(line)
    if plan.complete:
        raise RunComplete(_complete_message(plan, config.trainer.callbacks or [], checkpoints))
    return str(path), plan


def _complete_message(plan: ResumePlan, callbacks: list, checkpoints: Path | None) -> str:
    """That the run is complete, and the command that writes its final benchmark if an interruption lost it."""
    lines = [
        f"run complete: {plan.path} is at update {plan.step}, the run's length ({plan.max_steps} updates): nothing "
        f"to train (raise --trainer.max_steps to train on)"
    ]
    bench = _final_benchmark(callbacks)
    folder = checkpoints.parent / "benchmarks" / f"step_{plan.step:08d}" if checkpoints is not None else None
    if bench is not None and folder is not None and not (folder / "results.json").is_file():
        command = ["fixed-embed", "eval", str(plan.path), "--tasks", ",".join(bench.get("tasks") or
                   ["fixed_embed_word_order"])]  # fmt: skip
        if bench.get("limit") is not None:
            command += ["--limit", str(bench["limit"])]
        if bench.get("num_fewshot"):
            command += ["--num-fewshot", str(bench["num_fewshot"])]
        for include in bench.get("include_path") or []:
            command += ["--include-path", str(include)]
        command += ["--output", str(folder)]
        lines.append(
            f"the final benchmark at update {plan.step} did not run (interrupted); get it with: "
            + " ".join(shlex.quote(c) for c in command)
        )
    return "\n".join(lines)


def _final_benchmark(callbacks: list) -> dict | None:
    """The init_args of the config's enabled end-of-run BenchmarkCallback, if any."""
    for callback in callbacks:
        spec = callback if isinstance(callback, dict) else callback.as_dict()
        if str(spec.get("class_path", "")).endswith("BenchmarkCallback"):
            args = spec.get("init_args") or {}
            if args.get("enabled", True) and args.get("at_train_end", True):
                return args
    return None
