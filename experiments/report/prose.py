"""The study's findings as text, drawn from the runs file alone (findings.py chooses every
word).

Two blocks: the findings of ``docs/results/README.md`` and the results paragraph of
``README.md``. Each sits between markers in its page; ``--render`` (render.render)
rewrites what is between them and nothing else, and tests/test_study_findings.py redraws both
and compares them byte for byte with the committed pages, so a hand edit inside a block fails.
Text outside the markers is hand-written and states no result.
"""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path

from experiments.launch.executor import ROOT
from experiments.plan.names import CONTROLS
from experiments.report.findings import (
    FAMILY,
    VOCABULARY,
    Claim,
    family,
    gap_label,
    sensitivity,
    series,
    slope_label,
    word,
)
from experiments.report.results import GAPS, SPLITS, Points, Study
from experiments.report.tables import codebook_note
from fixed_embed.atomic import atomic_write_text

# The sessions that trained the study's own rows: data, beside the runs file (its "about" says what)
SESSIONS = ROOT / "docs" / "results" / "study-v3-sessions.json"
# block -> page, from the repository root
BLOCKS = {
    "findings": "docs/results/README.md",
    "results": "README.md",
}
CHANGED = "†"


def begin(stem: str, name: str) -> str:
    return (
        f"<!-- begin {stem} {name}: drawn by `python experiments/study.py --render` from "
        f"{stem}-runs.json; an edit here fails tests/test_study_findings.py -->"
    )


def splice(text: str, stem: str, name: str, body: str) -> str:
    """``text`` with the block ``name`` replaced by ``body``; ValueError where its markers are
    not there once."""
    head, tail = begin(stem, name), f"<!-- end {stem} {name} -->"
    if text.count(head) != 1 or text.count(tail) != 1 or text.index(head) > text.index(tail):
        raise ValueError(f"the page has no block {name!r} of {stem} between its markers")
    before, rest = text.split(head)
    return f"{before}{head}\n{body}{tail}{rest.split(tail)[1]}"


def write_pages(bodies: dict[str, str], stem: str, root: Path) -> None:
    """Rewrite each page's block (a page without the markers is left alone: a render into
    another folder)."""
    for name, page in BLOCKS.items():
        path = root / page
        if path.is_file() and begin(stem, name) in (text := path.read_text()):
            atomic_write_text(path, splice(text, stem, name, bodies[name]))


class Prose:
    """The family's claims, their words and the rows behind them, for the two blocks."""

    def __init__(self, study: Study) -> None:
        self.study = study
        self.claims = family(study)
        self.changed = {r["name"] for r in study.rows if r.get("code_changed")}

    def mark(self, claim: Claim) -> str:
        return CHANGED if self.changed & set(claim.rows) else ""

    def said(self, label: str, brief: bool = False) -> str:
        """``+0.211 ± 0.008, Holm p 0.0251: **established**`` (``†`` where a changed-tree row
        enters it); a slope ``-0.135 per 10x parameters (95 % ..., uncorrected; 3 points), Holm
        p ...: **...**``, ``brief``: without its interval."""
        claim, adjusted = self.claims[label]
        if claim.kind != "slope":
            spread = f" ± {statistics.stdev(claim.per_seed):.3f}"
        elif brief:
            spread = f" per {claim.per}"
        else:
            spread = (
                f" per {claim.per} (95 % {claim.low:+.3f} to {claim.high:+.3f}, uncorrected; "
                f"{claim.points} points)"
            )
        holm = "no test" if math.isnan(adjusted) else f"Holm p {adjusted:.3g}"
        return (
            f"{claim.estimate:+.3f}{spread}{self.mark(claim)}, {holm}: **{word(adjusted, claim)}**"
        )


def _family_lines(prose: Prose) -> list[str]:
    kinds = [c.kind for c, _ in prose.claims.values()]
    lines = [
        f"**The family.** {len(kinds)} tests are corrected together (Holm): the "
        f"{kinds.count('difference')} paired differences (every gap at every size and training "
        "length at the rates chosen there, on both splits, and every control against learned "
        f"and binary16) and the {kinds.count('slope')} slopes "
        f"({', '.join(series(prose.study))}; binary16 − learned and gf2 − learned on "
        "both splits). The sweep tables' differences between rates and the gaps at the rates of "
        "another length are outside it. Drawn otherwise:",
        "",
    ]
    for name, moved in sensitivity(prose.study).items():
        text = "; ".join(f"{label}: {was} → **{now}**" for label, was, now in moved)
        lines.append(f"- {name}: {text or 'no claim changes word'}.")
    return lines


