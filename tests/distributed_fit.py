"""A tiny fit on a fixed global batch stream with 1 or N CPU processes (gloo), for the distributed tests.

Every update sees the same global batch whatever the process count: rank r of N takes rows
r, r + N, ... of global batch i. Lightning's DDP launcher re-runs this script for the other ranks.
Global rank 0 writes a JSON of per-update losses (averaged over ranks) and monitor metrics.

    python tests/distributed_fit.py OUT.json --devices 2 [--strategy ddp] [--steps 4]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import lightning as L
import torch
from torch.utils.data import DataLoader, IterableDataset

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from callbacks.benchmarks import BenchmarkCallback
from callbacks.gradients import GradientMonitor
from callbacks.input_norm import InputNormMonitor
from fixed_embed.interfaces import LearnedInput
from fixed_embed.module import LanguageModel

GLOBAL_BATCH, SEQ, VOCAB = 8, 16, 300


class GlobalBatchRows(IterableDataset):
    def __init__(self, steps: int, rank: int, world: int) -> None:
        self.steps, self.rank, self.world = steps, rank, world

    def __iter__(self):
        for i in range(self.steps):
            batch = torch.randint(0, VOCAB, (GLOBAL_BATCH, SEQ + 1), generator=torch.Generator().manual_seed(i))
            yield batch[self.rank :: self.world]


class Record(L.Callback):
    def __init__(self, monitors) -> None:
        self.monitors = monitors
        self.rows: list[dict] = []

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx) -> None:
        loss = trainer.strategy.reduce(outputs["loss"].detach(), reduce_op="mean")
        row = {"step": trainer.global_step, "loss": float(loss)}
        for monitor in self.monitors:
            row.update(monitor.last_metrics)
        self.rows.append(row)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--devices", type=int, default=1)
    parser.add_argument("--strategy", default="ddp")
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--bench-tokenizer", help="also run BenchmarkCallback with this tokenizer")
    args = parser.parse_args()
    torch.set_num_threads(1)
    L.seed_everything(0)
    model = LanguageModel(
        decoder={"vocab_size": VOCAB, "d_model": 32, "n_layers": 2, "n_heads": 4, "ffn_dim": 64, "max_seq_len": 256},
        interface=LearnedInput, optimizer={"lr": 1e-2}, schedule={"warmup_steps": 1},
    )  # fmt: skip
    monitors = [GradientMonitor(every_n_steps=1), InputNormMonitor(every_n_steps=1)]
    if args.bench_tokenizer:
        monitors.append(BenchmarkCallback(["fixed_embed_word_order"], every_n_steps=2, limit=6, batch_size=2,
                                          tokenizer=args.bench_tokenizer, at_train_end=False))  # fmt: skip
    record = Record(monitors)
    strategy = args.strategy if args.devices > 1 else "auto"
    trainer = L.Trainer(
        accelerator="cpu", devices=args.devices, strategy=strategy, max_steps=args.steps, logger=False,
        enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False,
        gradient_clip_val=1.0, use_distributed_sampler=False, callbacks=[*monitors, record],
    )  # fmt: skip
    data = GlobalBatchRows(args.steps, trainer.global_rank, trainer.world_size)
    trainer.fit(model, DataLoader(data, batch_size=None))
    if trainer.is_global_zero:
        Path(args.out).write_text(json.dumps({"world_size": trainer.world_size, "rows": record.rows}))


if __name__ == "__main__":
    main()
