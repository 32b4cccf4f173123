"""`make demo`: train the three tiny variants on CPU (offline corpus) and print one table."""

from __future__ import annotations

import argparse

from experiments.launch.executor import add_arguments
from experiments.launch.grid import launch
from experiments.plan.names import tiny_variants


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--logs", default="logs/demo")
    parser.add_argument(
        "extra", nargs="*", help="extra fixed-embed fit arguments, e.g. --trainer.max_steps=50"
    )
    add_arguments(parser)
    args = parser.parse_args()
    launch(
        tiny_variants(args.extra),
        args.logs,
        "make demo: tiny variants on the offline corpus (CPU)",
        None,
        args,
    )


if __name__ == "__main__":
    main()
