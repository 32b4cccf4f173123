"""``fixed-embed tokenizer``: train (or reuse, when cached) a byte-level BPE on a corpus."""

from __future__ import annotations

import argparse
from pathlib import Path

from fixed_embed.data.corpus import cache_root, default_corpus
from fixed_embed.data.sources import DocumentSource
from fixed_embed.data.tokenizer import train_bpe


def run(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="fixed-embed tokenizer", description=__doc__)
    parser.add_argument("--data", default=None, help="file, folder, glob or hub id (default: the offline corpus)")
    parser.add_argument("--text-field", default="text")
    parser.add_argument("--vocab-size", type=int, default=8192)
    parser.add_argument("--out", type=Path, default=None, help="output folder (default: the cache)")
    args = parser.parse_args(argv[1:])
    source = DocumentSource(args.data or str(default_corpus() / "train.jsonl"), text_field=args.text_field)
    fingerprint = repr(source.fingerprint())
    out = args.out or cache_root() / "tokenizers" / f"bpe-{args.vocab_size}-cli"
    texts = (row[args.text_field] for row in source.open())
    path = train_bpe(texts, args.vocab_size, out, fingerprint)
    print(path)
    return 0
