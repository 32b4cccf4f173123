"""The study's runs file, indexed for its report: a run's configs, its value on each split, the
rate a variant is compared at and its runs there (render.py draws the tables and figures
from it).

Two splits: **val** (validation bits/byte over the 9 held-out books) chooses every learning rate;
**test** (WikiText-2 bits/byte, out of domain) is read by no choice. Differences between
variants are paired by training seed (the same seed: the same data order and, for the two fixed
codes, the same initial weights). Where a codebook was drawn per seed (``-codeC`` runs), a
variant's seeds use them, so its spread holds the codebook's variance.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from functools import cache

from experiments.launch.executor import ROOT
from experiments.launch.record import RunRecord, record, resolve
from experiments.plan.names import CONTROLS, METRIC, PAPER, SIZES, parse_name
from experiments.plan.stages import nearest_sweep
from experiments.report.stats import Paired, paired

TEST = "wikitext2_local|bits_per_byte|0"
WORD_PPL = "wikitext2_local|word_perplexity|0"
SPLITS = {
    "val": "validation bits/byte (books; chooses the rates)",
    "test": "WikiText-2 bits/byte (no choice reads it)",
}
GAPS = (("learned", "binary16"), ("learned", "gf2"), ("binary16", "gf2"))  # (a, b): b - a
Cell = dict[int, dict]  # seed -> row
Points = Sequence[tuple[str, int | None]]  # (size, updates; None: the size's own)


def parse(row: dict) -> dict:
    """The tokenizer, size, variant, rate, seed, updates and codebook in the row's name."""
    return parse_name(row["name"])


def _finite(value: float | None) -> float:
    """A diverged run (NaN, inf or nothing logged) ranks last."""
    return value if value is not None and math.isfinite(value) else math.inf


def run_record(row: dict) -> RunRecord:
    """The run's record, resolved from its row: its config files and flags."""
    return _record(row["config"], tuple(row["extra"]))


# a render reads each run's record for every table and figure it appears in; nothing mutates them
@cache
def _record(configs: str, flags: tuple[str, ...]) -> RunRecord:
    return record(resolve([ROOT / c for c in configs.split(" + ")], flags))


def wikitext_ratio(rows: list[dict]) -> float | None:
    """WikiText-2 bits/byte per nat of word perplexity: words / (bytes ln 2) of the fixed test text.

    Rows scored before the suite logged bits/byte (study v2's) carry the word perplexity only;
    the ratio of the rows that log both converts them exactly (the same text for every run, so
    one constant)."""
    ratios = [
        r["scores"][TEST]["value"] / math.log(r["scores"][WORD_PPL]["value"])
        for r in rows
        if TEST in r.get("scores", {}) and WORD_PPL in r["scores"]
    ]
    ratios = [x for x in ratios if math.isfinite(x)]  # a diverged run scores inf or NaN
    if not ratios:
        return None
    if max(ratios) - min(ratios) > 1e-9 * max(ratios):
        raise ValueError(
            "WikiText-2 bits/byte over ln(word ppl) differs across runs "
            f"({min(ratios)}..{max(ratios)})"
            ": the test text changed between runs, so they cannot be compared"
        )
    return statistics.mean(ratios)


def _most_seeded(by_lr: dict[float, dict]) -> float | None:
    """The rate with the most seeds (the lowest on a tie)."""
    return max(by_lr, key=lambda lr: (len(by_lr[lr]), -lr), default=None)


