"""The study's findings as text, drawn from the runs file alone (findings.py chooses every
word).

Two blocks: the findings of ``docs/results/README.md`` and the results paragraph of
``README.md``. Each sits between markers in its page; ``--render`` (render.render)
rewrites what is between them and nothing else, and tests/test_study_findings.py redraws both
and compares them byte for byte with the committed pages, so a hand edit inside a block fails.
Text outside the markers is hand-written and states no result.
"""

from __future__ import annotations

import math
import statistics
from pathlib import Path

from experiments.plan.names import CONTROLS
from experiments.report.findings import (
    FAMILY,
    VOCABULARY,
    Claim,
    family,
    gap_label,
    sensitivity,
    series,
    word,
)
from experiments.report.results import GAPS, SPLITS, Study, non_embedding, updates
from experiments.report.tables import codebook_note
from fixed_embed.atomic import atomic_write_text

# The sessions that trained the study's own rows, each by the commits its rows name (a resumed row
# names its last attempt's). Wall clock is from each session's log, which the runs file does not
# hold; the runs and hours are counted from the rows.
SESSIONS = (
    ("1", "about 2.5 h (its log went with that machine)", ("69c3280ff4",)),
    (
        "2",
        "14:28–16:45",
        ("f07dae3be1", "7a9084faa6", "62fd4b35e4", "57bc760189", "2b5720adfa", "1c2c33557e"),
    ),
    (
        "3",
        "07:47–10:06",
        (
            "44e3c76570",
            "93290ec604",
            "f802c9dbca",
            "be1b65e926",
            "adfd684cf8",
            "1d8e62bf72",
            "93de601f14",
            "c8f90954df",
            "fa6efe8856",
        ),
    ),
    ("4 (issue 34)", "17:01–18:50", ("c78e7fa358", "3286d8023d", "ff41f790b6", "9245749b82")),
    ("5", "20:00–21:14", ("f99420db34",)),
)
BLOCKS = {
    "findings": "docs/results/README.md",
    "results": "README.md",
}  # block -> page, from the repository root
CHANGED = "†"


def begin(stem: str, name: str) -> str:
    return (
        f"<!-- begin {stem} {name}: drawn by `python experiments/study.py --render` from "
        f"{stem}-runs.json; "
        "an edit here fails tests/test_study_findings.py -->"
    )


def end(stem: str, name: str) -> str:
    return f"<!-- end {stem} {name} -->"


def splice(text: str, stem: str, name: str, body: str) -> str:
    """``text`` with the block ``name`` replaced by ``body``; ValueError where its markers are
    not there once."""
    head, tail = begin(stem, name), end(stem, name)
    if text.count(head) != 1 or text.count(tail) != 1 or text.index(head) > text.index(tail):
        raise ValueError(f"the page has no block {name!r} of {stem} between its markers")
    before, rest = text.split(head)
    return before + head + "\n" + body + tail + rest.split(tail)[1]


def stale(text: str, stem: str, bodies: dict[str, str]) -> list[str]:
    """The blocks of ``bodies`` present in ``text`` whose contents differ from what the runs
    give."""
    present = [name for name in bodies if begin(stem, name) in text]
    return [name for name in present if splice(text, stem, name, bodies[name]) != text]


def write_pages(bodies: dict[str, str], stem: str, root: Path) -> None:
    """Rewrite each page's block (a page without the markers is left alone: a render into
    another folder)."""
    for name, page in BLOCKS.items():
        path = root / page
        if path.is_file() and begin(stem, name) in (text := path.read_text()):
            atomic_write_text(path, splice(text, stem, name, bodies[name]))


class Prose:
    """The family's claims, their words and the rows behind them, for the two blocks."""

    def __init__(self, study: Study, tok: str) -> None:
        self.study, self.tok = study, tok
        self.claims = family(study, tok)
        self.changed = {r["name"] for r in study.rows if r.get("code_changed")}

    def word(self, label: str) -> str:
        claim, adjusted = self.claims[label]
        return word(adjusted, claim)

    def mark(self, claim: Claim) -> str:
        return CHANGED if self.changed & set(claim.rows) else ""

    def said(self, label: str, decimals: int = 3, unit: str = "", brief: bool = False) -> str:
        """``+0.211 ± 0.008, Holm p 0.0251: **established**`` (``†`` where a changed-tree row
        enters it); a slope ``-0.135 per 10x parameters (95 % ..., uncorrected; 3 points), Holm
        p ...: **...**``."""
        claim, adjusted = self.claims[label]
        if claim.kind == "slope" and brief:
            spread = f" per {unit}"
        elif claim.kind == "slope":
            spread = (
                f" per {unit} (95 % {claim.low:+.{decimals}f} to {claim.high:+.{decimals}f}, "
                "uncorrected; "
                f"{claim.points} points)"
                if unit
                else ""
            )
        else:
            spread = f" ± {statistics.stdev(claim.per_seed):.{decimals}f}"
        holm = "no test" if math.isnan(adjusted) else f"Holm p {adjusted:.3g}"
        return (
            f"{claim.estimate:+.{decimals}f}{spread}{self.mark(claim)}, {holm}: "
            f"**{self.word(label)}**"
        )

    def gap(self, size: str, steps: int | None, a: str, b: str, split: str) -> str:
        return gap_label(size, self.study.tokens(self.tok, size, steps), a, b, split)


