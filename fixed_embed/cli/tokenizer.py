"""``fixed-embed tokenizer``: train (or reuse, when cached) a byte-level BPE on a corpus.

Without ``--out`` the tokenizer is cached in a folder keyed by the corpus and the size, the one
``fixed-embed fit`` uses for ``data.tokenizer: null`` on the same ``data.train``.
"""

from __future__ import annotations

from pathlib import Path

from fixed_embed.cli import CommandParser
from fixed_embed.config import positive
from fixed_embed.errors import ConfigError


def run(argv: list[str]) -> int:
    parser = CommandParser(prog="fixed-embed tokenizer", description=__doc__)
    parser.add_argument("--data", help="file, folder, glob or hub id (default: the offline corpus)")
    parser.add_argument("--text-field", default="text")
    parser.add_argument("--vocab-size", type=positive("--vocab-size"), default=8192)
    parser.add_argument(
        "--out", type=Path, help="output folder (default: the cache, keyed by corpus)"
    )
    parser.add_argument(
        "--overwrite",
        action="store_true",
        help="replace a tokenizer in --out made from other inputs",
    )
    args = parser.parse_args(argv[1:])
    if args.out is not None and args.out.exists() and not args.out.is_dir():
        raise ConfigError(
            f"--out {args.out} is a file; --out names the folder to hold tokenizer.json"
        )
    from fixed_embed.atomic import check_output
    from fixed_embed.data.corpus import default_corpus
    from fixed_embed.data.corpus_check import check_corpus
    from fixed_embed.data.sources import DocumentSource
    from fixed_embed.data.tokenizer import bpe_for_source

    check_corpus(args.data, "--data", args.text_field)
    if args.out is not None:
        check_output(args.out, "--out")
    source = DocumentSource(
        args.data or str(default_corpus() / "train.jsonl"), text_field=args.text_field
    )
    print(
        bpe_for_source(
            source, args.vocab_size, args.out, overwrite=args.overwrite or args.out is None
        )
    )
    return 0