def _provenance(prose: Prose) -> list[str]:
    entered = [label for label, (c, _) in prose.claims.items() if prose.mark(c)]
    aside = sorted(prose.changed - {name for c, _ in prose.claims.values() for name in c.rows})
    if not prose.changed:
        return ["**Provenance.** Every row trained here was trained from a committed tree."]
    text = (
        f"**Provenance.** {len(prose.changed)} rows were trained from a tree with uncommitted "
        f"edits (`code_changed: true`): {', '.join(f'`{n}`' for n in sorted(prose.changed))}. "
        f"They enter {len(entered)} of the family's claims, each marked {CHANGED}: "
        f"{'; '.join(entered) or 'none'}."
    )
    if aside:
        text += (
            f" Of them, {', '.join(f'`{n}`' for n in aside)} enter no claim, only the sweep "
            "tables of the report (the choice of a rate)."
        )
    return [text]


def _gap_rows(prose: Prose, points: Points) -> list[str]:
    study = prose.study
    lines = [
        f"| size | updates | tokens / non-emb. param | gap | {' | '.join(SPLITS)} |",
        "|---|---:|---:|---|---|---|",
    ]
    for size, steps in points:
        for a, b in GAPS:
            labels = [gap_label(study, size, steps, a, b, split) for split in SPLITS]
            if cells := [prose.said(label) for label in labels if label in prose.claims]:
                lines.append(
                    f"| {size.upper()} | {study.trained(size, steps):,} | "
                    f"{study.per_param(size, steps):.2f} | {b} − {a} | {' | '.join(cells)} |"
                )
    return lines


def _sign_count(prose: Prose, a: str, b: str) -> str:
    found = [
        (label.rsplit(",", 1)[0], c.per_seed)
        for label, (c, _) in prose.claims.items()
        if c.kind == "difference" and label.startswith(f"{b} − {a},")
    ]
    diffs = [x for _, per_seed in found for x in per_seed]
    return (
        f"{b} − {a} is positive in {sum(x > 0 for x in diffs)} of its {len(diffs)} seed-paired "
        f"differences ({len({point for point, _ in found})} size and length points, both splits)"
    )


def _slope_lines(prose: Prose) -> list[str]:
    return [
        f"- {label}: {prose.said(label)}. Along it varied: {claim.varied}."
        for label, (claim, _) in prose.claims.items()
        if claim.kind == "slope"
    ]


def _control_lines(prose: Prose) -> list[str]:
    study, size = prose.study, prose.study.tune
    lines = [
        f"| control (size {size.upper()}, val) | − learned | − binary16 | position, learned 0 to "
        "binary16 1 (95 %, uncorrected; not a test) |",
        "|---|---|---|---|",
    ]
    for v in CONTROLS:
        labels = [f"{v} − {ref}, {size.upper()}, val" for ref in ("learned", "binary16")]
        if not all(label in prose.claims for label in labels):
            continue
        share = study.position(size, v)
        low, high = share.ci()
        lines.append(
            f"| {v} | {prose.said(labels[0])} | {prose.said(labels[1])} | {share.mean:.2f} "
            f"({low:.2f} to {high:.2f}) |"
        )
    return lines


