"""GPU training speed of the paper's 1.7B model: tokens/s, MFU and peak memory per interface and
mode.

The training path, on one GPU: the paper's config (24 x d 2048, V 49,152, ctx 2048) at
micro-batch 8, bf16 autocast over fp32 master weights, the model's own chunked loss
(``LanguageModel.block_loss``, as ``training_step``), ``--accumulate`` micro-batches per update,
gradient clipping, fused AdamW. Modes: ``eager``, ``compile`` (regional, per block), ``ac``
(activation checkpointing per block) and ``compile+ac``. MFU = model FLOPs per token (the
model's own report, 6N + 12 L d T) x tokens/s / dense peak (H200/H100: 989 TFLOP/s bf16). Each
row is printed, and the JSON (``--out``) rewritten, as soon as it finishes; a row that runs out
of memory is reported as such and the next one runs. Next to each peak: the estimate of
:func:`fixed_embed.measure.memory.memory_estimate` (allocated peak) for that row. Sized to
finish in under 5 minutes on one H100/H200 (``make bench-gpu``).

``--tiny --device cpu`` runs the same code on the tiny config, as a smoke test.
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import time
from pathlib import Path

import torch
from rich.console import Console
from rich.table import Table

from fixed_embed.atomic import atomic_write_text

ROOT = Path(__file__).resolve().parents[1]
MODES = {
    "eager": (False, False),
    "compile": (True, False),
    "ac": (False, True),
    "compile+ac": (True, True),
}


def run(variant: str, mode: str, args: argparse.Namespace) -> dict:
    from fixed_embed.config import load_experiment
    from fixed_embed.distributed.parallel import ParallelConfig, apply_parallelism
    from fixed_embed.measure.memory import RunShape, memory_estimate
    from fixed_embed.measure.peak_flops import peak_flops
    from fixed_embed.model.recipe import AdamWConfig, build_adamw
    from fixed_embed.train.experiment import build_model

    device = torch.device(args.device)
    config = load_experiment(
        ROOT / "experiments" / ("tiny" if args.tiny else "paper") / f"{variant}.yaml"
    )["model"]
    model = build_model(config, device=device)
    compile_blocks, checkpointing = MODES[mode]
    apply_parallelism(
        model.decoder,
        ParallelConfig(compile=compile_blocks, activation_checkpointing=checkpointing),
    )
    optimizer = build_adamw(
        model, AdamWConfig(implementation="fused" if device.type == "cuda" else "foreach")
    )
    seq = model.config.max_seq_len
    ids = torch.randint(
        0, model.config.vocab_size, (args.accumulate, args.batch, seq + 1), device=device
    )
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda")
    precision = "bf16-mixed" if device.type == "cuda" else "32-true"
    estimate = memory_estimate(model, RunShape(args.batch, seq, precision), checkpointing)

    # one optimizer update: what LanguageModel.training_step and Lightning's loop run
    def step() -> None:
        for micro in range(args.accumulate):
            with autocast:
                # the chunked head + cross-entropy of training
                loss, _ = model.block_loss(ids[micro])
            (loss / args.accumulate).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    for _ in range(args.warmup):  # compilation, allocator, cuBLAS heuristics
        step()
    sync()
    start = time.perf_counter()
    for _ in range(args.steps):
        step()
    sync()
    elapsed = time.perf_counter() - start
    tokens_per_sec = args.batch * args.accumulate * seq * args.steps / elapsed
    peak = peak_flops(device, "bf16")
    return {
        "variant": variant,
        "mode": mode,
        "micro_batch": args.batch,
        "accumulate": args.accumulate,
        "tokens_per_sec": tokens_per_sec,
        "mfu": model.decoder.flops_per_token(seq) * tokens_per_sec / peak if peak else None,
        "peak_mem_gb": torch.cuda.max_memory_allocated(device) / 2**30
        if device.type == "cuda"
        else None,
        "estimate_gb": estimate.allocated
        / 2**30,  # the live-tensor peak the estimate predicts for this row
        "required_gb": estimate.required / 2**30,
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "error": None,
    }


def run_fresh(variant: str, mode: str, args: argparse.Namespace) -> dict:
    """One measurement; its model and optimizer are freed before the next one starts. Out of
    memory is a row."""
    try:
        result = run(variant, mode, args)
    except torch.OutOfMemoryError as error:
        empty = dict.fromkeys(
            ("tokens_per_sec", "mfu", "peak_mem_gb", "estimate_gb", "required_gb")
        )
        result = {
            "variant": variant,
            "mode": mode,
            "micro_batch": args.batch,
            "accumulate": args.accumulate,
            **empty,
            "device": args.device,
            "error": f"OOM: {str(error).splitlines()[0]}",
        }
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return result


def format_row(r: dict) -> list[str]:
    if r["error"]:
        return [r["variant"], r["mode"], "--", "--", "--", "--", r["error"][:60]]
    mfu = f"{100 * r['mfu']:.1f} %" if r["mfu"] is not None else "--"
    mem = f"{r['peak_mem_gb']:.1f}" if r["peak_mem_gb"] is not None else "--"
    return [
        r["variant"],
        r["mode"],
        f"{r['tokens_per_sec']:,.0f}",
        mfu,
        mem,
        f"{r['estimate_gb']:.1f}",
        "",
    ]


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--variants", nargs="+", default=["learned", "binary16"])
    parser.add_argument("--modes", nargs="+", default=list(MODES), choices=list(MODES))
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument(
        "--accumulate", type=int, default=2, help="micro-batches per optimizer update"
    )
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--tiny", action="store_true", help="the tiny config (smoke test)")
    parser.add_argument("--out", help="also write the rows as JSON")
    args = parser.parse_args()
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        parser.error(
            "no CUDA device: this benchmark needs a GPU (or --tiny --device cpu for a smoke test)"
        )
    torch.backends.cuda.matmul.allow_tf32 = True
    console = Console(width=140)
    columns = ("variant", "mode", "tokens/s", "MFU", "peak GiB", "estimate GiB", "note")
    console.print(
        f"Training step, {'tiny' if args.tiny else 'paper 1.7B'} config, batch {args.batch} x "
        f"{args.accumulate} accumulated, {args.device}: " + " | ".join(columns),
        highlight=False,
    )
    rows = []
    for variant in args.variants:
        for mode in args.modes:
            rows.append(run_fresh(variant, mode, args))
            # as it finishes
            console.print("  " + " | ".join(format_row(rows[-1])), highlight=False)
            if args.out:
                # gpu_check reads it back
                atomic_write_text(args.out, json.dumps(rows, indent=2) + "\n")
    table = Table(
        title=f"Training step, {'tiny' if args.tiny else 'paper 1.7B'} config, batch {args.batch} "
        "x "
        f"{args.accumulate}, {rows[0]['device']}"
    )
    for column in columns:
        table.add_column(
            column, justify="left" if column in ("variant", "mode", "note") else "right"
        )
    for r in rows:
        table.add_row(*format_row(r))
    console.print(table)
    return 1 if any(r["error"] for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
