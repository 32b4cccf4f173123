"""``fixed-embed analyze probe|ablate CKPT... --out DIR``: identity probes across depth, block
ablations.

Several checkpoints (e.g. learned, binary16, gf2 of one setup) go into one JSON and one plot.
Held-out text comes from ``--data`` (default: the offline corpus's held-out split), tokenized with
each checkpoint's own tokenizer.
"""

from __future__ import annotations

import json
from pathlib import Path

from fixed_embed.atomic import atomic_write, atomic_write_text
from fixed_embed.cli import CommandParser
from fixed_embed.config import positive


def run(argv: list[str]) -> int:
    parser = _parser()
    args = parser.parse_args(argv[1:])
    if args.labels and len(args.labels) != len(args.checkpoints):
        parser.error(f"{len(args.labels)} labels for {len(args.checkpoints)} checkpoints")
    from fixed_embed.atomic import check_output
    from fixed_embed.data.corpus_check import check_corpus
    from fixed_embed.evaluation.analysis import identity_probe, layer_ablation, text_blocks
    from fixed_embed.evaluation.analysis.ablation import plot_ablation
    from fixed_embed.evaluation.analysis.probe import plot_probe
    from fixed_embed.evaluation.loading import load_checkpoint

    check_corpus(args.data, "--data")
    check_output(args.out, "--out")
    results = {}
    for i, path in enumerate(args.checkpoints):
        model, tokenizer = load_checkpoint(path, device=args.device)
        blocks = text_blocks(tokenizer, args.blocks, model.config.max_seq_len, args.data)
        if args.analysis == "probe":
            result = identity_probe(model.decoder, blocks)
        else:
            result = layer_ablation(model.decoder, blocks, args.mode)
        label = (
            args.labels[i]
            if args.labels
            else f"{type(model.interface).__name__} ({Path(path).name})"
        )
        # the file a last.ckpt link resolved to, and its update
        results[label] = {**result, **model.provenance}
    json_path, png_path = (Path(args.out, f"{args.analysis}.{kind}") for kind in ("json", "png"))
    atomic_write_text(json_path, json.dumps(results, indent=2) + "\n")
    # a file object: matplotlib's default format, png
    with atomic_write(png_path, "wb") as png:
        if args.analysis == "probe":
            plot_probe(results, png, seed=args.seed)
        else:
            plot_ablation(results, png)
    print(f"wrote {json_path} and {png_path}")
    return 0


def _parser() -> CommandParser:
    parser = CommandParser(prog="fixed-embed analyze", description=__doc__)
    parser.add_argument("analysis", choices=["probe", "ablate"])
    parser.add_argument(
        "checkpoints", nargs="+", help="LanguageModel checkpoints (files or sharded folders)"
    )
    parser.add_argument(
        "--labels", nargs="+", help="one label per checkpoint (default: the interface names)"
    )
    parser.add_argument("--data", help="held-out documents (file, folder, glob or hub id)")
    parser.add_argument(
        "--blocks", type=positive("--blocks"), default=32, help="held-out blocks of model context"
    )
    parser.add_argument("--mode", choices=["zero", "mean"], default="zero", help="ablation mode")
    parser.add_argument(
        "--seed", type=positive("--seed", zero=True), help="the training seed, for the plot's title"
    )
    parser.add_argument("--device", default="cpu")
    parser.add_argument(
        "--out", required=True, help="folder for <analysis>.json and <analysis>.png"
    )
    return parser
