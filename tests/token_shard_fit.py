"""A tiny fit from token shards on 1 or N CPU processes (gloo), recording every batch each rank
trained on.

Each launch resumes the last checkpoint in --ckpt-dir when there is one, so a test can run it on
1 process, then on 2 with loader workers, then on 1 again, and check that the launches together
trained on every block of the global order exactly once. With ``--devices 1`` a test may call
``main`` in its own process; more devices need a process per rank. Every rank writes
``OUT/rank{r}.json``: ``{"world_size", "workers", "steps": [[global_step, batch rows], ...]}``.

    python tests/token_shard_fit.py OUT SHARDS --devices 2 --workers 2 --steps 7 --ckpt-dir DIR
    [--strategy fsdp]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import lightning as L
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

from fixed_embed.data import TextDataModule
from fixed_embed.distributed.fsdp import FSDP2Strategy
from fixed_embed.interfaces import LearnedInput
from fixed_embed.train.module import LanguageModel

SEQ, BATCH = 16, 2


class Batches(L.Callback):
    def __init__(self) -> None:
        self.steps: list[list] = []

    def on_train_batch_start(self, trainer, module, batch, batch_idx) -> None:
        self.steps.append([trainer.global_step, batch.tolist()])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("shards")
    parser.add_argument("--devices", type=int, default=1)
    parser.add_argument("--workers", type=int, default=0)
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--ckpt-dir", required=True)
    parser.add_argument("--strategy", default="ddp")
    args = parser.parse_args(argv)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # 2 ranks on 2 cores
    try:
        _fit(args)
    finally:
        torch.set_num_threads(threads)


def _fit(args: argparse.Namespace) -> None:
    L.seed_everything(0)
    model = LanguageModel(
        decoder={
            "vocab_size": 300,
            "d_model": 32,
            "n_layers": 2,
            "n_heads": 4,
            "ffn_dim": 64,
            "max_seq_len": SEQ,
        },
        interface=LearnedInput,
        optimizer={"lr": 1e-2},
        schedule={"warmup_steps": 1},
        parallel={"param_dtype": "float32"},
    )
    data = TextDataModule(
        train=args.shards,
        seq_len=SEQ,
        batch_size=BATCH,
        num_workers=args.workers,
        seed=5,
        val_sequences=2,
        holdout_per_mille=100,
    )
    strategy = (
        FSDP2Strategy()
        if args.strategy == "fsdp"
        else ("auto" if args.devices == 1 else args.strategy)
    )
    last = Path(args.ckpt_dir) / "last.ckpt"
    record = Batches()
    trainer = L.Trainer(
        accelerator="cpu",
        devices=args.devices,
        strategy=strategy,
        max_steps=args.steps,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        limit_val_batches=0,
        num_sanity_val_steps=0,
        callbacks=[
            record,
            ModelCheckpoint(args.ckpt_dir, save_last=True, every_n_train_steps=1, save_top_k=0),
        ],
    )
    trainer.fit(model, data, ckpt_path=str(last) if last.exists() else None)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    result = {"world_size": trainer.world_size, "workers": args.workers, "steps": record.steps}
    (out / f"rank{trainer.global_rank}.json").write_text(json.dumps(result))


if __name__ == "__main__":
    main()
