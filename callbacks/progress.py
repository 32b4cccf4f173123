"""UpdateProgressBar: a bar counting optimizer updates (Lightning's count micro-batches), a line
per validation, and off a terminal one per ``log_every_n_steps``. Metrics are read once per
update (host syncs); setup opens console.log."""

from __future__ import annotations

from typing import Any

import lightning as L
from lightning.pytorch.callbacks import ProgressBar
from lightning.pytorch.utilities import rank_zero_info
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    ProgressColumn,
    Task,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.text import Text

from fixed_embed.run import console


class _RateColumn(ProgressColumn):
    def render(self, task: Task) -> Text:
        return Text(f"{task.speed or 0:.2f}/s", style="dim underline")


class UpdateProgressBar(ProgressBar):
    """Args: refresh_per_second: how often the bar is redrawn (0: no bar; the validation lines
    stay)."""

    def __init__(self, refresh_per_second: float = 4) -> None:
        super().__init__()
        self.refresh_per_second = refresh_per_second
        self.enabled = True
        self.progress: Progress | None = None
        self.train_task: TaskID | None = None
        self.eval_task: TaskID | None = None
        self._metrics_step = -1  # the update whose metrics the bar shows

    def disable(self) -> None:
        self.enabled = False

    def enable(self) -> None:
        self.enabled = True

    @property
    def train_progress_bar(self) -> Task:
        assert self.progress is not None
        return next(task for task in self.progress.tasks if task.id == self.train_task)

    def _add_task(self, description: str, total: float | None, completed: int = 0) -> TaskID | None:
        if not self.enabled or self.refresh_per_second <= 0:
            return None
        if self.progress is None:
            self.progress = Progress(
                TextColumn("{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                TimeRemainingColumn(),
                _RateColumn(),
                TextColumn("{task.fields[metrics]}", style="italic"),
                refresh_per_second=self.refresh_per_second,
            )
            self.progress.start()
        return self.progress.add_task(description, total=total, completed=completed, metrics="")

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        super().setup(trainer, pl_module, stage)  # disables the bar on every rank but global zero
        console.attach_run_folder(trainer.log_dir or trainer.default_root_dir, trainer.global_rank)

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        total = trainer.max_steps if trainer.max_steps > 0 else None
        self.train_task = self._add_task("update", total, trainer.global_step)
        self._metrics_step = trainer.global_step  # metrics first read when the next update ends

    def on_train_batch_end(
        self,
        trainer: L.Trainer,
        pl_module: L.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
    ) -> None:
        if self.train_task is None:  # no bar
            return
        self.progress.update(self.train_task, completed=trainer.global_step)
        if (
            step := trainer.global_step
        ) != self._metrics_step:  # once per update: the device runs ahead meanwhile
            self._metrics_step = step
            self._show_metrics(trainer, pl_module)
            if (
                not self.progress.console.is_terminal and step % trainer.log_every_n_steps == 0
            ):  # the bar as a line
                task, lr = (
                    self.train_progress_bar,
                    float(trainer.callback_metrics.get("train/lr", 0)),
                )
                speed = (
                    (task.speed or 0)
                    * float(trainer.callback_metrics.get("train/tokens", 0))
                    / step
                )  # tokens/s
                rank_zero_info(
                    f"update {step}/{task.total}: {task.fields['metrics']}, lr {lr:.3g}, "
                    f"{speed:,.0f} "
                    f"tokens/s, {TimeRemainingColumn().render(task).plain} left"
                )

    def _show_metrics(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.train_task is not None:
            text = " ".join(
                f"{k}: {v:.3g}" for k, v in self.get_metrics(trainer, pl_module).items()
            )
            self.progress.update(self.train_task, metrics=text)

    def get_metrics(self, trainer: L.Trainer, pl_module: L.LightningModule) -> dict[str, Any]:
        metrics = super().get_metrics(trainer, pl_module)
        metrics.pop("v_num", None)  # the run's name, truncated: not a metric
        # train/loss is logged without prog_bar (Lightning would read it every micro-batch): read
        # here.
        if (loss := trainer.callback_metrics.get("train/loss")) is not None:
            metrics["train/loss"] = float(loss)
        return metrics

    def on_validation_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not trainer.sanity_checking:
            total = sum(trainer.num_test_batches if trainer.testing else trainer.num_val_batches)
            description = "test" if trainer.testing else "validation"
            self.eval_task = self._add_task(description, None if total == float("inf") else total)

    on_test_start = on_validation_start

    def on_validation_batch_end(self, *args: Any, **kwargs: Any) -> None:
        if self.eval_task is not None:
            self.progress.advance(self.eval_task)

    on_test_batch_end = on_validation_batch_end

    def on_test_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.eval_task is not None:
            self.progress.remove_task(self.eval_task)
            self.eval_task = None

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.on_test_end(trainer, pl_module)
        if trainer.state.fn != "fit" or trainer.sanity_checking:
            return
        metrics = {k: float(v) for k, v in trainer.callback_metrics.items() if k.startswith("val")}
        text = ", ".join(f"{k} {v:.4g}" for k, v in sorted(metrics.items())) or "no metrics"
        rank_zero_info(f"validation at update {trainer.global_step}: {text}")
        self._show_metrics(
            trainer, pl_module
        )  # the bar's figures: this validation's, also when training ends here

    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if self.progress is not None:
            self.progress.stop()
        self.progress = self.train_task = self.eval_task = None

    def on_exception(
        self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException
    ) -> None:
        self.teardown(trainer, pl_module, "fit")