def _compute_lines(study: Study) -> list[str]:
    here = [r for r in study.rows if not r.get("adopted_from")]
    lines = [
        "| session | wall clock (its log) | runs | of them resumed | hours summed over runs | "
        "commits |",
        "|---|---|---:|---:|---:|---|",
    ]
    placed: list[str] = []
    for session in json.loads(SESSIONS.read_text())["sessions"]:
        rows = [r for r in here if r["commit"][:10] in session["commits"]]
        placed += [r["name"] for r in rows]
        lines.append(
            f"| {session['session']} | {session['wall_clock']} | {len(rows)} | "
            f"{sum(bool(r.get('resumed')) for r in rows)} | "
            f"{sum(r['wall_seconds'] for r in rows) / 3600:.1f} | {len(session['commits'])} |"
        )
    if sorted(placed) != sorted(r["name"] for r in here):
        raise ValueError("the sessions' commits do not hold every row trained here exactly once")
    return [
        f"**Compute.** {len(study.rows)} runs: {len(study.rows) - len(here)} adopted from study v2 "
        f"and {len(here)} trained here, {sum(r['wall_seconds'] for r in here) / 3600:.1f} h summed "
        "over those (a resumed run counts its last attempt only), by session:",
        "",
        *lines,
    ]


def findings(study: Study) -> str:
    """The findings block of docs/results/README.md."""
    prose = Prose(study)
    sizes = study.sizes
    own = [(s, None) for s in sizes]
    others = [(s, n) for s in sizes for n in study.lengths(s) if n is not None]
    lines = [
        f"**The words.** {VOCABULARY}",
        "",
        *_family_lines(prose),
        "",
        *_provenance(prose),
        "",
        f"**Every run.** {_sign_count(prose, 'learned', 'binary16')}; "
        f"{_sign_count(prose, 'learned', 'gf2')}.",
        "",
        "**Gaps at each size's own length** (equal tokens per non-embedding parameter; "
        f"bits/byte, mean ± sd over seeds, paired by seed). {codebook_note(study, own)}",
        "",
        *_gap_rows(prose, own),
        "",
        "**Slopes**, each named with what varied along it:",
        "",
        *_slope_lines(prose),
        "",
        f"**Gaps at the other training lengths.** {codebook_note(study, others)}",
        "",
        *_gap_rows(prose, others),
        "",
        "**Controls** (paired by seed at their paper variant's rate):",
        "",
        *_control_lines(prose),
        "",
        *_compute_lines(study),
        "",
    ]
    return "\n".join(lines)


def results(study: Study) -> str:
    """The results paragraph of README.md: the same claims, fewer of them, the same words."""
    prose = Prose(study)
    sizes = study.sizes
    params = [study.params(s) for s in sizes]
    seeds = max(len(c.per_seed) for c, _ in prose.claims.values())
    own = "; ".join(
        f"{s.upper()} "
        + ", ".join(
            f"{sp} {prose.said(gap_label(study, s, None, 'learned', 'binary16', sp))}"
            for sp in SPLITS
        )
        for s in sizes
    )
    trends = []
    for name in series(study):
        if name.startswith("size") or name == f"length, at {sizes[0].upper()}":
            labels = [slope_label(name, "learned", "binary16", split) for split in SPLITS]
            said = ", ".join(
                f"{split} {prose.said(label, brief=True)}"
                for split, label in zip(SPLITS, labels, strict=True)
            )
            varied = prose.claims[labels[0]][0].varied  # "size (...); training tokens (...)"
            moved = ", ".join(part.split(" (")[0] for part in varied.split("; "))
            trends.append(f"along {name}: {said} (with {moved} varying along it)")
    matched = [f"matched − {ref}, {study.tune.upper()}, val" for ref in ("learned", "binary16")]
    text = (
        f"At small scale (study v3: {params[0] / 1e6:.2f}M–{params[-1] / 1e6:.2f}M non-embedding "
        f"parameters, each size tuned on its own, {seeds} seeds; `make study`), "
        f"{_sign_count(prose, 'learned', 'binary16')}. At each size's own length, binary16 − "
        f"learned in bits/byte: {own}. Its slope {'; '.join(trends)}. binary16 widened to the "
        f"learned model's trainable parameters (`matched`): − learned {prose.said(matched[0])}; "
        f"− binary16 {prose.said(matched[1])}. Every word follows one rule and one declared Holm "
        f"family ({' and '.join(FAMILY)}), printed with the findings in "
        "[docs/results/](docs/results/README.md#what-study-v3-found)."
    )
    if CHANGED in text:
        text += f" {CHANGED}: rows trained from a tree with uncommitted edits enter that number."
    return text + "\n"


def bodies(study: Study) -> dict[str, str]:
    return {"findings": findings(study), "results": results(study)}
