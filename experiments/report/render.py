"""The study's report (see study.py): tables and figures drawn from its runs file alone.

Every number comes from ``OUT-runs.json``: a row per run with its validation bits per byte, its
lm-eval scores, its wall time and its logged curves. Nothing is read from ``logs/``, so the
report can be redrawn on any machine from the committed file (``--render``). The runs are
indexed by results.py, the tables drawn by tables.py and sweeps.py and the figures by
figures.py; this file puts them in order. The claims and their words come from
findings.py (one declared Holm family, one rule); rendering the committed report also
redraws the findings blocks of docs/results/README.md and README.md (prose.py), between
their markers.
"""

from __future__ import annotations

import json
from pathlib import Path

from experiments.plan.names import CONTROLS
from experiments.report.adoption import check_lines
from experiments.report.figures import plot_controls, plot_curves, plot_gaps, plot_sweep
from experiments.report.findings import EQUAL_TOKENS, OWN_LENGTH, family, series
from experiments.report.prose import bodies, write_pages
from experiments.report.results import Study, parse, validation_set
from experiments.report.sweeps import moved_lines, rates_note, sweep_lines
from experiments.report.tables import (
    codebook_lines,
    codebook_note,
    control_lines,
    design_lines,
    fit_lines,
    gap_table,
    size_table,
    test_lines,
)
from fixed_embed.atomic import atomic_write_text


def render(data: dict, out: Path, tune: str = "m", adoption: Path | None = None) -> None:
    """``OUT.md`` and its figures from the runs file's contents (and the adoption check's
    record, if given)."""
    if not data["runs"]:
        raise SystemExit(f"{out.name}: the runs file has no runs yet")
    study = Study(data["runs"], tune)
    out.parent.mkdir(parents=True, exist_ok=True)
    claims = family(study)  # the declared family: every word below is chosen from it
    fits = series(study)  # the fits' points: size, equal tokens, length at each size
    lines = _header(data, study, out.name)
    if adoption is not None and adoption.is_file():
        lines += [*check_lines(json.loads(adoption.read_text()), adoption.name), ""]
    lines += sweep_lines(study)
    sweeps = [(s, n) for s in study.sizes for n in study.sweeps(s)]
    if sweeps:
        plot_sweep(study, sweeps, _figure(out, "sweep"))
        lines += [f"![learning-rate sweep]({out.name}-sweep.png)", ""]
    lines += _sizes(study, claims, fits, out)
    lines += _lengths(study, claims, fits, out)
    plot_curves(study, _figure(out, "val-bpb"))
    lines += [f"![validation bits/byte]({out.name}-val-bpb.png)", "", *codebook_lines(study)]
    lines += [*_controls(study, claims, out), *test_lines(claims), ""]
    for tok in sorted({parse(r)["tok"] for r in study.rows} - {study.tok}):
        other = Study(study.rows, tune, tok)
        own = [(s, None) for s in other.sizes]
        table = [*size_table(other), "", *gap_table(other, own)]
        lines += [f"## Tokenizer {tok}", "", *table, ""]
    atomic_write_text(f"{out}.md", "\n".join([*lines, *_commands(study)]) + "\n")
    root = out.resolve().parent.parent.parent
    if out.resolve().parent == root / "docs" / "results":  # the committed report: its pages' too
        write_pages(bodies(study), out.name, root)


def _figure(out: Path, suffix: str) -> Path:
    return out.parent / f"{out.name}-{suffix}.png"


def _header(data: dict, study: Study, stem: str) -> list[str]:
    """The title, what ran and where it is recorded, and the two splits."""
    here = [r for r in study.rows if not r.get("adopted_from")]
    sources = ", ".join(
        f"`{a}`" for a in sorted({r.get("adopted_from") for r in study.rows} - {None})
    )
    resumed = sum(bool(r.get("resumed")) for r in here)
    commits = ", ".join(f"`{c}`" for c in sorted({r["commit"][:10] for r in study.rows}))
    adopted = (
        f", {len(study.rows) - len(here)} of them adopted from {sources} (the same flags: copied, "
        "not rerun)"
        if sources
        else ""
    )
    resumes = (
        f" ({resumed} of them resumed after a stop count their last attempt only)"
        if resumed
        else ""
    )
    summary = (
        f"{len(study.rows)} runs{adopted}; {sum(r['wall_seconds'] for r in here) / 3600:.1f} h of "
        f"training and evaluation summed over the {len(here)} runs trained here"
        f"{resumes}. Every row of [`{stem}-runs.json`]({stem}-runs.json) holds "
        f"its configs, flags, commit, curves and scores; [`{stem}-runs.md`]({stem}-runs.md) lists "
        f"them. Commits: {commits}."
    )
    return [
        f"# {data['title'].split(':')[0]}",
        "",
        summary,
        "",
        f"Two splits. **val**: validation bits per byte ({validation_set(study.rows[0])}); it "
        "chooses every learning rate. **test**: WikiText-2 bits per byte (its 60 validation "
        "articles, out of domain); no choice reads it. Both are tokenizer-free. Gaps are paired by "
        "training seed, which sets the initialisation and the data order; a gap is the second "
        "variant's bits/byte minus the first's.",
        "",
    ]


