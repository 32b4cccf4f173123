"""The run's TensorBoard logger: Lightning's, without the ``epoch`` scalar (0 throughout a run's
one streamed epoch)."""

from lightning.pytorch.loggers import TensorBoardLogger


class RunTensorBoardLogger(TensorBoardLogger):
    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        super().log_metrics({key: value for key, value in metrics.items() if key != "epoch"}, step)
