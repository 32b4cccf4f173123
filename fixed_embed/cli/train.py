"""``fixed-embed fit|validate|test``: LightningCLI over LanguageModel and TextDataModule.

What this shell adds to LightningCLI, all decided before any work starts:

- **One folder per run, relaunch-safe.** ``--run NAME`` (default ``default``) names the run; its
  folder is ``<save_dir>/<logger name>/<NAME>/`` (TensorBoard events, ``config.yaml``,
  ``checkpoints/``) on every launch, so a relaunch writes the same TensorBoard curve instead of a
  new ``version_N``. ``--ckpt_path last`` resumes the run's newest checkpoint when it has one and
  starts it fresh when it has none, printing which; a fresh start into a folder that already holds
  checkpoints is refused (two runs never write into each other).
- **The config given now wins on resume.** LightningCLI would replace the ``model:`` config by the
  checkpoint's hyper-parameters; here the config is kept, what cannot change is refused and what
  changed is printed (:func:`fixed_embed.resume.check_resume`).
- **Intervals in optimizer updates.** ``trainer.val_check_interval`` counts updates, like every
  other interval of the experiment configs (Lightning counts micro-batches: it is multiplied by
  ``accumulate_grad_batches`` here).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from lightning.pytorch.cli import LightningCLI
from lightning.pytorch.utilities import rank_zero_info

from fixed_embed.config import DEFAULT_RUN, expand_config_args
from fixed_embed.data import TextDataModule
from fixed_embed.errors import CheckpointError, ConfigError
from fixed_embed.loading import newest_checkpoint
from fixed_embed.module import LanguageModel


class FixedEmbedCLI(LightningCLI):
    """LightningCLI whose ``--config`` files may compose a ``__base__``, with requeue-safe run folders."""

    def __init__(self, args: list[str] | None = None, run: bool = True) -> None:
        super().__init__(
            LanguageModel,
            TextDataModule,
            save_config_kwargs={"overwrite": True},
            auto_configure_optimizers=False,
            args=None if args is None else expand_config_args(args),
            run=run,
        )

    def add_arguments_to_parser(self, parser: Any) -> None:
        parser.add_argument(
            "--run",
            type=str,
            default=DEFAULT_RUN,
            help="run name: the folder <save_dir>/<logger name>/<run> holds its logs and checkpoints",
        )

    def _parse_ckpt_path(self) -> None:
        # LightningCLI would overwrite the model config with the checkpoint's hyper-parameters,
        # silently dropping what the user changed; LanguageModel.on_load_checkpoint checks instead.
        # A protected method, with no public switch: in fixed_embed.lightning_internals.LIGHTNING_OVERRIDES.
        return

    def before_instantiate_classes(self) -> None:
        subcommand = self.config.get("subcommand")
        if subcommand is None:
            return
        config = self.config[subcommand]
        _check_seq_len(config)
        # The parsed config stays as the user wrote it (SaveConfigCallback writes it to the run folder,
        # and a relaunch from that file must mean the same); what it resolves to is applied after
        # instantiation.
        self._resolved_ckpt_path = config.ckpt_path
        if subcommand == "fit":
            folder = _pin_run_folder(config.trainer, config.run)
            if folder is not None:
                self._resolved_ckpt_path = _resolve_resume(folder / "checkpoints", config.ckpt_path, config.run)

    def after_instantiate_classes(self) -> None:
        super().after_instantiate_classes()
        subcommand = self.config.get("subcommand")
        if subcommand is None:
            return
        self.config_init[subcommand]["ckpt_path"] = self._resolved_ckpt_path
        trainer = self.trainer
        if isinstance(trainer.val_check_interval, int) and trainer.accumulate_grad_batches > 1:
            trainer.val_check_interval *= trainer.accumulate_grad_batches  # updates -> Lightning's micro-batches


def _check_seq_len(config: Any) -> None:
    seq_len = config.data.seq_len
    decoder = config.model.decoder
    max_seq_len = getattr(decoder, "max_seq_len", None) if decoder is not None else None
    if max_seq_len is not None and seq_len > max_seq_len:
        raise ConfigError(
            f"data.seq_len {seq_len} exceeds model.decoder.max_seq_len {max_seq_len}: "
            f"set data.seq_len <= {max_seq_len} or raise model.decoder.max_seq_len"
        )


def _pin_run_folder(trainer: Any, run: str) -> Path | None:
    """Give the logger the run's name as its version; the run folder (None without a file logger)."""
    if not run or "/" in run or run in (".", ".."):
        raise ConfigError(f"--run must be a plain folder name, got {run!r}")
    logger = trainer.logger
    init_args = getattr(logger, "init_args", None)
    if init_args is None or not hasattr(init_args, "save_dir"):
        return None
    init_args.version = run
    name = getattr(init_args, "name", None) or ""
    return Path(init_args.save_dir) / name / run


def _resolve_resume(checkpoints: Path, ckpt_path: str | None, run: str) -> str | None:
    """``last`` -> the run's newest checkpoint (or None, a fresh start); refuse a fresh start over a run."""
    last = newest_checkpoint(checkpoints)
    if ckpt_path == "last":
        if last is None:
            rank_zero_info(f"no checkpoint in {checkpoints}: starting at update 0")
            return None
        rank_zero_info(f"resuming {last} at update {_global_step(last)}")
        return str(last)
    if ckpt_path is None and last is not None:
        raise ConfigError(
            f"run folder {checkpoints.parent} already holds checkpoints (newest: {last.name}, update "
            f"{_global_step(last)}): add --ckpt_path last to continue it, or --run NEW_NAME to start another run"
        )
    if ckpt_path is not None:
        rank_zero_info(f"resuming {ckpt_path} at update {_global_step(Path(ckpt_path))} into {checkpoints.parent}")
    return ckpt_path


def _global_step(path: Path) -> int | str:
    """The update a checkpoint was written at (its file, or a sharded folder's ``meta.pt``)."""
    target = path / "meta.pt" if path.is_dir() else path
    try:
        return torch.load(target, map_location="cpu", mmap=True, weights_only=True).get("global_step", "?")
    except Exception as error:  # reported as a user error by the caller's resume, which reads it again
        first = str(error).splitlines()[0] if str(error) else ""
        raise CheckpointError(
            f"cannot read checkpoint {path}: it is not a checkpoint written by fixed-embed fit "
            f"({type(error).__name__}: {first[:160]}); pass the run's last.ckpt or step=N.ckpt"
        ) from error


def run(argv: list[str]) -> int:
    FixedEmbedCLI(args=argv)
    return 0
