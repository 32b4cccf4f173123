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

import errno
import os
import shlex
import sys
from pathlib import Path
from typing import Any

from lightning.pytorch.cli import LightningCLI
from lightning.pytorch.utilities import rank_zero_info

from fixed_embed import rank_watch, run_lock
from fixed_embed.config import CONFIG_FILE_FLAGS, DEFAULT_RUN, _config_values, expand_config_args
from fixed_embed.data import TextDataModule
from fixed_embed.errors import ConfigError, RunWriteError, environment_error
from fixed_embed.inputs import check_corpus
from fixed_embed.module import LanguageModel
from fixed_embed.recipe import steps_for_budget
from fixed_embed.resume import ResumePlan, choose_checkpoint, plan_resume, read_checkpoint
from fixed_embed.run_lock import is_launching_rank


class _RunComplete(Exception):
    """The checkpoint to resume is at the run's length: nothing to train (exit 0, said)."""


class FixedEmbedCLI(LightningCLI):
    """LightningCLI whose ``--config`` files may compose a ``__base__``, with requeue-safe run folders."""

    def __init__(
        self, args: list[str] | None = None, run: bool = True, locks: list | None = None, trainers: list | None = None
    ) -> None:
        # What the command's boundary (run) needs after the CLI returned or raised: the locks to
        # release and the trainer (its launcher's ranks), also when __init__ raises.
        self._locks = locks if locks is not None else []
        self._trainers = trainers if trainers is not None else []
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
        self._plan: ResumePlan | None = None
        if subcommand == "fit":
            folder = _pin_run_folder(config.trainer, config.run)
            if folder is not None and is_launching_rank():
                # Before anything else is read or written: a second launch of this run must not even resume.
                self._locks.append(run_lock.acquire(folder))
            checkpoints = folder / "checkpoints" if folder is not None else None
            self._resolved_ckpt_path, self._plan = _plan(checkpoints, config)
        else:  # validate, test: the checkpoint and the data, before any work
            if config.ckpt_path not in (None, "last", "best"):
                read_checkpoint(config.ckpt_path)
            _preflight(config)

    def after_instantiate_classes(self) -> None:
        super().after_instantiate_classes()
        subcommand = self.config.get("subcommand")
        if subcommand is None:
            return
        self.config_init[subcommand]["ckpt_path"] = self._resolved_ckpt_path
        trainer = self.trainer
        self._trainers.append(trainer)
        if isinstance(trainer.val_check_interval, int) and trainer.accumulate_grad_batches > 1:
            trainer.val_check_interval *= trainer.accumulate_grad_batches  # updates -> Lightning's micro-batches
        if self._plan is not None:
            self.model._resume_planned = True  # check_resume refuses again, but the plan already printed the changes
            _purge_curve_after(trainer, self._plan.step)


def _plan(checkpoints: Path | None, config: Any) -> tuple[str | None, ResumePlan | None]:
    """Which checkpoint a fit resumes and its plan (printed), or a fresh start; every refusal raised here."""
    ckpt_path = config.ckpt_path
    notes: list[str] = []
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
            _preflight(config)
            if ckpt_path == "last":
                rank_zero_info(f"no checkpoint in {checkpoints}: starting at update 0")
            return None, None
    elif ckpt_path is None or ckpt_path == "last":
        _preflight(config)
        return ckpt_path, None
    else:
        path = Path(ckpt_path)
        checkpoint = read_checkpoint(path)
    model, datamodule = _built(config)
    world = _world_size(config.trainer)
    plan = plan_resume(checkpoint, path, model, datamodule, world, _max_steps(config, world))
    where = f" into {checkpoints.parent}" if checkpoints is not None and config.ckpt_path != "last" else ""
    length = f" of {plan.max_steps}" if plan.max_steps else ""
    rank_zero_info(f"resuming {path} at update {plan.step}{length}{where}")
    for line in plan.lines:
        rank_zero_info(line)
    if plan.complete:
        raise _RunComplete(_complete_message(plan, config, checkpoints))
    return str(path), plan


def _preflight(config: Any) -> None:
    """A fresh start's inputs, checked before any work: the data module's settings, data files, tokenizer."""
    _, datamodule = _built(config, model=False)
    hp = datamodule.hparams
    check_corpus(hp.train, "data.train", hp.text_field)
    check_corpus(hp.valid, "data.valid", hp.text_field)
    datamodule.check_inputs()


def _built(config: Any, model: bool = True) -> tuple[Any, TextDataModule]:
    """The config's model on the meta device (no weights) and its data module (not set up)."""
    from fixed_embed.experiment import build_model

    datamodule = TextDataModule(**_plain(config.data))
    return (build_model(_plain(config.model)) if model else None), datamodule


def _plain(namespace: Any) -> dict:
    return namespace.as_dict() if hasattr(namespace, "as_dict") else dict(namespace)


def _world_size(trainer: Any) -> int | None:
    devices, nodes = trainer.devices, trainer.num_nodes or 1
    if isinstance(devices, str) and devices.strip().isdigit():
        devices = int(devices)
    if isinstance(devices, (list, tuple)):
        devices = len(devices)
    if devices == "auto" and str(trainer.accelerator) == "cpu":
        devices = 1
    return devices * nodes if isinstance(devices, int) and devices > 0 else None


def _max_steps(config: Any, world: int | None) -> int | None:
    """The run's length in updates, as ``LanguageModel.setup`` resolves it (None: not known before launch)."""
    if config.trainer.max_steps is not None and config.trainer.max_steps > 0:
        return config.trainer.max_steps
    budget = config.model.token_budget
    if budget is None or world is None:
        return None
    data = config.data
    return steps_for_budget(budget, world, data.batch_size, config.trainer.accumulate_grad_batches or 1, data.seq_len)


