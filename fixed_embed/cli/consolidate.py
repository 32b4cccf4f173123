"""``fixed-embed consolidate FOLDER OUT.ckpt``: one checkpoint file from a sharded (FSDP2)
checkpoint folder."""

from __future__ import annotations

from pathlib import Path

from fixed_embed.cli import CommandParser


def run(argv: list[str]) -> int:
    parser = CommandParser(prog="fixed-embed consolidate", description=__doc__)
    parser.add_argument(
        "folder", help="a sharded checkpoint (e.g. .../checkpoints/last.ckpt written under FSDP2)"
    )
    parser.add_argument(
        "out", help="the single-file checkpoint to write (weights + hyper-parameters)"
    )
    args = parser.parse_args(argv[1:])
    from fixed_embed.atomic import check_output
    from fixed_embed.distributed.checkpoint import consolidate
    from fixed_embed.run.lock import acquire

    check_output(args.out, "OUT")
    with (
        # before the (long) read of the shards
        acquire(args.out, "or choose another OUT", beside=True),
        # kept by a fit
        acquire(Path(args.folder).resolve(), "or pass another FOLDER", beside=True, shared=True),
    ):
        checkpoint = consolidate(args.folder, args.out)
    n = sum(t.numel() for t in checkpoint["state_dict"].values())
    print(
        f"wrote {args.out}: {n:,} weights at step {checkpoint.get('global_step')} (optimizer state "
        "left out)"
    )
    return 0