class Study:
    """The runs of one tokenizer (default: bpe8k where it ran, else the first row's), indexed by
    (size, variant, steps) -> {lr: {seed: {code: row}}}; ``rows`` holds every run."""

    def __init__(self, rows: list[dict], tune: str = "m", tok: str | None = None) -> None:
        self.rows, self.tune = rows, tune
        tokenizers = {parse(r)["tok"] for r in rows}
        self.tok = tok or ("bpe8k" if "bpe8k" in tokenizers else parse(rows[0])["tok"])
        self.ratio = wikitext_ratio(rows)
        self.index: dict[tuple, dict] = {}
        for row in rows:
            m = parse(row)
            if m["tok"] == self.tok:
                by_lr = self.index.setdefault((m["size"], m["variant"], m["steps"]), {})
                by_lr.setdefault(m["lr"], {}).setdefault(m["seed"], {})[m["code"]] = row
        self.sizes = [s for s in SIZES if s in {key[0] for key in self.index}]

    def value(self, row: dict, split: str) -> float:
        if split == "val":
            return _finite(row.get(METRIC))
        scores = row.get("scores", {})
        if TEST in scores:
            return scores[TEST]["value"]
        if WORD_PPL in scores and self.ratio is not None:
            return self.ratio * math.log(scores[WORD_PPL]["value"])
        return math.nan

    def swept(self, size: str, variant: str, steps: int | None = None) -> dict[float, float]:
        """Seed 1's validation bits/byte per rate at ``steps`` updates (None: the size's own)
        and the config's codebook."""
        by_lr = self.index.get((size, variant, steps), {})
        return {
            lr: _finite(seeds[1][None].get(METRIC))
            for lr, seeds in by_lr.items()
            if None in seeds.get(1, {})
        }

    def best(self, size: str, variant: str, steps: int | None = None) -> float | None:
        scored = self.swept(size, variant, steps)
        return min(scored, key=scored.get) if len(scored) > 1 else None

    def sweeps(self, size: str) -> list[int | None]:
        """The lengths the size was swept at (seed 1 of every paper variant at 2 or more rates),
        shortest first."""
        return [
            n for n in self.lengths(size) if all(len(self.swept(size, v, n)) > 1 for v in PAPER)
        ]

    def chosen_at(self, size: str, steps: int | None) -> int | None:
        """The sweep whose best rates a run of ``steps`` updates uses (plan/stages.py's
        ``nearest_sweep``, None where none ran); a length that then also ran at another rate is
        a sweep of its own, and its best on seed 1 is used there, as at every sweep."""
        own, found = self.own_updates(size), self.sweeps(size)
        if not found or (steps or own) is None:
            return None
        return nearest_sweep(steps or own, found, own)

    def rate(self, size: str, variant: str, steps: int | None = None) -> float | None:
        """The rate a variant is compared at: its best of the sweep it was chosen by (a control:
        its paper variant's), as the study chose it; for a run outside the plan, the rate with
        the most seeds."""
        by_lr = self.index.get((size, variant, steps), {})
        chosen = self.best(size, CONTROLS.get(variant, variant), self.chosen_at(size, steps))
        return chosen if chosen in by_lr else _most_seeded(by_lr)

    def cell(
        self,
        size: str,
        variant: str,
        steps: int | None = None,
        fold: bool = True,
        lr: float | None = None,
    ) -> Cell:
        """Seed -> row at ``lr`` (default: the compared rate); with ``fold``, seed s uses
        codebook s where it was drawn."""
        lr = lr or self.rate(size, variant, steps)
        seeds = self.index.get((size, variant, steps), {}).get(lr, {})
        # seed 1 (or a seed whose own codebook did not run): the config's codebook
        code = {s: s if fold and s > 1 and s in codes else None for s, codes in seeds.items()}
        return {s: codes[code[s]] for s, codes in sorted(seeds.items()) if code[s] in codes}

    def spread(
        self, size: str, variant: str, steps: int | None = None
    ) -> tuple[Paired, float | None]:
        """The seed noise a sweep's margins are read against: the val values over seeds at the
        variant's best rate of the sweep at ``steps``, or where that has one seed, at the rate
        with the most; and that rate."""
        by_lr = self.index.get((size, variant, steps), {})
        lr = self.best(size, variant, steps)
        if len(by_lr.get(lr, {})) < 2:
            lr = _most_seeded(by_lr)
        return self.finite(self.cell(size, variant, steps, lr=lr), "val"), lr

    def against_best(self, size: str, variant: str, steps: int | None, lr: float) -> Paired:
        """Val bits/byte at ``lr`` minus at the sweep's best rate, paired by seed (the config's
        codebook)."""
        at = [
            self.values(self.cell(size, variant, steps, fold=False, lr=rate), "val")
            for rate in (self.best(size, variant, steps), lr)
        ]
        return paired(*at)

    def position(self, size: str, variant: str) -> Paired:
        """Per seed, where ``variant`` sits on the line from learned (0) to binary16 (1) on val."""
        learned, binary, mine = (
            self.values(self.cell(size, v), "val") for v in ("learned", "binary16", variant)
        )
        shares = [
            (mine[s] - learned[s]) / (binary[s] - learned[s])
            for s in sorted(mine)
            if s in learned and s in binary
        ]
        return Paired(tuple(x for x in shares if math.isfinite(x)))

    def values(self, cell: Cell, split: str) -> dict[int, float]:
        return {s: self.value(row, split) for s, row in cell.items()}

    def finite(self, cell: Cell, split: str) -> Paired:
        """The cell's values over seeds (a diverged run has no spread to give)."""
        return Paired(tuple(x for x in self.values(cell, split).values() if math.isfinite(x)))

    def gap(self, size: str, a: str, b: str, split: str, steps: int | None = None) -> Paired:
        return paired(
            self.values(self.cell(size, a, steps), split),
            self.values(self.cell(size, b, steps), split),
        )

    def lengths(self, size: str) -> list[int | None]:
        """The training lengths any paper variant ran at ``size``, shortest first (None: the
        size's own); a variant that has not run one shows "--" there."""
        found = {steps for s, v, steps in self.index if s == size and v in PAPER}
        return sorted(found, key=lambda n: n or self.own_updates(size))

    def own_updates(self, size: str) -> int | None:
        """The size file's updates (None where no run of the size trained them)."""
        key = (self.tok, size, None)
        return next(
            (
                run_record(r).updates
                for r in self.rows
                if (parse(r)["tok"], parse(r)["size"], parse(r)["steps"]) == key
            ),
            None,
        )

    def tokens(self, size: str, steps: int | None) -> int:
        return self.first(size, steps)["tokens_seen"]

    def trained(self, size: str, steps: int | None) -> int:
        """The updates the runs at ``size`` and ``steps`` trained."""
        return run_record(self.first(size, steps)).updates

    def params(self, size: str, steps: int | None = None) -> int:
        """The non-embedding parameters at ``size``."""
        return run_record(self.first(size, steps)).non_embedding

    def per_param(self, size: str, steps: int | None) -> float:
        """Training tokens per non-embedding parameter at ``size`` and ``steps``."""
        return self.tokens(size, steps) / self.params(size, steps)

    def first(self, size: str, steps: int | None) -> dict:
        """A run of a paper variant at ``size`` and ``steps`` (for what they share: parameters,
        tokens)."""
        return next(row for v in PAPER for row in self.cell(size, v, steps).values())


def validation_set(row: dict) -> str:
    """What the study validated on, from the run's configs."""
    data = run_record(row).config.get("data", {})
    blocks = f"{data.get('val_sequences')} blocks of {data.get('seq_len')} targets"
    if data.get("val_per_document"):
        return f"{blocks} spread over every held-out document, the same for every run"
    return f"{blocks}, the same for every run"
