"""UpdateProgressBar: the console of a fit -- a bar counting optimizer updates, one line per validation.

Lightning's ``RichProgressBar`` counts micro-batches of an epoch (``Epoch 0/-2 ... 12/12`` for a
step-bounded run with accumulation 2); here the training bar counts *updates*: its total is
``trainer.max_steps`` (the training length, also when the token budget set it) and its counter
``trainer.global_step``, so a resumed run starts where it stopped. Its metrics (``train/loss``) are
read once per update, not per micro-batch: each read is a host sync. After each validation one line
gives its metrics. At set-up it opens the run's log file (``<run folder>/console.log``, see
:mod:`fixed_embed.console`), which takes what the console leaves out.
"""

from __future__ import annotations

from typing import Any

import lightning as L
from lightning.pytorch.callbacks import RichProgressBar
from lightning.pytorch.utilities import rank_zero_info
from rich.progress import ProgressColumn, Task
from rich.text import Text

from fixed_embed import console

__all__ = ["UpdateProgressBar"]

DESCRIPTION = "update"


class _RateColumn(ProgressColumn):
    """Updates (or validation batches) per second."""

    def render(self, task: Task) -> Text:
        return Text(f"{task.speed or 0:.2f}/s", style="dim underline")


class UpdateProgressBar(RichProgressBar):
    """Args: those of Lightning's ``RichProgressBar`` (``refresh_rate``, ``leave``, ``theme``, ``console_kwargs``)."""

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        super().setup(trainer, pl_module, stage)
        console.attach_run_folder(trainer.log_dir or trainer.default_root_dir, trainer.global_rank)

    _metrics_step = -1  # the update whose metrics the bar shows

    def configure_columns(self, trainer: L.Trainer) -> list:
        return [*super().configure_columns(trainer)[:-1], _RateColumn()]

    @staticmethod
    def _total(trainer: L.Trainer) -> float:
        return trainer.max_steps if trainer.max_steps and trainer.max_steps > 0 else float("inf")

    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._metrics_step = trainer.global_step  # metrics first read when the next update ends
        if self.is_disabled:
            return
        if self.progress is not None:
            if self.train_progress_bar_id is None:
                self._initialize_train_progress_bar_id()
            else:  # a later epoch: the same bar goes on
                self.progress.update(self.train_progress_bar_id, total=self._total(trainer), visible=True)
        self.refresh()

    def _initialize_train_progress_bar_id(self) -> None:
        trainer = self.trainer
        self.train_progress_bar_id = self._add_task(self._total(trainer), DESCRIPTION)
        self._update(self.train_progress_bar_id, trainer.global_step)

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if not self.is_disabled and self.train_progress_bar_id is None:
            self._initialize_train_progress_bar_id()
        self._update(self.train_progress_bar_id, trainer.global_step)
        if trainer.global_step != self._metrics_step:
            # Reading the bar's metrics turns the logged loss tensor into a number, a host sync: once
            # per update, never on the micro-batches of an accumulation (the device runs ahead).
            self._metrics_step = trainer.global_step
            self._update_metrics(trainer, pl_module)
        self.refresh()

    def get_metrics(self, trainer: L.Trainer, pl_module: L.LightningModule) -> dict[str, Any]:
        metrics = super().get_metrics(trainer, pl_module)
        metrics.pop("v_num", None)  # the run's name, truncated: not a metric
        # The module logs train/loss without prog_bar (Lightning would .item() it after every
        # micro-batch); it is read here, when an update ends (on_train_batch_end below).
        if trainer.training and (loss := trainer.callback_metrics.get("train/loss")) is not None:
            metrics["train/loss"] = float(loss)
        return metrics

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        super().on_validation_end(trainer, pl_module)
        if trainer.state.fn != "fit" or trainer.sanity_checking:
            return
        metrics = {k: float(v) for k, v in trainer.callback_metrics.items() if k.startswith("val")}
        text = ", ".join(f"{k} {v:.4g}" for k, v in sorted(metrics.items())) or "no metrics"
        rank_zero_info(f"validation at update {trainer.global_step}: {text}")
