"""`make study`: the paper's three interfaces at CPU scale on real prose, over seeds -> docs/results/study*.

Two halves, one backbone (experiments/study/base.yaml: 4 blocks, d 256, ctx 256) on gutenberg-prose:

- ``bpe8k``: an 8,192-token BPE trained on the corpus (K = 13 bits), the main comparison: the head
  (2.1M) is half the blocks (4.2M), as at the paper's scale it is a small part of the model.
- ``smollm2``: the paper's SmolLM2 tokenizer (49,152 tokens, K = 16, the paper's exact code); at
  this width the head (12.6M) is three times the blocks, so this half is head-heavy.

Each half trains learned / binary16 / gf2 with training seeds 1-3 (same data order), and GF(2) with
extra code seeds (which recoding vs. training noise). Every run is one resumable row of
``study-runs.json`` (flags, commit, curves, scores): re-running skips finished rows, so an
interrupted study continues where it stopped. ``--render`` redraws the summary from that file.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from runs import ROOT, run_all

STUDY = ROOT / "experiments" / "study"
VARIANTS = ("learned", "binary16", "gf2")
PARTS = {"bpe8k": (), "smollm2": (STUDY / "smollm2.yaml",)}


def plan(parts: list[str], seeds: list[int], code_seeds: list[int], code_seed_parts: list[str]) -> list:
    """(name, configs, flags) per run: seeds outermost, so a partial study has whole seeds."""
    steps = []
    for part in parts:
        for seed in seeds:
            for variant in VARIANTS:
                steps.append((f"{part}/{variant}-seed{seed}", (STUDY / f"{variant}.yaml", *PARTS[part]),
                              [f"--seed_everything={seed}"]))  # fmt: skip
        if part in code_seed_parts:  # other GF(2) matrices, at the first training seed
            for code in code_seeds:
                flags = [f"--seed_everything={seeds[0]}", f"--model.interface.init_args.code_seed={code}"]
                steps.append((f"{part}/gf2-code{code}-seed{seeds[0]}", (STUDY / "gf2.yaml", *PARTS[part]), flags))
    return steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--parts", nargs="+", choices=list(PARTS), default=list(PARTS))
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3], help="training seeds")
    parser.add_argument("--code-seeds", type=int, nargs="+", default=[1, 2], help="GF(2) code seeds besides 12345")
    parser.add_argument("--code-seed-parts", nargs="+", choices=list(PARTS), default=["bpe8k"])
    parser.add_argument("--jobs", type=int, default=2, help="fits at once, sharing the cores")
    parser.add_argument("--logs", default="logs/study")
    parser.add_argument("--out", default=str(ROOT / "docs" / "results" / "study"))
    parser.add_argument("--render", action="store_true", help="only redraw the summary from OUT-runs.json")
    parser.add_argument("extra", nargs="*", help="extra fixed-embed fit arguments for every run")
    args = parser.parse_args()
    runs_file = f"{args.out}-runs"
    if not args.render:
        planned = plan(args.parts, args.seeds, args.code_seeds, args.code_seed_parts)
        steps = [(name, configs, [*flags, *args.extra]) for name, configs, flags in planned]
        title = "Study: learned vs binary16 vs gf2 on gutenberg-prose (CPU), one row per run"
        run_all(steps, args.logs, title, runs_file, jobs=args.jobs, evaluate="study")
    from study_report import render

    render(json.loads(Path(f"{runs_file}.json").read_text()), Path(args.out))


if __name__ == "__main__":
    main()
