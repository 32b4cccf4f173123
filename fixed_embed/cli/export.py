"""``fixed-embed export CKPT OUT``: a Hugging Face LlamaForCausalLM folder (fixed codes
materialised)."""

from __future__ import annotations

from fixed_embed.cli import CommandParser


def run(argv: list[str]) -> int:
    parser = CommandParser(prog="fixed-embed export", description=__doc__)
    parser.add_argument("checkpoint", help="a LanguageModel .ckpt")
    parser.add_argument("out", help="the folder to write (must not exist or be empty)")
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    parser.add_argument(
        "--tokenizer", help="for a checkpoint that holds none (another than its own is refused)"
    )
    parser.add_argument("--overwrite", action="store_true", help="replace an earlier export in OUT")
    args = parser.parse_args(argv[1:])
    import torch

    from fixed_embed.atomic import check_output
    from fixed_embed.evaluation.export import check_export_dir, export_llama
    from fixed_embed.evaluation.loading import load_checkpoint

    check_output(args.out, "export folder")
    check_export_dir(args.out, args.overwrite)  # before loading the checkpoint
    model, tokenizer = load_checkpoint(args.checkpoint, args.tokenizer)
    out = export_llama(
        model, tokenizer, args.out, getattr(torch, args.dtype), overwrite=args.overwrite
    )
    print(
        f"wrote {out} (LlamaForCausalLM, {type(model.interface).__name__} as embed_tokens, "
        f"{args.dtype})"
    )
    return 0
