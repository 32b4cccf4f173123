"""``fixed-embed fit|validate|test``: LightningCLI over LanguageModel and TextDataModule, with
run folders and their lock, the resume plan, the length from ``model.token_budget``,
``val_check_interval`` in updates, one-line refusals."""

from __future__ import annotations

import os
import sys
from argparse import ArgumentError
from pathlib import Path
from typing import Any

from lightning.fabric.accelerators.cuda import num_cuda_devices
from lightning.pytorch.cli import LightningCLI, SaveConfigCallback
from lightning.pytorch.loggers import TensorBoardLogger
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn

from fixed_embed.config import (
    CONFIG_FILE_FLAGS,
    DEFAULT_RUN,
    config_values,
    expand_config_args,
    refused_value,
    use_in_jsonargparse,
)
from fixed_embed.data import TextDataModule
from fixed_embed.data.corpus_check import check_corpus
from fixed_embed.data.token_shards import INDEX
from fixed_embed.distributed import launch_agreement, rank_watch
from fixed_embed.distributed.ranks import is_launching_rank
from fixed_embed.errors import (
    ConfigError,
    RunComplete,
    RunWriteError,
    environment_error,
    write_refused,
)
from fixed_embed.run import lock as run_lock
from fixed_embed.run.folder import checkpoint_folder, pin_run_folder, step_checkpoints
from fixed_embed.train.experiment import build_fit, check_values, run_length
from fixed_embed.train.module import LanguageModel
from fixed_embed.train.resume import plan_fit, purge_curve_after, read_checkpoint


class FixedEmbedCLI(LightningCLI):
    """LightningCLI whose ``--config`` files may compose a ``__base__``, with requeue-safe run
    folders."""

    def __init__(
        self,
        args: list[str] | None = None,
        run: bool = True,
        locks: list | None = None,
        trainers: list | None = None,
    ) -> None:
        # Passed in, so run() has the locks and trainer also when __init__ raises.
        self._locks = locks if locks is not None else []
        self._trainers = trainers if trainers is not None else []
        self._ckpt_path: str | None = None
        self._max_steps: int | None = None
        self._resumed_step: int | None = None
        use_in_jsonargparse()
        super().__init__(
            LanguageModel,
            TextDataModule,
            save_config_callback=_SaveConfig,
            save_config_kwargs={"overwrite": True},
            auto_configure_optimizers=False,
            args=None if args is None else expand_config_args(args),
            run=run,
            # A bad value raises (parse_arguments says it in one line) instead of printing the
            # whole usage.
            parser_kwargs={"exit_on_error": False}
            | {c: {"exit_on_error": False} for c in ("fit", "validate", "test")},
        )

    def add_arguments_to_parser(self, parser: Any) -> None:
        what = "run name: the folder <save_dir>/<logger name>/<run> holds its logs and checkpoints"
        parser.add_argument("--run", type=str, default=DEFAULT_RUN, help=what)

    def parse_arguments(self, parser: Any, args: Any) -> None:
        try:
            super().parse_arguments(parser, args)
        except ArgumentError as error:
            print(
                f"fixed-embed {(args or ['fit'])[0]}: error: {refused_value(str(error))}",
                file=sys.stderr,
            )
            raise SystemExit(2) from None
        # LightningCLI would replace the model config by a ckpt_path's hyper-parameters, silently
        # dropping the user's changes: the path is held back (the resume plan and
        # on_load_checkpoint check instead).
        if (subcommand := self.config.get("subcommand")) is not None:
            self._ckpt_path, self.config[subcommand].ckpt_path = (
                self.config[subcommand].ckpt_path,
                None,
            )
            # before LightningCLI seeds (seed_everything) or anything else
            check_values(self.config[subcommand])

    def before_instantiate_classes(self) -> None:
        if (subcommand := self.config.get("subcommand")) is None:
            return
        config = self.config[subcommand]
        if (gpu := str(config.trainer.accelerator)) in (
            "gpu",
            "cuda",
        ) and not num_cuda_devices():  # NVML: no CUDA init
            cpu = "experiments/tiny/*.yaml or --trainer.accelerator cpu --trainer.precision 32-true"
            raise ConfigError(
                f"trainer.accelerator {gpu} needs a CUDA GPU, none is visible here: on CPU use "
                f"{cpu}"
            )
        # Kept as written (SaveConfigCallback saves it for relaunches); resolved values apply at
        # instantiation.
        config.ckpt_path = self._ckpt_path
        if subcommand == "fit":
            self._ckpt_path, self._resumed_step = launch_agreement.in_turn(
                lambda: self._plan(config), config.trainer.num_nodes
            )
        else:  # validate, test: the checkpoint and the data, before any work
            if config.ckpt_path in ("last", "best"):
                raise ConfigError(
                    f"{subcommand} --ckpt_path {config.ckpt_path}: pass the checkpoint file "
                    "instead "
                    "(<run folder>/checkpoints/last.ckpt or step=N.ckpt; checkpoints are kept by "
                    "update, not by score)"
                )
            if config.ckpt_path is not None:
                read_checkpoint(config.ckpt_path)
            _preflight(config)

    def _plan(self, config: Any) -> tuple[str | None, int | None]:
        """The run lock (before anything is read), then what this launch resumes; global rank 0
        first."""
        folder = pin_run_folder(config.trainer, config.run)
        # the run folder's writer, and a reader of the data folders (token shards)
        if is_launching_rank():
            self._locks += [run_lock.acquire(folder)] if folder is not None else []
            read = {
                Path(p).resolve()
                for p in (config.data.train, config.data.valid)
                if p and _shards_or_being(p)
            }
            self._locks += [
                run_lock.acquire(p, "or point data at another", beside=True, shared=True)
                for p in read
            ]
        self._max_steps, how = run_length(config)
        rank_zero_info(how)
        if isinstance(every := config.trainer.val_check_interval, int) and every > (
            steps := self._max_steps
        ):
            rank_zero_warn(
                f"trainer.val_check_interval {every} > the run's {steps} updates: no validation "
                "runs"
            )
        checkpoints = checkpoint_folder(folder) if folder is not None else None
        ckpt_path, resumed_step = plan_fit(config, checkpoints, self._max_steps, build_fit)
        if resumed_step is None:
            _preflight(config)
        return ckpt_path, resumed_step

    def instantiate_trainer(self, **kwargs: Any) -> Any:
        if self._max_steps is not None:
            kwargs["max_steps"] = self._max_steps
        return super().instantiate_trainer(**kwargs)

    def after_instantiate_classes(self) -> None:
        super().after_instantiate_classes()
        if (subcommand := self.config.get("subcommand")) is None:
            return
        self.config_init[subcommand]["ckpt_path"] = self._ckpt_path
        trainer = self.trainer
        self._trainers.append(trainer)
        if isinstance(trainer.val_check_interval, int) and trainer.accumulate_grad_batches > 1:
            # updates -> Lightning's micro-batches
            trainer.val_check_interval *= trainer.accumulate_grad_batches
        if self._resumed_step is not None:
            self.model.resume_planned = True
            purge_curve_after(trainer, self._resumed_step)


