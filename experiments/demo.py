"""`make demo`: train the three tiny variants on CPU (offline corpus) and print one table."""

from __future__ import annotations

import argparse

from experiments.runs import run_all, tiny_variants


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--logs", default="logs/demo")
    parser.add_argument("extra", nargs="*", help="extra fixed-embed fit arguments, e.g. --trainer.max_steps=50")
    args = parser.parse_args()
    plan = tiny_variants(args.extra)
    run_all(plan, args.logs, "make demo: tiny variants on the offline corpus (CPU)")


if __name__ == "__main__":
    main()
