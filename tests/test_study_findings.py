"""The study's findings by construction (experiments/report/findings.py, prose.py): every
sentence that states a result is drawn from the runs file, its word chosen by rule, and the
committed pages hold exactly what the runs give.

The perturbation tests change one run of a copy of the committed runs file so that one p crosses
0.05, or one seed changes sign, and show that the rendered finding's word changes with it."""

import copy
import json
import math
from functools import cache
from pathlib import Path

import pytest

from experiments.plan.names import parse_name
from experiments.report.findings import (
    ESTABLISHED,
    NOT,
    SIGN,
    VOCABULARY,
    Claim,
    family,
    sensitivity,
    word,
)
from experiments.report.prose import BLOCKS, begin, bodies, findings, splice
from experiments.report.results import Study

ROOT = Path(__file__).resolve().parents[1]
RUNS = ROOT / "docs" / "results" / "study-v3-runs.json"
STEM = "study-v3"


@cache
def _rows() -> tuple:
    return tuple(json.loads(RUNS.read_text())["runs"])


def _study(change=None) -> Study:
    rows = copy.deepcopy(list(_rows()))
    if change:
        change({r["name"]: r for r in rows})
    return Study(rows)


def _row_of(text: str, size: str, updates: str, gap: str) -> list[str]:
    """The val and test cells of a gap's row in the findings' gap tables."""
    lines = text.splitlines()
    line = next(
        line
        for line in lines
        if line.startswith(f"| {size} | {updates} |") and f"| {gap} |" in line
    )
    return line.split(" | ")[4:6]


def _word(cell: str) -> str:
    return cell.rsplit("**", 2)[-2]


def test_the_committed_pages_hold_the_findings_the_runs_give():
    """A stale hand edit inside a generated block, or runs changed without a render, fails here."""
    drawn = bodies(_study())
    for name, page in BLOCKS.items():
        text = (ROOT / page).read_text()
        assert begin(STEM, name) in text, f"{page} has lost its {name} block's markers"
        assert splice(text, STEM, name, drawn[name]) == text, (
            f"{page}: redraw with `python experiments/study.py --render`"
        )


def test_a_hand_edit_inside_a_block_is_stale_and_one_outside_is_not():
    drawn = bodies(_study())
    text = (ROOT / "README.md").read_text()
    inside = text.replace("**same sign in every seed, not established**", "**established**", 1)
    assert inside != text and splice(inside, STEM, "results", drawn["results"]) == text
    outside = text.replace("## Results", "## Results (edited by hand)")
    assert splice(outside, STEM, "results", drawn["results"]) == outside
    with pytest.raises(ValueError, match="no block"):
        splice(text.replace(begin(STEM, "results"), ""), STEM, "results", "x")


def test_the_rule_chooses_every_word():
    claim = Claim("x", "difference", 0.1, 0.0, 0.2, 0.01, (0.1, 0.12, 0.08), ())
    assert word(0.049, claim) == ESTABLISHED
    assert word(0.05, claim) == SIGN  # not below 0.05: the signs decide
    flipped = Claim("x", "difference", 0.1, -0.1, 0.3, 0.2, (0.1, -0.01, 0.2), ())
    # the family's p alone establishes
    assert word(0.2, flipped) == NOT and word(0.01, flipped) == ESTABLISHED
    # one seed
    assert word(math.nan, Claim("x", "difference", 0.1, 0.1, 0.1, math.nan, (0.1,), ())) == NOT
    assert ESTABLISHED in VOCABULARY and SIGN in VOCABULARY and "Holm" in VOCABULARY


