"""BenchmarkCallback: lm-eval tasks on the live weights every N updates and at the end (README,
"Watch a run"). Every rank takes part: keep ``limit`` within the group's timeout; ``on_error:
warn`` only for errors all ranks meet alike."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Literal

import lightning as L
import numpy as np
import torch
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn

from callbacks.checkpointing import save_now
from callbacks.preemption import PreemptionCheckpoint
from callbacks.update_boundary import UpdateCallback, due
from fixed_embed.config import NonNegativeInt, PositiveInt
from fixed_embed.data.tokenizer import load_tokenizer
from fixed_embed.run.folder import benchmark_folder, step_checkpoint


class BenchmarkCallback(UpdateCallback):
    """Args:
    tasks: lm-eval task names (built-in, offline ``fixed_embed_*``, or from include_path).
    every_n_steps: evaluate every N optimizer updates (0: only at the end of training).
    limit: examples per task (an int), or a fraction.
    num_fewshot: shots for every task.
    batch_size: requests per forward pass.
    include_path: folders of extra lm-eval task YAMLs.
    tokenizer: a tokenizer.json / folder / hub id (default: the data module's tokenizer).
    at_train_end: also evaluate when training ends.
    on_error: ``raise`` (fail the run) or ``warn`` (log and train on) when an evaluation fails.
    enabled: the on/off switch.
    """

    min_every_n_steps = 0  # 0: only at the end of training

    def __init__(
        self,
        tasks: list[str] | None = None,
        every_n_steps: int = 1000,
        limit: int | float | None = 100,
        num_fewshot: NonNegativeInt = 0,
        batch_size: PositiveInt = 16,
        include_path: list[str] | None = None,
        tokenizer: str | None = None,
        at_train_end: bool = True,
        on_error: Literal["raise", "warn"] = "raise",
        enabled: bool = True,
    ) -> None:
        super().__init__(every_n_steps, enabled)
        self.tasks = list(tasks) if tasks else ["fixed_embed_word_order"]
        self.limit = limit
        self.num_fewshot = num_fewshot
        self.batch_size = batch_size
        self.include_path = list(include_path or [])
        self.tokenizer = tokenizer
        self.at_train_end = at_train_end
        self.on_error = on_error
        self.interrupted = False
        self._evaluated_step = -1

    def final_eval_command(self, checkpoint: Path, folder: Path) -> list[str] | None:
        """The ``fixed-embed eval`` command that writes what the end of training writes (None:
        nothing)."""
        if not (self.enabled and self.at_train_end):
            return None
        command = ["fixed-embed", "eval", str(checkpoint), "--tasks", ",".join(self.tasks)]
        command += ["--limit", str(self.limit)] if self.limit is not None else []
        command += ["--num-fewshot", str(self.num_fewshot)] if self.num_fewshot else []
        command += [
            arg for include in self.include_path for arg in ("--include-path", str(include))
        ]
        return [*command, "--output", str(folder)]

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        # A misspelt task fails now, not 5,000 updates into the run.
        if self.enabled and stage == "fit":
            from fixed_embed.evaluation.suite import check_tasks
            from fixed_embed.evaluation.task_data import check_task_data

            check_task_data(self.tasks, check_tasks(self.tasks, self.include_path))

    def on_update_end(self, trainer: L.Trainer, pl_module: L.LightningModule, update: int) -> None:
        if self.due(update):
            if due(
                update, getattr(trainer.checkpoint_callback, "every_n_steps", 0)
            ):  # it runs after this one
                save_now(trainer)
            self.evaluate(trainer, pl_module)
            if self.interrupted:
                save_now(
                    trainer
                )  # no-op when saved above; otherwise the updates since the last save are kept
                trainer.should_stop = True  # every rank: the interruption was a vote

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if (
            self.interrupted
            or not (self.enabled and self.at_train_end)
            or trainer.global_step == self._evaluated_step
        ):
            return
        if trainer.checkpoint_callback is not None:
            save_now(trainer)  # no-op when the checkpoint callback already saved this update
        self.evaluate(trainer, pl_module)

    def evaluate(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        from fixed_embed.evaluation.suite import write_results

        step = trainer.global_step
        if (results := self._run_suite(trainer, pl_module)) is None:
            return
        self._evaluated_step = step
        checkpoints = getattr(trainer.checkpoint_callback, "dirpath", None)
        run_folder = (
            Path(checkpoints).parent
            if checkpoints
            else Path(trainer.log_dir or trainer.default_root_dir)
        )
        if not trainer.is_global_zero:  # after trainer.log_dir: a collective under DDP
            return
        metrics = {
            "bench/" + "/".join(key.split("|")[:2]): score["value"]
            for key, score in results["scores"].items()
        }
        for logger in trainer.loggers:
            # the index of the last update, as train/loss
            logger.log_metrics(metrics, step=step - 1)
        saved = step_checkpoint(Path(checkpoints), step) if checkpoints else None
        # what was scored
        scored = {"checkpoint": str(saved) if saved and saved.exists() else None, "update": step}
        path = write_results(
            {**scored, **results}, f"step {step}", benchmark_folder(run_folder, step)
        )
        rank_zero_info(f"BenchmarkCallback at step {step}: {metrics} ({path})")
        self.last_metrics = metrics

    def _run_suite(self, trainer: L.Trainer, pl_module: L.LightningModule) -> dict | None:
        """lm-eval's results on the live weights; ``None`` when a stop request ended it, or it
        failed with ``on_error: warn``."""
        from fixed_embed.evaluation.lm_eval_model import EvaluationInterrupted, FixedEmbedLM
        from fixed_embed.evaluation.suite import columns_for, run_suite

        tokenizer = (
            load_tokenizer(self.tokenizer)
            if self.tokenizer is not None
            else trainer.datamodule.tokenizer
        )
        preemption = next(
            (c for c in trainer.callbacks if isinstance(c, PreemptionCheckpoint) and c.enabled),
            None,
        )
        lm = FixedEmbedLM(
            module=pl_module,
            tokenizer_object=tokenizer,
            batch_size=self.batch_size,
            distributed=trainer.world_size > 1,
            interrupt=preemption.stop_requested if preemption is not None else None,
        )
        rng = random.getstate(), np.random.get_state()  # lm-eval seeds the global RNGs
        try:  # compiled blocks run eager: no recompiles of the training graph
            devices = range(torch.cuda.device_count())
            with torch.random.fork_rng(devices=devices), torch.compiler.set_stance("force_eager"):
                columns = columns_for(None, self.tasks, self.num_fewshot)
                return run_suite(lm, columns, self.limit, self.include_path)
        except EvaluationInterrupted:
            self.interrupted = True
            rank_zero_info(
                f"BenchmarkCallback at step {trainer.global_step}: stopped by a stop request (the "
                "checkpoint is saved)"
            )
        except Exception as error:
            if self.on_error == "raise":
                raise
            rank_zero_warn(
                f"BenchmarkCallback at step {trainer.global_step} failed, training goes on: "
                f"{type(error).__name__}: {error}"
            )
        finally:
            random.setstate(rng[0])
            np.random.set_state(rng[1])
        return None
