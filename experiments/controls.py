"""`make controls`: the paper's three tiny variants beside every control of experiments/beyond/,
one table.

Same data, seed, recipe and steps for all (the tiny setup); only the input interface differs.
Results go to docs/results/controls.{json,md}; re-running skips runs already there.
"""

from __future__ import annotations

import argparse

from experiments.launch.executor import ROOT, add_arguments
from experiments.launch.grid import launch
from experiments.plan.names import tiny_variants


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--logs", default="logs/controls")
    parser.add_argument("--out", default=str(ROOT / "docs" / "results" / "controls"))
    parser.add_argument(
        "--seeds", type=int, nargs="+", default=[1234], help="training seeds (1234: the configs')"
    )
    parser.add_argument(
        "--only", nargs="+", help="run only these names (e.g. tiny/learned beyond/random_full)"
    )
    parser.add_argument("extra", nargs="*", help="extra fixed-embed fit arguments for every run")
    add_arguments(parser)
    args = parser.parse_args()
    base = tiny_variants(args.extra)
    base += [
        (f"beyond/{p.stem}", p, args.extra)
        for p in sorted((ROOT / "experiments" / "beyond").glob("*.yaml"))
    ]
    plan = []
    # 1234 (the configs' seed) keeps the committed rows' plain names: a re-run skips them
    for seed in args.seeds:
        suffix, flags = (
            ("", []) if seed == 1234 else (f"-seed{seed}", [f"--seed_everything={seed}"])
        )
        plan += [
            (name + suffix, config, [*extra, *flags])
            for name, config, extra in base
            if not args.only or name in args.only
        ]
    launch(
        plan,
        args.logs,
        "Controls at tiny scale (CPU, offline corpus, 300 updates of 8 x 256)",
        args.out,
        args,
    )


if __name__ == "__main__":
    main()
