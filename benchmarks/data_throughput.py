"""Tokenize + pack throughput of the data pipeline (prediction tokens per second).

One full pass over the corpus (tokenization happens lazily, batch by batch, so a pass is the
honest unit), through the StatefulDataLoader with 0 (main process), 1, 2, ... workers. The paper model on one
H200 at 50 % MFU consumes ~43k tokens/s, so the target is >= 430k tokens/s per GPU.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table
from torchdata.stateful_dataloader import StatefulDataLoader

from fixed_embed.data import DocumentSource, PackedBlocks
from fixed_embed.data.tokenizer import load_tokenizer, special_token_id

SHARED = Path(__file__).resolve().parents[1].parent / "shared" / "data"
TARGET_PER_GPU = 430_000


def measure(source, tokenizer, seq_len, workers, batch_size=8):
    eos = special_token_id(load_tokenizer(tokenizer), "<|endoftext|>")
    ds = PackedBlocks(source, tokenizer, seq_len, eos_id=eos, num_shards=64, shuffle_buffer=64, epochs=1)
    loader = StatefulDataLoader(ds, batch_size=batch_size, num_workers=workers)
    start, seen = time.perf_counter(), 0
    for batch in loader:
        seen += batch[:, 1:].numel()
    return seen / (time.perf_counter() - start), seen


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--data", default=str(SHARED / "gutenberg-prose" / "train.jsonl"))
    parser.add_argument("--tokenizer", default=str(SHARED / "smollm2-tokenizer" / "tokenizer.json"))
    parser.add_argument("--seq-len", type=int, default=2048)
    parser.add_argument("--workers", type=int, nargs="+", default=[0, 1, 2])
    args = parser.parse_args()
    source = DocumentSource(args.data)
    table = Table(title=f"tokenize+pack, one pass over {args.data}, {Path(args.tokenizer).name}, ctx {args.seq_len}")
    for col in ("loader workers", "tokens/s", "tokens/s per worker", "workers for 430k tok/s"):
        table.add_column(col, justify="right")
    for workers in args.workers:
        rate, seen = measure(source, args.tokenizer, args.seq_len, workers)
        per_worker = rate / max(1, workers)
        table.add_row(str(workers) + (" (main process)" if workers == 0 else ""), f"{rate:,.0f}",
                      f"{per_worker:,.0f}", f"{-(-TARGET_PER_GPU // int(per_worker))}")  # fmt: skip
    Console(width=140).print(table)
    print(f"prediction tokens per pass: {seen:,}")


if __name__ == "__main__":
    main()
