"""What the study (study.py) runs and how it names its runs, for the runner and its report
(report/render.py).

The report reads nothing but the runs file, and finds a run's tokenizer, size, variant, rate and
seed in its name. Both sides take the variants, sizes, metric and the name's format from here, so a
name the runner writes is always one the report can read (tests/test_study_names.py).
"""

from __future__ import annotations

import re
from pathlib import Path

from experiments.launch.executor import ROOT

PAPER = ("learned", "binary16", "gf2")
# control -> the paper variant whose best learning rate it trains at
CONTROLS = {
    "matched": "binary16",
    "norm_matched": "learned",
    "random_full": "binary16",
    "lowrank_binary": "learned",
    "lowrank_normal": "learned",
}
LABELS = {
    "learned": "learned table",
    "binary16": "binary code (binary16)",
    "gf2": "GF(2) recoding (gf2)",
    "matched": "binary16, SwiGLU widened to learned's trainable params",
    "norm_matched": "learned table, rows at the binary code's norm",
    "random_full": "fixed random codes, d wide",
    "lowrank_binary": "learned V x K code from the binary code (LR x10, no decay)",
    "lowrank_normal": "learned V x K code from N(0, 0.71²) (LR x10, no decay)",
}
SIZES = ("s", "m", "l")  # smallest first: the report's tables and figures follow this order
METRIC = "val_bpb"  # what the learning rate is chosen by, and the headline

# TOKENIZER-SIZE/VARIANT-lrLR-seedS[-stepsN][-codeC], LR as `{lr:g}` writes it (the same text as
# the run's
# --model.optimizer.lr). Without -steps the run trains for its size file's updates; without -code
# its interface draws the config's codebook (gf2's code_seed 12345, random_full's 1); with them, N
# updates (--trainer.max_steps, its warm-up and validations scaled alike) and code_seed C.
NAME = re.compile(
    r"^(?P<tok>[a-z0-9]+)-(?P<size>[a-z]+)/(?P<variant>[a-z0-9_]+)-lr(?P<lr>[0-9.e+-]+?)-seed(?P<seed>\d+)"
    r"(?:-steps(?P<steps>\d+))?(?:-code(?P<code>\d+))?$"
)
FORMAT = "TOKENIZER-SIZE/VARIANT-lrLR-seedS[-stepsN][-codeC]"
CODED = ("gf2", "random_full")  # the variants whose fixed codebook is drawn from a code_seed


def run_name(
    tokenizer: str,
    size: str,
    variant: str,
    lr: float,
    seed: int,
    steps: int | None = None,
    code: int | None = None,
) -> str:
    if code is not None and variant not in CODED:
        raise ValueError(f"{variant} draws no codebook: only {CODED} take a code seed")
    return (
        f"{tokenizer}-{size}/{variant}-lr{lr:g}-seed{seed}"
        + (f"-steps{steps}" if steps is not None else "")
        + (f"-code{code}" if code is not None else "")
    )


def parse_name(name: str) -> dict:
    """``{"tok", "size", "variant", "lr", "seed", "steps", "code"}`` of a name :func:`run_name`
    wrote (``steps`` and ``code`` None where the name has none); ValueError otherwise."""
    match = NAME.match(name)
    if match is None:
        raise ValueError(f"study run name {name!r} is not {FORMAT}")
    parts = match.groupdict()
    numbers = {key: int(parts[key]) for key in ("seed", "steps", "code") if parts[key]}
    return {**parts, "lr": float(parts["lr"]), **numbers}


def tiny_variants(extra: list[str]) -> list[tuple[str, Path, list[str]]]:
    """The plan for the paper's three variants at tiny scale (`make demo`, `make controls`)."""
    return [(f"tiny/{v}", ROOT / "experiments" / "tiny" / f"{v}.yaml", extra) for v in PAPER]
