"""Data pipeline throughput (prediction tokens per second): the streaming path against token shards.

1. **Streaming** (tokenize + pack, what `data.train: FILES` does): one full pass over the corpus
   (tokenization happens lazily, batch by batch, so a pass is the honest unit), through the
   StatefulDataLoader with 0 (main process), 1, 2, ... workers.
2. **pretokenize** (`fixed-embed pretokenize`): the same corpus written as token shards, with 1,
2, ...
   worker processes (tokens written per second, wall clock, start-up included).
3. **Token shards** (read + pack + collate, what `data.train: SHARDS/` does): batches of the global
   order from the memory-mapped shards in one process (the main process, no loader worker).

The paper model on one H200 at 50 % MFU consumes ~43k tokens/s; the study's smallest GPU size needs
~1.2M tokens/s per GPU: the goal is that no GPU is ever data-bound (>= 10M tokens/s read).
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table
from torchdata.stateful_dataloader import StatefulDataLoader

from fixed_embed.data import DocumentSource, PackedBlocks
from fixed_embed.data.block_order import RankBatches, TokenBlockLoader
from fixed_embed.data.pretokenize import pretokenize
from fixed_embed.data.token_shards import TokenShards
from fixed_embed.data.tokenizer import load_tokenizer, special_token_id

SHARED = Path(__file__).resolve().parents[1].parent / "shared" / "data"
TARGET_PER_GPU = 430_000
READ_TARGET = 10_000_000


def measure(source, tokenizer, seq_len, workers, batch_size=8):
    eos = special_token_id(load_tokenizer(tokenizer), "<|endoftext|>")
    ds = PackedBlocks(
        source, tokenizer, seq_len, eos_id=eos, num_shards=64, shuffle_buffer=64, epochs=1
    )
    loader = StatefulDataLoader(ds, batch_size=batch_size, num_workers=workers)
    start, seen = time.perf_counter(), 0
    for batch in loader:
        seen += batch[:, 1:].numel()
    return seen / (time.perf_counter() - start), seen


def measure_shards(folder, seq_len, batches, batch_size=8):
    """Read + pack + collate ``batches`` batches of the global order through the loader (main
    process)."""
    loader = TokenBlockLoader(RankBatches(TokenShards(folder), seq_len, batch_size, seed=0))
    it = iter(loader)
    next(it)  # the first pass's permutation is drawn here, once per pass
    start, seen = time.perf_counter(), 0
    for _ in range(batches):
        seen += next(it)[:, 1:].numel()
    return seen / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--data", default=str(SHARED / "gutenberg-prose" / "train.jsonl"))
    parser.add_argument("--tokenizer", default=str(SHARED / "smollm2-tokenizer" / "tokenizer.json"))
    parser.add_argument("--seq-len", type=int, default=2048)
    parser.add_argument(
        "--workers", type=int, nargs="*", default=[0, 1, 2], help="streaming loader workers"
    )
    parser.add_argument("--pretokenize-workers", type=int, nargs="*", default=[1, 2])
    parser.add_argument("--shards", type=int, default=16, help="pretokenize output shards")
    parser.add_argument(
        "--read-batches", type=int, default=2000, help="batches of 8 read from the shards"
    )
    args = parser.parse_args()
    console = Console(width=140)
    source = DocumentSource(args.data)
    name = (
        f"{Path(args.data).name}, {Path(args.tokenizer).name}, ctx {args.seq_len}, "
        f"{os.cpu_count()} cores"
    )
    seen = 0
    if args.workers:
        table = Table(title=f"streaming tokenize+pack, one pass over {name}")
        for col in ("loader workers", "tokens/s", "tokens/s per worker", "workers for 430k tok/s"):
            table.add_column(col, justify="right")
        for workers in args.workers:
            rate, seen = measure(source, args.tokenizer, args.seq_len, workers)
            per_worker = rate / max(1, workers)
            table.add_row(
                str(workers) + (" (main process)" if workers == 0 else ""),
                f"{rate:,.0f}",
                f"{per_worker:,.0f}",
                f"{-(-TARGET_PER_GPU // int(per_worker))}",
            )
        console.print(table)
        print(f"prediction tokens per pass: {seen:,}")
    with tempfile.TemporaryDirectory(prefix="bench-shards-") as tmp:
        table = Table(
            title=f"pretokenize {name} into {args.shards} shards (wall clock, start-up included)"
        )
        for col in (
            "processes",
            "tokens",
            "seconds",
            "tokens/s",
            "tokens/s per process",
            "bytes on disk",
        ):
            table.add_column(col, justify="right")
        folder = None
        for workers in args.pretokenize_workers:
            folder = Path(tmp) / f"w{workers}"
            result = pretokenize(
                source, args.tokenizer, folder, shards=args.shards, workers=workers
            )
            table.add_row(
                str(workers),
                f"{result['tokens']:,}",
                f"{result['seconds']:.1f}",
                f"{result['tokens_per_s']:,.0f}",
                f"{result['tokens_per_s'] / workers:,.0f}",
                f"{result['bytes']:,}",
            )
        console.print(table)
        if folder is None:
            folder = Path(tmp) / "w1"
            pretokenize(source, args.tokenizer, folder, shards=args.shards)
        rate = measure_shards(folder, args.seq_len, args.read_batches)
        print(
            "token shards: read + pack + collate, global order, one process, batches of 8 x "
            f"{args.seq_len + 1}: "
            f"{rate:,.0f} prediction tokens/s (target {READ_TARGET:,}: "
            f"{'met' if rate >= READ_TARGET else 'MISSED'})"
        )


if __name__ == "__main__":
    main()
