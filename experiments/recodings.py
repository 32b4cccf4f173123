"""`make sweep-recodings`: several code assignments at tiny scale -- GF(2) seeds and random
injections.

Separates "which recoding" from "recoding at all": the binary16 identity code, GF(2) recodings
drawn from several ``code_seed`` values, and random (non-linear) injections. Results go to
docs/results/recodings.{json,md}; re-running skips runs already there.
"""

from __future__ import annotations

import argparse

from experiments.launch.executor import ROOT, add_arguments
from experiments.launch.grid import launch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--logs", default="logs/recodings")
    parser.add_argument("--out", default=str(ROOT / "docs" / "results" / "recodings"))
    parser.add_argument("extra", nargs="*", help="extra fixed-embed fit arguments for every run")
    add_arguments(parser)
    args = parser.parse_args()
    tiny, beyond = ROOT / "experiments" / "tiny", ROOT / "experiments" / "beyond"
    plan = [("recode/binary16", tiny / "binary16.yaml", args.extra)]
    for seed in args.seeds:
        flags = [*args.extra, f"--model.interface.init_args.code_seed={seed}"]
        plan += [
            (f"recode/gf2-seed{seed}", tiny / "gf2.yaml", flags),
            (f"recode/permuted-seed{seed}", beyond / "permuted.yaml", flags),
        ]
    launch(
        plan,
        args.logs,
        "Recodings at tiny scale (CPU, offline corpus, 300 updates of 8 x 256)",
        args.out,
        args,
    )


if __name__ == "__main__":
    main()