def test_the_family_is_declared_once_and_its_edges_are_reported():
    study = _study()
    claims = family(study)
    kinds = [c.kind for c, _ in claims.values()]
    assert (kinds.count("difference"), kinds.count("slope")) == (52, 16)
    text = findings(study)
    # declared before its numbers
    assert text.index("**The family.** 68 tests") < text.index("| S | 108 |")
    moved = sensitivity(study)
    # binary16 − learned at L on val rests on where the family's edge is drawn: it is established
    # only without slopes
    two = moved["the slopes as a family of their own, the differences as another"]
    assert ("binary16 − learned, L, 2.10M tokens, val", SIGN, ESTABLISHED) in two
    edge = (
        "binary16 − learned, L, 2.10M tokens, val: same sign in every seed, not established → "
        "**established**"
    )
    assert edge in text


def test_changed_tree_rows_are_marked_where_they_enter_and_sessions_hold_every_row():
    study = _study()
    text = findings(study)
    assert "8 rows were trained from a tree with uncommitted edits" in text
    val, test = _row_of(text, "S", "1,728", "binary16 − learned")
    assert "†" in val and "†" in test
    assert "†" not in "".join(_row_of(text, "S", "1,024", "binary16 − learned"))
    assert "| 3 | 07:47–10:06 | 23 |" in text  # the session's runs, counted from its rows
    orphan = _study(lambda rows: rows["bpe8k-l/gf2-lr0.002-seed2-code2"].update(commit="f" * 40))
    with pytest.raises(ValueError, match="every row trained here"):
        findings(orphan)


def _shift(rows: dict, name: str, delta: float) -> None:
    rows[name]["val_bpb"] += delta


def test_a_p_that_crosses_alpha_changes_the_word_both_ways():
    base = findings(_study())
    assert _word(_row_of(base, "S", "108", "binary16 − learned")[0]) == ESTABLISHED
    assert _word(_row_of(base, "L", "1,024", "binary16 − learned")[0]) == SIGN
    # S, val: seed 3's gap grows by 0.1 (seed 1, which chose the rates, untouched): every seed
    # still positive, the spread too wide for the family
    noisy = findings(_study(lambda rows: _shift(rows, "bpe8k-s/binary16-lr0.002-seed3", 0.1)))
    assert _word(_row_of(noisy, "S", "108", "binary16 − learned")[0]) == SIGN

    # L, val: seeds 2 and 3 moved to seed 1's gap (to 1e-4): the same gap, no noise left to doubt it
    def steady(rows):
        learned = {s: rows[f"bpe8k-l/learned-lr0.003-seed{s}"]["val_bpb"] for s in (1, 2, 3)}
        gap = rows["bpe8k-l/binary16-lr0.002-seed1"]["val_bpb"] - learned[1]
        for s, jitter in ((2, 1e-4), (3, -1e-4)):
            rows[f"bpe8k-l/binary16-lr0.002-seed{s}"]["val_bpb"] = learned[s] + gap + jitter

    assert (
        _word(_row_of(findings(_study(steady)), "L", "1,024", "binary16 − learned")[0])
        == ESTABLISHED
    )


def test_one_seed_changing_sign_changes_the_word():
    def flip(rows):
        learned = rows["bpe8k-m/learned-lr0.003-seed2"]["val_bpb"]
        rows["bpe8k-m/binary16-lr0.003-seed2"]["val_bpb"] = learned - 0.01

    base, flipped = (findings(_study(change)) for change in (None, flip))
    assert _word(_row_of(base, "M", "432", "binary16 − learned")[0]) == SIGN
    assert _word(_row_of(flipped, "M", "432", "binary16 − learned")[0]) == NOT
    assert "binary16 − learned is positive in 41 of its 42" in flipped


def test_the_rows_named_in_the_perturbations_are_the_compared_ones():
    """The perturbed rows are the cells the findings compare (else the tests above would prove
    nothing)."""
    study = _study()
    for size, variant, lr in (
        ("s", "binary16", 2e-3),
        ("l", "binary16", 2e-3),
        ("l", "learned", 3e-3),
        ("m", "binary16", 3e-3),
        ("m", "learned", 3e-3),
    ):
        assert study.rate(size, variant) == lr
        assert {parse_name(r["name"])["lr"] for r in study.cell(size, variant).values()} == {lr}
