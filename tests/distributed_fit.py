"""A tiny fit on a fixed global batch stream with 1 or N CPU processes (gloo), for the
distributed tests.

Every update sees the same global batch whatever the process count: rank r of N takes rows
r, r + N, ... of global batch i. Lightning's DDP launcher re-runs this script for the other ranks.
Global rank 0 writes a JSON of per-update losses (averaged over ranks) and monitor metrics.

    python tests/distributed_fit.py OUT.json --devices 2 [--strategy ddp|fsdp] [--steps 4]
        [--ckpt-dir DIR] [--stop-at N] [--resume CKPT] [--bench-tokenizer TOKENIZER]
        [--fail-on-rank R --fail-at N] [--kill-on-rank R --fail-at N]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import lightning as L
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from torch.utils.data import Dataset
from torchdata.stateful_dataloader import StatefulDataLoader

from callbacks.benchmarks import BenchmarkCallback
from callbacks.fail_fast import FailFast
from callbacks.gradients import GradientMonitor
from callbacks.input_norm import InputNormMonitor
from fixed_embed.distributed.fsdp import FSDP2Strategy
from fixed_embed.interfaces import LearnedInput
from fixed_embed.train.module import LanguageModel

GLOBAL_BATCH, SEQ, VOCAB = 8, 16, 300


class GlobalBatchRows(Dataset):
    """Item i: this rank's rows of global batch i (read through a StatefulDataLoader: resumable)."""

    def __init__(self, steps: int, rank: int, world: int) -> None:
        self.steps, self.rank, self.world = steps, rank, world

    def __len__(self) -> int:
        return self.steps

    def __getitem__(self, i: int) -> torch.Tensor:
        batch = torch.randint(
            0, VOCAB, (GLOBAL_BATCH, SEQ + 1), generator=torch.Generator().manual_seed(i)
        )
        return batch[self.rank :: self.world]


class StopAt(L.Callback):
    def __init__(self, step: int) -> None:
        self.step = step

    def on_train_batch_end(self, trainer, *args) -> None:
        if trainer.global_step >= self.step:
            trainer.should_stop = True


class KillRank(L.Callback):
    """SIGKILL one rank's process at one update: what the OS does to a rank out of memory."""

    def __init__(self, rank: int, step: int) -> None:
        self.rank, self.step = rank, step

    def on_train_batch_start(self, trainer, *args) -> None:
        if trainer.global_rank == self.rank and trainer.global_step == self.step:
            import os
            import signal

            os.kill(os.getpid(), signal.SIGKILL)


class FailOnRank(L.Callback):
    """Raise on one rank only, at one update, then linger before exiting (as a rank stuck in its own
    teardown would): the others, waiting for it in a collective, must end on their own."""

    def __init__(self, rank: int, step: int, linger_s: float = 30.0) -> None:
        self.rank, self.step, self.linger_s = rank, step, linger_s

    def on_train_batch_start(self, trainer, *args) -> None:
        if trainer.global_rank == self.rank and trainer.global_step == self.step:
            # CLOCK_MONOTONIC is one clock for every process of the machine: the test times rank
            # 0's end from here
            print(f"failing at monotonic {time.monotonic():.3f}", file=sys.stderr, flush=True)
            raise RuntimeError(f"injected failure on rank {self.rank} at step {self.step}")

    def on_exception(self, trainer, module, exception) -> None:
        if trainer.global_rank == self.rank:
            time.sleep(self.linger_s)


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


def main(argv: list[str] | None = None) -> dict | None:
    """Run the fit of ``argv`` (the command line); global rank 0 writes OUT and returns what it
    wrote.

    With ``--devices 1`` a test may call this in its own process; more devices need a process
    per rank."""
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--devices", type=int, default=1)
    parser.add_argument("--strategy", default="ddp")
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--bench-tokenizer", help="also run BenchmarkCallback with this tokenizer")
    parser.add_argument("--ckpt-dir", help="save last.ckpt there after every update")
    parser.add_argument(
        "--stop-at", type=int, help="stop after this many updates (the schedule keeps --steps)"
    )
    parser.add_argument("--resume", help="checkpoint to resume from")
    parser.add_argument("--fail-on-rank", type=int, help="raise on this rank only (with --fail-at)")
    parser.add_argument(
        "--fail-at", type=int, default=2, help="the update at which --fail-on-rank raises"
    )
    parser.add_argument(
        "--kill-on-rank",
        type=int,
        help="SIGKILL this rank's process (as the OS would) at --fail-at",
    )
    args = parser.parse_args(argv)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # 2 ranks on 2 cores
    try:
        return _fit(args)
    finally:
        torch.set_num_threads(threads)


def _fit(args: argparse.Namespace) -> dict | None:
    L.seed_everything(0)
    model = LanguageModel(
        decoder={
            "vocab_size": VOCAB,
            "d_model": 32,
            "n_layers": 2,
            "n_heads": 4,
            "ffn_dim": 64,
            "max_seq_len": 256,
        },
        interface=LearnedInput,
        optimizer={"lr": 1e-2},
        schedule={"warmup_steps": 1},
        # CPU: fp32 compute, so 1 and 2 processes agree closely
        parallel={"param_dtype": "float32"},
    )
    monitors = [GradientMonitor(every_n_steps=1), InputNormMonitor(every_n_steps=1)]
    if args.bench_tokenizer:
        monitors.append(
            BenchmarkCallback(
                ["fixed_embed_word_order"],
                every_n_steps=2,
                limit=6,
                batch_size=2,
                tokenizer=args.bench_tokenizer,
                at_train_end=False,
            )
        )
    record = Record(monitors)
    strategy = args.strategy if args.devices > 1 else "auto"
    if strategy == "fsdp":
        strategy = FSDP2Strategy()
    callbacks = [FailFast(), *monitors, record]
    if args.fail_on_rank is not None:
        callbacks.append(FailOnRank(args.fail_on_rank, args.fail_at))
    if args.kill_on_rank is not None:
        callbacks.append(KillRank(args.kill_on_rank, args.fail_at))
    if args.stop_at:
        callbacks.append(StopAt(args.stop_at))
    if args.ckpt_dir:
        callbacks.append(
            ModelCheckpoint(args.ckpt_dir, every_n_train_steps=1, save_last=True, save_top_k=0)
        )
    trainer = L.Trainer(
        accelerator="cpu",
        devices=args.devices,
        strategy=strategy,
        max_steps=args.steps,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=bool(args.ckpt_dir),
        gradient_clip_val=1.0,
        use_distributed_sampler=False,
        callbacks=callbacks,
    )
    data = GlobalBatchRows(args.steps, trainer.global_rank, trainer.world_size)
    trainer.fit(model, StatefulDataLoader(data, batch_size=None), ckpt_path=args.resume)
    if not trainer.is_global_zero:
        return None
    result = {"world_size": trainer.world_size, "rows": record.rows}
    Path(args.out).write_text(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