class _SaveConfig(SaveConfigCallback):
    def save_config(
        self, trainer: Any, pl_module: Any, stage: str
    ) -> None:  # rank 0, once: config.yaml's text
        # in TensorBoard's text tab, as code
        if stage == "fit" and isinstance(trainer.logger, TensorBoardLogger):
            text = self.parser.dump(self.config, skip_none=False)
            trainer.logger.experiment.add_text(
                "config", "".join(f"    {line}" for line in text.splitlines(True))
            )


def _shards_or_being(
    path: str,
) -> bool:  # token shards, or a folder a pretokenize holds: a reader leaves a record
    return (Path(path) / INDEX).is_file() or (
        Path(path).parent / f".{Path(path).name}.lock"
    ).is_file()


def _preflight(config: Any) -> None:
    """A fresh start's inputs, checked before any work: the data module's settings, data files,
    tokenizer."""
    datamodule = TextDataModule(**config.data.as_dict())
    hp = datamodule.hparams
    check_corpus(hp.train, "data.train", hp.text_field)
    check_corpus(hp.valid, "data.valid", hp.text_field)
    datamodule.check_inputs()


def run(argv: list[str]) -> int:
    """The command within its boundary (bugs keep their traceback)."""
    locks: list[run_lock.RunLock] = []
    trainers: list[Any] = []
    try:
        FixedEmbedCLI(args=argv, locks=locks, trainers=trainers)
    except RunComplete as done:
        rank_zero_info(str(done))
        return 0
    except SystemExit as stop:
        # Lightning's Ctrl-C handler: sys.exit(1)
        if isinstance(stop.__context__, KeyboardInterrupt):
            _say_interrupted(trainers)
        elif stop.code == 2 and (
            files := [f for f in config_values(argv, CONFIG_FILE_FLAGS) if os.path.isfile(f)]
        ):
            # a usage error: which files it came from
            print(
                f"fixed-embed {argv[0]}: (the config files given: {', '.join(files)})",
                file=sys.stderr,
            )
        raise
    except KeyboardInterrupt:
        _say_interrupted(trainers)
        return 130
    except Exception as error:
        if (lost := rank_watch.lost_rank()) is not None:
            raise rank_watch.RankLostError(lost) from error
        if (refused := environment_error(error)) is not None:
            move = (
                "move the run (--trainer.logger.init_args.save_dir), then relaunch with "
                "--ckpt_path last"
            )
            raise RunWriteError(write_refused(refused, _newest_intact(trainers), move)) from error
        raise
    finally:
        for lock in locks:
            lock.release()
    return 0


def _newest_intact(trainers: list[Any]) -> str:
    for trainer in trainers:
        if folder := getattr(getattr(trainer, "checkpoint_callback", None), "dirpath", None):
            if steps := step_checkpoints(Path(folder)):
                return f"the run's previous checkpoint {steps[-1]} is intact (writes are atomic)"
            return f"no checkpoint of the run was written yet ({folder})"
    return "nothing the run wrote before was changed"


def _say_interrupted(trainers: list[Any]) -> None:
    print(
        f"fixed-embed fit: interrupted (Ctrl-C); {_newest_intact(trainers)}: relaunch with "
        "--ckpt_path last to "
        "continue from it (a SIGTERM instead saves at the end of the update in flight)",
        file=sys.stderr,
        flush=True,
    )
