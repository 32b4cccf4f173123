"""ParameterSummary: per part, trainable/frozen parameters, fixed state and FLOPs per token, at
fit start. A ``ModelSummary`` subclass, so the trainer adds none: Lightning's cannot tell a
frozen parameter from a fixed code."""

from __future__ import annotations

import lightning as L
from lightning.pytorch.callbacks import ModelSummary
from rich.console import Console
from rich.table import Table

from fixed_embed.measure.memory import optimizer_state_bytes
from fixed_embed.model.accounting import module_costs


def summary_table(module: L.LightningModule) -> Table:
    """The table for a LanguageModel (anything with a ``decoder`` built by
    fixed_embed.model.decoder)."""
    decoder = module.decoder
    rows = module_costs(decoder)
    table = Table(title=f"{type(module).__name__} with {type(decoder.interface).__name__}")
    for column in ("part", "type", "trainable", "frozen", "fixed state", "FLOPs/token"):
        table.add_column(column, justify="left" if column in ("part", "type") else "right")
    counts = ("trainable", "frozen", "fixed_state", "flops_per_token")
    for row in rows:
        table.add_row(row.name, row.kind, *(f"{getattr(row, count):,}" for count in counts))
    totals = {count: sum(getattr(row, count) for row in rows) for count in counts}
    table.add_section()
    table.add_row(
        "total", f"ctx {decoder.config.max_seq_len}", *(f"{total:,}" for total in totals.values())
    )
    state = optimizer_state_bytes(totals["trainable"])
    table.caption = f"fp32 weights + grads + AdamW moments: {state / 2**30:.2f} GiB"
    return table


class ParameterSummary(ModelSummary):
    """Print :func:`summary_table` on global rank 0 when fitting starts.

    Args:
        enabled: the on/off switch.
    """

    def __init__(self, enabled: bool = True) -> None:
        super().__init__(max_depth=1)
        self.enabled = enabled

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.enabled and trainer.is_global_zero and hasattr(pl_module, "decoder"):
            Console().print(summary_table(pl_module))
