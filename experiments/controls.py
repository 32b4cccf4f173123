"""`make controls`: the paper's three tiny variants beside every control of experiments/beyond/, one table.

Same data, seed, recipe and steps for all (the tiny setup); only the input interface differs.
Results go to docs/results/controls.{json,md}; re-running skips runs already there.
"""

from __future__ import annotations

import argparse

from runs import ROOT, run_all, tiny_variants


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--logs", default="logs/controls")
    parser.add_argument("--out", default=str(ROOT / "docs" / "results" / "controls"))
    parser.add_argument("extra", nargs="*", help="extra fixed-embed fit arguments for every run")
    args = parser.parse_args()
    plan = tiny_variants(args.extra)
    plan += [(f"beyond/{p.stem}", p, args.extra) for p in sorted((ROOT / "experiments" / "beyond").glob("*.yaml"))]
    run_all(plan, args.logs, "Controls at tiny scale (CPU, offline corpus, 300 updates of 8 x 256)", args.out)


if __name__ == "__main__":
    main()
