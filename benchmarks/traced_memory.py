"""The memory estimate and the FLOP formula against a traced update, at the paper's shape
(docs/benchmarks.md).

For each paper variant x strategy (DDP bf16-mixed: experiments/strategies/ddp.yaml; FSDP2:
experiments/strategies/fsdp.yaml) x world size x activation checkpointing, one update is traced
on fake tensors (:func:`fixed_embed.measure.trace.trace_update`, rank 0 of a fake process group
under FSDP2) and its per-rank peak of live tensors set beside
:func:`fixed_embed.measure.memory.memory_estimate`'s allocated peak, term by term: the model
state, FSDP2's gathered parameters, and the rest (activations, the loss, autocast's copies,
temporaries, FSDP2's unsharded gradients), from the traced peak's kinds (MemTracker's). DDP's
per-rank memory does not depend on the world size: it is traced once per variant and
checkpointing setting. Rows go to ``--out`` (JSON lines) as they are measured; FLOPs per token
traced (FlopCounterMode, recomputed forwards included) against ``Decoder.flops_per_token`` (the
MFU numerator) in each row.

    python benchmarks/traced_memory.py [--variants learned binary16 gf2] [--strategies ddp fsdp]
        [--world-sizes 2 8 64] [--ac off on] [--micro-batches 3] [--out rows.jsonl]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
GIB = 2**30


def cell(variant: str, strategy: str, world_size: int, ac: bool, micro_batches: int | None) -> dict:
    from fixed_embed.config import deep_merge, load_experiment
    from fixed_embed.distributed.fsdp import shards_parameters
    from fixed_embed.measure.memory import RunShape, memory_estimate
    from fixed_embed.measure.trace import trace_update
    from fixed_embed.train.experiment import build_model

    config = deep_merge(
        load_experiment(ROOT / f"experiments/paper/{variant}.yaml"),
        load_experiment(ROOT / f"experiments/strategies/{strategy}.yaml"),
    )
    model_config = deep_merge(config["model"], {"parallel": {"activation_checkpointing": ac}})
    trainer, data = config["trainer"], config["data"]
    run = RunShape(
        data["batch_size"],
        data["seq_len"],
        trainer["precision"],
        world_size,
        shards_parameters(trainer["strategy"]),
        trainer["accumulate_grad_batches"],
    )
    estimate = memory_estimate(build_model(model_config), run)
    model = build_model(model_config)
    traced = trace_update(model, run, micro_batches)
    kinds = traced.kinds
    names = (
        "Parameter",
        "Gradient",
        "Optstate",
        "Sharded Param",
        "Sharded Grad",
        "OptState",
        "Buffer",
    )
    state = sum(kinds.get(name, 0) for name in names)
    gathered = kinds.get("Unsharded Param", 0) + kinds.get("All Gather", 0)
    # accumulating unsharded gradients, the sharded ones do not exist at the peak
    # (memory.MemoryEstimate.allocated)
    gradients = 0 if estimate.unsharded_gradients else estimate.gradients
    estimated_state = estimate.weights + estimate.optimizer + gradients
    pairs = {
        "model state": (state, estimated_state),
        "FSDP2 gathered parameters": (gathered, estimate.fsdp_gathered),
        "the rest": (
            traced.peak - state - gathered,
            estimate.allocated - estimated_state - estimate.fsdp_gathered,
        ),
    }
    return {
        "variant": variant,
        "strategy": strategy,
        "world_size": world_size,
        "ac": ac,
        "traced_gib": traced.peak / GIB,
        "estimate_gib": estimate.allocated / GIB,
        "estimate_tensors_gib": estimate.total / GIB,
        "difference": estimate.allocated / traced.peak - 1,
        "terms_gib": {name: (t / GIB, e / GIB) for name, (t, e) in pairs.items()},
        "kinds_gib": {name: size / GIB for name, size in kinds.items()},
        "traced_flops_per_token": traced.flops_per_token,
        "formula_flops_per_token": model.decoder.flops_per_token(run.seq_len),
        "micro_batches": traced.micro_batches,
        "seconds": traced.seconds,
    }


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--variants", nargs="+", default=["learned", "binary16", "gf2"])
    parser.add_argument("--strategies", nargs="+", default=["ddp", "fsdp"], choices=["ddp", "fsdp"])
    parser.add_argument("--world-sizes", nargs="+", type=int, default=[2, 8, 64])
    parser.add_argument("--ac", nargs="+", default=["off", "on"], choices=["off", "on"])
    parser.add_argument(
        "--micro-batches",
        type=int,
        default=3,
        help="traced per update (3 give any longer one's peak)",
    )
    parser.add_argument("--out", help="append each row here as a JSON line")
    args = parser.parse_args()
    for variant in args.variants:
        for strategy in args.strategies:
            # DDP replicates: its per-rank memory is the same at every world size
            sizes = args.world_sizes[:1] if strategy == "ddp" else args.world_sizes
            for world_size in sizes:
                for ac in args.ac:
                    row = cell(variant, strategy, world_size, ac == "on", args.micro_batches)
                    print(
                        f"{variant:9} {strategy:4} W {world_size:3} AC {ac:3}: traced "
                        f"{row['traced_gib']:6.2f} GiB, "
                        f"estimate {row['estimate_gib']:6.2f} GiB ({100 * row['difference']:+.1f} "
                        "%), FLOPs/token "
                        f"{row['traced_flops_per_token']:,} vs {row['formula_flops_per_token']:,}, "
                        f"{row['seconds']:.0f} s",
                        flush=True,
                    )
                    if args.out:
                        with open(args.out, "a") as out:
                            out.write(json.dumps(row) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