def _sizes(study: Study, claims: dict, fits: dict, out: Path) -> list[str]:
    """The gap across sizes at each size's own length, and at equal training tokens."""
    sizes, own = study.sizes, fits[OWN_LENGTH][0]
    lines = [
        "## The gap across model sizes, each at its own best rates",
        "",
        *gap_table(study, own),
        "",
        codebook_note(study, own),
        "",
        "A slope over every size (least squares on log10 parameters through each size's mean gap; "
        "the t interval holds the seed noise of every size, not the misfit to a line, which 3 "
        "sizes cannot measure):",
        "",
        *fit_lines(claims, OWN_LENGTH),
        "",
        *size_table(study),
        "",
    ]
    ratios = sorted({f"{study.per_param(s, n):.1f}" for s, n in own})
    plotted = {f", own length ({' / '.join(ratios)} tokens per parameter)": own}
    if EQUAL_TOKENS in fits:
        same, target = fits[EQUAL_TOKENS][0], study.tokens(sizes[-1], None) / 1e6
        per_param = ", ".join(f"{s.upper()} {study.per_param(s, n):.2f}" for s, n in same)
        lines += [
            f"## Equal training tokens ({target:.2f}M, size {sizes[-1].upper()}'s), across sizes",
            "",
            "Every size trained on the same tokens. This separates size from training tokens, not "
            "from tokens per parameter, which fall as size grows (per non-embedding parameter: "
            f"{per_param}); the size table above holds tokens per parameter fixed and lets tokens "
            "grow with size instead. A gap that itself moves with tokens per parameter (the length "
            "axis below) moves both designs' slopes with it: each design separates size from one "
            "of the two, neither from both.",
            "",
            *gap_table(study, same),
            "",
            codebook_note(study, same),
            "",
            *fit_lines(claims, EQUAL_TOKENS),
            "",
            "The two designs' slopes per 10x parameters:",
            "",
            *design_lines(claims),
            "",
        ]
        plotted[f", {target:.2f}M tokens at every size"] = same
    plot_gaps(study, plotted, "params", _figure(out, "gap"))
    return [*lines, f"![gap vs size]({out.name}-gap.png)", ""]


def _lengths(study: Study, claims: dict, fits: dict, out: Path) -> list[str]:
    """The gap across training lengths at each size that ran more than one."""
    lengths = {name: points for name, (points, x) in fits.items() if x == "tokens"}
    if not lengths:
        return []
    lines = [
        "## The gap across training lengths, at a fixed size",
        "",
        "Warm-up 10 % of the updates at every length.",
    ]
    for name, points in lengths.items():
        size = points[0][0]
        lines += [
            "",
            *gap_table(study, points),
            "",
            rates_note(study, size),
            codebook_note(study, points),
            "",
            *fit_lines(claims, name),
            "",
            *moved_lines(study, size),
        ]
    drawn = any(parse(r)["steps"] and parse(r)["code"] for r in study.rows)
    note = (
        ""
        if drawn
        else "gf2: one GF(2) matrix per seed at each size's own length only; at every longer "
        "length the config's matrix at every seed"
    )
    plotted = {f", size {points[0][0].upper()}": points for points in lengths.values()}
    plot_gaps(study, plotted, "tokens", _figure(out, "length"), note=note)
    return [*lines, "", f"![gap vs training length]({out.name}-length.png)", ""]


def _controls(study: Study, claims: dict, out: Path) -> list[str]:
    """The controls at the tuning size, each difference led by its Holm p in the family."""
    if not any(study.cell(study.tune, c) for c in CONTROLS):
        return []
    plot_controls(study, _figure(out, "controls"))
    return [
        "## Controls and the parameter-matched baseline",
        "",
        "Paired by seed at the control's paper variant's rate. Each difference leads with its p "
        f"corrected over the {sum(p == p for _, p in claims.values())} tests of the family below "
        "(Holm; established below 0.05); its 95 % interval is not corrected. The position puts a "
        "control on the line from learned (0) to binary16 (1), per seed: a fixed-code control at "
        "0.75 closes a quarter of the gap; a learned-table control at 0.25 gives up a quarter of "
        "it.",
        "",
        *control_lines(study, claims),
        "",
        f"![controls]({out.name}-controls.png)",
        "",
    ]


def _commands(study: Study) -> list[str]:
    """How to rerun the study and redraw this page, and every run's command."""
    runs = [
        " ".join(
            [
                "fixed-embed fit",
                *(f"--config {c}" for c in row["config"].split(" + ")),
                *row["extra"],
            ]
        )
        for row in study.rows
    ]
    return [
        "## Commands",
        "",
        "```bash",
        "make study                                # every stage; resumes",
        "python experiments/study.py --render      # redraw this page from the runs file",
        "# each run (plus --trainer.logger.init_args.save_dir=logs/study-v3 "
        "--trainer.logger.init_args.name=RUN --ckpt_path=last), then fixed-embed eval "
        "RUN/checkpoints/last.ckpt --suite study:",
        *runs,
        "```",
        "",
    ]