def _family_lines(prose: Prose) -> list[str]:
    kinds = [c.kind for c, _ in prose.claims.values()]
    lines = [
        f"**The family.** {len(kinds)} tests are corrected together (Holm): the "
        f"{kinds.count('difference')} "
        "paired differences (every gap at every size and training length at the rates chosen "
        "there, on both "
        "splits, and every control against learned and binary16) and the "
        f"{kinds.count('slope')} slopes ({', '.join(series(prose.study, prose.tok))}; binary16 − "
        "learned and "
        "gf2 − learned on both splits). The sweep tables' differences between rates and the gaps "
        "at the rates "
        "of another length are outside it. Drawn otherwise:",
        "",
    ]
    for name, moved in sensitivity(prose.study, prose.tok):
        text = "; ".join(f"{label}: {was} → **{now}**" for label, was, now in moved)
        lines.append(f"- {name}: " + (text if moved else "no claim changes word") + ".")
    return lines


def _provenance(prose: Prose) -> list[str]:
    entered = [label for label, (c, _) in prose.claims.items() if prose.mark(c)]
    aside = sorted(prose.changed - {name for c, _ in prose.claims.values() for name in c.rows})
    if not prose.changed:
        return ["**Provenance.** Every row trained here was trained from a committed tree."]
    text = (
        f"**Provenance.** {len(prose.changed)} rows were trained from a tree with uncommitted "
        "edits "
        f"(`code_changed: true`): {', '.join(f'`{n}`' for n in sorted(prose.changed))}. They enter "
        f"{len(entered)} of the family's claims, each marked {CHANGED}: "
        f"{'; '.join(entered) or 'none'}."
    )
    if aside:
        text += (
            f" Of them, {', '.join(f'`{n}`' for n in aside)} enter no claim, only the sweep tables "
            "of the "
            "report (the choice of a rate)."
        )
    return [text]


def _gap_rows(prose: Prose, points: list[tuple[str, int | None]]) -> list[str]:
    study, tok = prose.study, prose.tok
    lines = [
        "| size | updates | tokens / non-emb. param | gap | " + " | ".join(SPLITS) + " |",
        "|---|---:|---:|---|---|---|",
    ]
    for size, steps in points:
        row = study.first(tok, size, steps)
        for a, b in GAPS:
            cells = [
                prose.said(prose.gap(size, steps, a, b, split))
                for split in SPLITS
                if prose.gap(size, steps, a, b, split) in prose.claims
            ]
            if cells:
                lines.append(
                    f"| {size.upper()} | {updates(row):,} | "
                    f"{row['tokens_seen'] / non_embedding(row):.2f} | "
                    f"{b} − {a} | " + " | ".join(cells) + " |"
                )
    return lines


def _sign_count(prose: Prose, a: str, b: str) -> str:
    diffs = [
        x
        for label, (c, _) in prose.claims.items()
        if c.kind == "difference" and label.startswith(f"{b} − {a},")
        for x in c.per_seed
    ]
    points = len(
        {
            label.rsplit(",", 1)[0]
            for label, (c, _) in prose.claims.items()
            if c.kind == "difference" and label.startswith(f"{b} − {a},")
        }
    )
    return (
        f"{b} − {a} is positive in {sum(x > 0 for x in diffs)} of its {len(diffs)} seed-paired "
        "differences "
        f"({points} size and length points, both splits)"
    )


def _slope_lines(prose: Prose) -> list[str]:
    lines = []
    for label, (claim, _) in prose.claims.items():
        if claim.kind != "slope":
            continue
        unit = "10x parameters" if "along size" in label else "10x training tokens"
        lines.append(f"- {label}: {prose.said(label, unit=unit)}. Along it varied: {claim.varied}.")
    return lines


