"""``fixed-embed generate CKPT --prompt TEXT``: the model's continuation of a prompt, to its
document's end at most, greedy or sampled, on CPU or GPU
(:meth:`fixed_embed.model.decoder.Decoder.generate`)."""

from __future__ import annotations

from fixed_embed.cli import CommandParser
from fixed_embed.config import positive


def run(argv: list[str]) -> int:
    parser = CommandParser(prog="fixed-embed generate", description=__doc__)
    parser.add_argument("checkpoint", help="a LanguageModel .ckpt (file or sharded folder)")
    parser.add_argument("--prompt", required=True, help="the text to continue")
    parser.add_argument(
        "--max-new-tokens", type=positive("--max-new-tokens"), default=100, help="default 100"
    )
    parser.add_argument(
        "--temperature",
        type=positive("--temperature", float, zero=True),
        default=0.8,
        help="default 0.8; 0: greedy (the likeliest token each step)",
    )
    parser.add_argument(
        "--top-k",
        type=positive("--top-k"),
        default=50,
        help="draw from the K likeliest (default 50)",
    )
    parser.add_argument(
        "--seed", type=positive("--seed", zero=True), default=0, help="the sampling seed"
    )
    parser.add_argument("--device", help="cpu, cuda, ... (default: cuda if available)")
    args = parser.parse_args(argv[1:])
    import torch

    from fixed_embed.data.tokenizer import EOS
    from fixed_embed.evaluation.loading import load_checkpoint

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if device.startswith("cuda") and not torch.cuda.is_available():
        parser.error(f"--device {device}: this machine has no CUDA GPU; use --device cpu")
    model, tokenizer = load_checkpoint(args.checkpoint, device=device)
    if not (prompt := tokenizer.encode(args.prompt, add_special_tokens=False).ids):
        parser.error("--prompt holds no text to continue")
    ids = model.decoder.generate(
        torch.tensor([prompt], device=device),
        args.max_new_tokens,
        args.temperature,
        args.top_k,
        tokenizer.get_vocab_size(),
        torch.Generator(device).manual_seed(args.seed),
    )
    new, eos = ids[0, len(prompt) :].tolist(), tokenizer.token_to_id(EOS)
    print(tokenizer.decode(new[: new.index(eos)] if eos in new else new))
    return 0
