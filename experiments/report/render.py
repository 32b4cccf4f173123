"""The study's report (see study.py): tables and figures drawn from its runs file alone.

Every number comes from ``OUT-runs.json``: a row per run with its validation bits per byte, its
lm-eval scores, its wall time and its logged curves. Nothing is read from ``logs/``, so the
report can be redrawn on any machine from the committed file (``--render``). The runs are
indexed by results.py, the tables drawn by tables.py and the figures by
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
from experiments.report.findings import family
from experiments.report.findings import series as fit_series
from experiments.report.prose import bodies, write_pages
from experiments.report.results import Study, non_embedding, parse, validation_set
from experiments.report.tables import (
    codebook_lines,
    codebook_note,
    control_lines,
    design_lines,
    fit_lines,
    gap_table,
    moved_lines,
    rates_note,
    size_table,
    sweep_lines,
    test_lines,
)
from fixed_embed.atomic import atomic_write_text


def _per_param(study: Study, tok: str, size: str, steps: int | None) -> float:
    row = study.first(tok, size, steps)
    return row["tokens_seen"] / non_embedding(row)


def render(data: dict, out: Path, tune: str = "m", adoption: Path | None = None) -> None:
    """``OUT.md`` and its figures from the runs file's contents (and the adoption check's
    record, if given)."""
    study = Study(data["runs"], tune)
    stem = out.name
    if not study.rows:
        raise SystemExit(f"{stem}: the runs file has no runs yet")
    out.parent.mkdir(parents=True, exist_ok=True)
    tok = (
        "bpe8k"
        if any(parse(r)["tok"] == "bpe8k" for r in study.rows)
        else parse(study.rows[0])["tok"]
    )
    sizes = study.sizes(tok)
    own = [(size, None) for size in sizes]
    claims = family(study, tok)  # the declared family: every word below is chosen from it
    names = list(
        fit_series(study, tok)
    )  # the fits' names in the family: size, equal tokens, length at each size
    here = [r for r in study.rows if not r.get("adopted_from")]
    hours = sum(r["wall_seconds"] for r in here) / 3600
    adopted = sorted({r["adopted_from"] for r in study.rows if r.get("adopted_from")})
    n_adopted = len(study.rows) - len(here)
    resumed = sum(bool(r.get("resumed")) for r in here)
    commits = sorted({r["commit"][:10] for r in study.rows})
    lines = [
        f"# {data['title'].split(':')[0]}",
        "",
        f"{len(study.rows)} runs"
        + (
            f", {n_adopted} of them adopted from {', '.join(f'`{a}`' for a in adopted)} (the same "
            "flags: "
            "copied, not rerun)"
            if n_adopted
            else ""
        )
        + f"; {hours:.1f} h of training and evaluation summed over the {len(here)} runs trained "
        "here"
        + (
            f" ({resumed} of them resumed after a stop count their last attempt only)"
            if resumed
            else ""
        )
        + f". Every row of [`{stem}-runs.json`]({stem}-runs.json) holds its configs, flags, "
        "commit, curves "
        f"and scores; [`{stem}-runs.md`]({stem}-runs.md) lists them. Commits: "
        + ", ".join(f"`{c}`" for c in commits)
        + ".",
        "",
        f"Two splits. **val**: validation bits per byte ({validation_set(study.rows[0])}); it "
        "chooses every "
        "learning rate. **test**: WikiText-2 bits per byte (its 60 validation articles, out of "
        "domain); no "
        "choice reads it. Both are tokenizer-free. Gaps are paired by training seed, which sets "
        "the "
        "initialisation and the data order; a gap is the second variant's bits/byte minus the "
        "first's.",
        "",
    ]
    if adoption is not None and adoption.is_file():
        lines += [*check_lines(json.loads(adoption.read_text()), adoption.name), ""]
    lines += sweep_lines(study, tok, sizes)
    sweeps = [(s, n) for s in sizes for n in study.sweeps(tok, s)]
    if sweeps:
        lines += [f"![learning-rate sweep]({stem}-sweep.png)", ""]
        plot_sweep(study, tok, sweeps, out.parent / f"{stem}-sweep.png")
    lines += [
        "## The gap across model sizes, each at its own best rates",
        "",
        *gap_table(study, tok, own, "size"),
        "",
        codebook_note(study, tok, own),
        "",
        "A slope over every size (least squares on log10 parameters through each size's mean gap; "
        "the t "
        "interval holds the seed noise of every size, not the misfit to a line, which 3 sizes "
        "cannot "
        "measure):",
        "",
        *fit_lines(study, tok, own, "params", names[0], claims),
        "",
        *size_table(study, tok, sizes),
        "",
    ]
    equal = [(s, n) for s in sizes for n in study.lengths(tok, s)]
    largest = sizes[-1] if sizes else None
    target = (
        study.tokens(tok, largest, None)
        if largest and (tok, largest, "learned", None) in study.index
        else 0
    )
    same = [(s, n) for s, n in equal if study.tokens(tok, s, n) == target]
    ratios = sorted({f"{_per_param(study, tok, s, n):.1f}" for s, n in own})
    series = {f", own length ({' / '.join(ratios)} tokens per parameter)": own}
    if len(same) > 1:
        per_param = ", ".join(f"{s.upper()} {_per_param(study, tok, s, n):.2f}" for s, n in same)
        lines += [
            f"## Equal training tokens ({target / 1e6:.2f}M, size {largest.upper()}'s), across "
            "sizes",
            "",
            "Every size trained on the same tokens. This separates size from training tokens, not "
            "from "
            "tokens per parameter, which fall as size grows (per non-embedding parameter: "
            f"{per_param}); the "
            "size table above holds tokens per parameter fixed and lets tokens grow with size "
            "instead. A gap "
            "that itself moves with tokens per parameter (the length axis below) moves both "
            "designs' slopes "
            "with it: each design separates size from one of the two, neither from both.",
            "",
            *gap_table(study, tok, same, "size"),
            "",
            codebook_note(study, tok, same),
            "",
            *fit_lines(study, tok, same, "params", names[1], claims),
            "",
            "The two designs' slopes per 10x parameters:",
            "",
            *design_lines(study, tok, own, same, claims, names[:2]),
            "",
        ]
        series[f", {target / 1e6:.2f}M tokens at every size"] = same
    lines += [f"![gap vs size]({stem}-gap.png)", ""]
    plot_gaps(study, tok, series, "params", out.parent / f"{stem}-gap.png")
    long = {
        s: [(s, n) for n in study.lengths(tok, s)] for s in sizes if len(study.lengths(tok, s)) > 1
    }
    if long:
        lines += [
            "## The gap across training lengths, at a fixed size",
            "",
            "Warm-up 10 % of the updates at every length.",
        ]
        for size, points in long.items():
            lines += [
                "",
                *gap_table(study, tok, points, "size"),
                "",
                rates_note(study, tok, size),
                codebook_note(study, tok, points),
                "",
                *fit_lines(study, tok, points, "tokens", f"length, at {size.upper()}", claims),
                "",
                *moved_lines(study, tok, size),
            ]
        lines += ["", f"![gap vs training length]({stem}-length.png)", ""]
        drawn = any(parse(r)["steps"] and parse(r)["code"] for r in study.rows)
        note = (
            ""
            if drawn
            else (
                "gf2: one GF(2) matrix per seed at each size's own length only; at every longer "
                "length the config's matrix at every seed"
            )
        )
        plot_gaps(
            study,
            tok,
            {f", size {s.upper()}": p for s, p in long.items()},
            "tokens",
            out.parent / f"{stem}-length.png",
            note=note,
        )
    lines += [f"![validation bits/byte]({stem}-val-bpb.png)", ""]
    plot_curves(study, tok, sizes, out.parent / f"{stem}-val-bpb.png")
    lines += codebook_lines(study, tok)
    corrected = {label: p for label, (_, p) in claims.items()}
    if any(study.cell(tok, tune, c) for c in CONTROLS):
        lines += [
            "## Controls and the parameter-matched baseline",
            "",
            "Paired by seed at the control's paper variant's rate. Each difference leads with its "
            "p corrected "
            f"over the {sum(p == p for p in corrected.values())} tests of the family below (Holm; "
            "established "
            "below 0.05); its 95 % interval is not corrected. The position puts a control on the "
            "line from "
            "learned (0) to binary16 (1), per seed: a fixed-code control at 0.75 closes a quarter "
            "of the gap; a "
            "learned-table control at 0.25 gives up a quarter of it.",
            "",
            *control_lines(study, tok, tune, corrected),
            "",
            f"![controls]({stem}-controls.png)",
            "",
        ]
        plot_controls(study, tok, tune, out.parent / f"{stem}-controls.png")
    lines += [*test_lines(claims), ""]
    for t in sorted({parse(r)["tok"] for r in study.rows} - {tok}):
        own_t = [(s, None) for s in study.sizes(t)]
        lines += [
            f"## Tokenizer {t}",
            "",
            *size_table(study, t, study.sizes(t)),
            "",
            *gap_table(study, t, own_t, "size"),
            "",
        ]
    lines += [
        "## Commands",
        "",
        "```bash",
        "make study                                # every stage; resumes",
        "python experiments/study.py --render      # redraw this page from the runs file",
        "# each run (plus --trainer.logger.init_args.save_dir=logs/study-v3 "
        "--trainer.logger.init_args.name=RUN"
        " --ckpt_path=last), then fixed-embed eval RUN/checkpoints/last.ckpt --suite study:",
    ]
    for row in study.rows:
        configs = " ".join(f"--config {c}" for c in row["config"].split(" + "))
        lines.append(f"fixed-embed fit {configs} {' '.join(row['extra'])}".rstrip())
    lines += ["```", ""]
    atomic_write_text(f"{out}.md", "\n".join(lines) + "\n")
    root = out.resolve().parent.parent.parent
    if (
        out.resolve().parent == root / "docs" / "results"
    ):  # the committed report: its pages' findings too
        write_pages(bodies(study, tok), stem, root)