def _control_lines(prose: Prose) -> list[str]:
    study, tok, size = prose.study, prose.tok, prose.study.tune
    lines = [
        f"| control (size {size.upper()}, val) | − learned | − binary16 | position, learned 0 to "
        "binary16 1 "
        "(95 %, uncorrected; not a test) |",
        "|---|---|---|---|",
    ]
    for v in CONTROLS:
        labels = [f"{v} − {ref}, {size.upper()}, val" for ref in ("learned", "binary16")]
        if not all(label in prose.claims for label in labels):
            continue
        share = study.position(tok, size, v)
        low, high = share.ci()
        lines.append(
            f"| {v} | {prose.said(labels[0])} | {prose.said(labels[1])} | {share.mean:.2f} "
            f"({low:.2f} to "
            f"{high:.2f}) |"
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
    for name, wall, commits in SESSIONS:
        rows = [r for r in here if r["commit"][:10] in commits]
        placed += [r["name"] for r in rows]
        lines.append(
            f"| {name} | {wall} | {len(rows)} | {sum(bool(r.get('resumed')) for r in rows)} | "
            f"{sum(r['wall_seconds'] for r in rows) / 3600:.1f} | {len(commits)} |"
        )
    if sorted(placed) != sorted(r["name"] for r in here):
        raise ValueError("the sessions' commits do not hold every row trained here exactly once")
    adopted = len(study.rows) - len(here)
    return [
        f"**Compute.** {len(study.rows)} runs: {adopted} adopted from study v2 and {len(here)} "
        "trained here, "
        f"{sum(r['wall_seconds'] for r in here) / 3600:.1f} h summed over those (a resumed run "
        "counts its last "
        "attempt only), by session:",
        "",
        *lines,
    ]


def findings(study: Study, tok: str) -> str:
    """The findings block of docs/results/README.md."""
    prose = Prose(study, tok)
    sizes = study.sizes(tok)
    own = [(s, None) for s in sizes]
    others = [(s, n) for s in sizes for n in study.lengths(tok, s) if n is not None]
    lines = [
        "**The words.** " + VOCABULARY,
        "",
        *_family_lines(prose),
        "",
        *_provenance(prose),
        "",
        f"**Every run.** {_sign_count(prose, 'learned', 'binary16')}; "
        f"{_sign_count(prose, 'learned', 'gf2')}.",
        "",
        "**Gaps at each size's own length** (equal tokens per non-embedding parameter; bits/byte, "
        "mean ± sd "
        "over seeds, paired by seed). " + codebook_note(study, tok, own),
        "",
        *_gap_rows(prose, own),
        "",
        "**Slopes**, each named with what varied along it:",
        "",
        *_slope_lines(prose),
        "",
        "**Gaps at the other training lengths.** " + codebook_note(study, tok, others),
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


def results(study: Study, tok: str) -> str:
    """The results paragraph of README.md: the same claims, fewer of them, the same words."""
    prose = Prose(study, tok)
    sizes = study.sizes(tok)
    params = [non_embedding(study.first(tok, s, None)) for s in sizes]
    seeds = max(len(c.per_seed) for c, _ in prose.claims.values())
    own = "; ".join(
        f"{s.upper()} "
        + ", ".join(
            f"{sp} {prose.said(prose.gap(s, None, 'learned', 'binary16', sp))}" for sp in SPLITS
        )
        for s in sizes
    )
    trends = []
    for name in series(study, tok):
        if name.startswith("size") or name == f"length, at {sizes[0].upper()}":
            labels = [f"binary16 − learned, slope along {name}, {split}" for split in SPLITS]
            claim = prose.claims[labels[0]][0]
            unit = "10x parameters" if name.startswith("size") else "10x training tokens"
            said = ", ".join(
                f"{sp} {prose.said(lb, unit=unit, brief=True)}"
                for sp, lb in zip(SPLITS, labels, strict=True)
            )
            trends.append(f"along {name}: {said} (with {_names(claim.varied)} varying along it)")
    matched = [f"matched − {ref}, {study.tune.upper()}, val" for ref in ("learned", "binary16")]
    text = (
        f"At small scale (study v3: {params[0] / 1e6:.2f}M–{params[-1] / 1e6:.2f}M non-embedding "
        "parameters, each "
        f"size tuned on its own, {seeds} seeds; `make study`), "
        f"{_sign_count(prose, 'learned', 'binary16')}. "
        f"At each size's own length, binary16 − learned in bits/byte: {own}. Its slope "
        f"{'; '.join(trends)}. "
        f"binary16 widened to the learned model's trainable parameters (`matched`): − learned "
        f"{prose.said(matched[0])}; − binary16 {prose.said(matched[1])}. Every word follows one "
        "rule and one "
        f"declared Holm family ({' and '.join(FAMILY)}), printed with the findings in "
        "[docs/results/](docs/results/README.md#what-study-v3-found)."
    )
    if CHANGED in text:
        text += f" {CHANGED}: rows trained from a tree with uncommitted edits enter that number."
    return text + "\n"


def _names(varied: str) -> str:
    """``size (...); training tokens (...)`` -> ``size, training tokens``."""
    return ", ".join(part.split(" (")[0] for part in varied.split("; "))


def bodies(study: Study, tok: str) -> dict[str, str]:
    return {"findings": findings(study, tok), "results": results(study, tok)}