def _complete_message(plan: ResumePlan, config: Any, checkpoints: Path | None) -> str:
    lines = [
        f"run complete: {plan.path} is at update {plan.step}, the run's length ({plan.max_steps} updates): nothing "
        f"to train (raise --trainer.max_steps to train on)"
    ]
    bench = _final_benchmark(config)
    if bench is not None and checkpoints is not None:
        folder = checkpoints.parent / "benchmarks" / f"step_{plan.step:08d}"
        if not (folder / "results.json").is_file():
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


def _final_benchmark(config: Any) -> dict | None:
    """The init_args of the config's enabled end-of-run BenchmarkCallback, if any."""
    for callback in config.trainer.callbacks or []:
        spec = _plain(callback) if not isinstance(callback, dict) else callback
        if str(spec.get("class_path", "")).endswith("BenchmarkCallback"):
            args = spec.get("init_args") or {}
            if args.get("enabled", True) and args.get("at_train_end", True):
                return args
    return None


def _purge_curve_after(trainer: Any, step: int) -> None:
    """Hide the TensorBoard events a crashed launch logged after the checkpoint it resumes (steps >= ``step``).

    TensorBoard's own mechanism (``SummaryWriter(purge_step=...)``): a ``SessionLog.START`` event at
    ``step`` in the new event file makes readers drop the earlier events at that step and beyond, so
    the curve shows each update once. After a SIGTERM stop there are none to drop.
    """
    from lightning.pytorch.loggers import TensorBoardLogger

    if not isinstance(trainer.logger, TensorBoardLogger) or not is_launching_rank():
        return
    from tensorboard.compat.proto.event_pb2 import Event, SessionLog

    writer = trainer.logger.experiment
    writer.file_writer.add_event(Event(step=step, session_log=SessionLog(status=SessionLog.START)))


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
    if not run or "/" in run or run in (".", "..") or "\0" in run:
        raise ConfigError(f"--run must be a plain folder name, got {run!r}")
    if len(os.fsencode(run)) > 255:
        raise ConfigError(
            f"--run is {len(os.fsencode(run))} bytes long; a folder name may have at most 255 (NAME_MAX): "
            "choose a shorter run name"
        )
    logger = trainer.logger
    init_args = getattr(logger, "init_args", None)
    if init_args is None or not hasattr(init_args, "save_dir"):
        return None
    init_args.version = run
    name = getattr(init_args, "name", None) or ""
    return Path(init_args.save_dir) / name / run


def run(argv: list[str]) -> int:
    """The command, within its boundary: locks released on every way out; a refused write, a lost rank
    and Ctrl-C said in one line (bugs keep their traceback)."""
    locks: list[run_lock.RunLock] = []
    trainers: list[Any] = []
    try:
        FixedEmbedCLI(args=argv, locks=locks, trainers=trainers)
    except _RunComplete as done:
        rank_zero_info(str(done))
        return 0
    except SystemExit as stop:
        if isinstance(stop.__context__, KeyboardInterrupt):  # Lightning's Ctrl-C handler: sys.exit(1)
            _say_interrupted(trainers)
        elif stop.code == 2 and (
            files := [f for f in _config_values(argv, CONFIG_FILE_FLAGS) if Path(f).is_file()]
        ):  # a usage error: which files it came from
            print(f"fixed-embed {argv[0]}: (the config files given: {', '.join(files)})", file=sys.stderr)
        raise
    except KeyboardInterrupt:
        _say_interrupted(trainers)
        return 130
    except Exception as error:
        if (lost := rank_watch.lost_rank()) is not None:
            raise rank_watch.RankLostError(lost) from error
        if (refused := environment_error(error)) is not None:
            raise RunWriteError(_write_refused(refused, trainers)) from error
        raise
    finally:
        for lock in locks:
            lock.release()
    return 0


def _newest_intact(trainers: list[Any]) -> str:
    for trainer in trainers:
        callback = getattr(trainer, "checkpoint_callback", None)
        folder = getattr(callback, "dirpath", None)
        if folder:
            steps = sorted(Path(folder).glob("step=*.ckpt"))
            if steps:
                return f"the run's previous checkpoint {steps[-1]} is intact (writes are atomic)"
            return f"no checkpoint of the run was written yet ({folder})"
    return "nothing the run wrote before was changed"


def _write_refused(error: OSError, trainers: list[Any]) -> str:
    what = error.filename or "a file of the run"
    hint = {
        errno.ENOSPC: "free disk space (lower keep_last) or move the run (--trainer.logger.init_args.save_dir)",
        errno.EDQUOT: "free space in your quota, or move the run (--trainer.logger.init_args.save_dir)",
        errno.EFBIG: "raise the file-size limit (ulimit -f) or write to a file system that takes files this large",
        errno.ENAMETOOLONG: "use a shorter --run or save_dir",
    }.get(error.errno, "choose a folder you can write (--trainer.logger.init_args.save_dir)")
    return (
        f"cannot write {what}: {error.strerror} ([Errno {error.errno}] {errno.errorcode.get(error.errno, '')}); "
        f"{_newest_intact(trainers)}.\n{hint}, then relaunch with --ckpt_path last"
    )


def _say_interrupted(trainers: list[Any]) -> None:
    print(
        f"fixed-embed fit: interrupted (Ctrl-C); {_newest_intact(trainers)}: relaunch with --ckpt_path last to "
        "continue from it (a SIGTERM instead saves at the end of the update in flight)",
        file=sys.stderr,
        flush=True,
    )
