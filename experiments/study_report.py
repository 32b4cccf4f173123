"""The study's report (see study.py): tables and figures drawn from its runs file alone.

Every number comes from ``OUT-runs.json``: a row per run with its validation bits per byte, its lm-eval
scores, its wall time and its logged curves. Nothing is read from ``logs/``, so the report can be redrawn
on any machine from the committed file (``--render``). The runs are indexed by study_results.py, the
tables drawn by study_tables.py and the figures by study_figures.py; this file puts them in order.
"""

from __future__ import annotations

from pathlib import Path

from experiments.study_figures import plot_controls, plot_curves, plot_gaps, plot_sweep
from experiments.study_plan import CONTROLS, PAPER
from experiments.study_results import Study, parse, validation_set
from experiments.study_tables import (
    codebook_lines,
    control_lines,
    fit_lines,
    gap_table,
    size_table,
    sweep_lines,
    test_lines,
    tests,
)
from fixed_embed.atomic import atomic_write_text


def render(data: dict, out: Path, tune: str = "m") -> None:
    """``OUT.md`` and its figures from the runs file's contents."""
    study = Study(data["runs"], tune)
    stem = out.name
    if not study.rows:
        raise SystemExit(f"{stem}: the runs file has no runs yet")
    out.parent.mkdir(parents=True, exist_ok=True)
    tok = "bpe8k" if any(parse(r)["tok"] == "bpe8k" for r in study.rows) else parse(study.rows[0])["tok"]
    sizes = study.sizes(tok)
    own = [(size, None) for size in sizes]
    hours = sum(r["wall_seconds"] for r in study.rows if not r.get("adopted_from")) / 3600
    adopted = sorted({r["adopted_from"] for r in study.rows if r.get("adopted_from")})
    n_adopted = sum(bool(r.get("adopted_from")) for r in study.rows)
    resumed = sum(bool(r.get("resumed")) for r in study.rows)
    commits = sorted({r["commit"][:10] for r in study.rows})
    lines = [f"# {data['title'].split(':')[0]}", "",
             f"{len(study.rows)} runs"
             + (f", {n_adopted} of them adopted from {', '.join(f'`{a}`' for a in adopted)} (the same flags: "
                "copied, not rerun)" if n_adopted else "")
             + f"; {hours:.1f} h of training and evaluation summed over the runs trained here"
             + (f" ({resumed} resumed after a stop count their last attempt only)" if resumed else "")
             + f". Every row of [`{stem}-runs.json`]({stem}-runs.json) holds its configs, flags, commit, curves "
             f"and scores; [`{stem}-runs.md`]({stem}-runs.md) lists them. Commits: "
             + ", ".join(f"`{c}`" for c in commits) + ".", "",
             f"Two splits. **val**: validation bits per byte ({validation_set(study.rows[0])}); it chooses every "
             "learning rate. **test**: WikiText-2 bits per byte (its 60 validation articles, out of domain); no "
             "choice reads it. Both are tokenizer-free. Gaps are paired by training seed, which sets the "
             "initialisation and the data order; a gap is the second variant's bits/byte minus the first's.",
             ""]  # fmt: skip
    lines += sweep_lines(study, tok, sizes)
    if any(len(study.swept(tok, s, v)) > 1 for s in sizes for v in PAPER):
        lines += [f"![learning-rate sweep]({stem}-sweep.png)", ""]
        plot_sweep(study, tok, [s for s in sizes if any(len(study.swept(tok, s, v)) > 1 for v in PAPER)],
                   out.parent / f"{stem}-sweep.png")  # fmt: skip
    lines += ["## The gap across model sizes, each at its own best rates", "",
              *gap_table(study, tok, own, "size"), "", "A slope over every size (least squares on log10 "
              "parameters through each size's mean gap; the t interval holds the seed noise of every size, not "
              "the misfit to a line, which 3 sizes cannot measure):", "",
              *fit_lines(study, tok, own, "params"), "", *size_table(study, tok, sizes), ""]  # fmt: skip
    equal = [(s, n) for s in sizes for n in study.lengths(tok, s)]
    largest = sizes[-1] if sizes else None
    target = study.tokens(tok, largest, None) if largest and (tok, largest, "learned", None) in study.index else 0
    same = [(s, n) for s, n in equal if study.tokens(tok, s, n) == target]
    series = {"": own}
    if len(same) > 1:
        lines += [f"## Equal training tokens ({target / 1e6:.2f}M, size {largest.upper()}'s), across sizes", "",
                  "Size apart from training length: every size trained on the same tokens (so the smaller sizes "
                  "see more tokens per parameter).", "", *gap_table(study, tok, same, "size"), "",
                  *fit_lines(study, tok, same, "params"), ""]  # fmt: skip
        series[f", {target / 1e6:.2f}M tokens"] = same
    lines += [f"![gap vs size]({stem}-gap.png)", ""]
    plot_gaps(study, tok, series, "params", out.parent / f"{stem}-gap.png")
    long = {s: [(s, n) for n in study.lengths(tok, s)] for s in sizes if len(study.lengths(tok, s)) > 1}
    if long:
        lines += ["## The gap across training lengths, at a fixed size", "",
                  "The size's best rates (from its own-length sweep), its warm-up 10 % of the updates."]  # fmt: skip
        for points in long.values():
            lines += ["", *gap_table(study, tok, points, "size"), "", *fit_lines(study, tok, points, "tokens")]
        lines += ["", f"![gap vs training length]({stem}-length.png)", ""]
        plot_gaps(study, tok, {f", size {s.upper()}": p for s, p in long.items()}, "tokens",
                  out.parent / f"{stem}-length.png")  # fmt: skip
    lines += [f"![validation bits/byte]({stem}-val-bpb.png)", ""]
    plot_curves(study, tok, sizes, out.parent / f"{stem}-val-bpb.png")
    lines += codebook_lines(study, tok)
    if any(study.cell(tok, tune, c) for c in CONTROLS):
        lines += ["## Controls and the parameter-matched baseline", "",
                  "Paired by seed at the control's paper variant's rate. The position puts a control on the line "
                  "from learned (0) to binary16 (1), per seed: a fixed-code control at 0.75 closes a quarter of the "
                  "gap; a learned-table control at 0.25 gives up a quarter of it.", "",
                  *control_lines(study, tok, tune), "", f"![controls]({stem}-controls.png)", ""]  # fmt: skip
        plot_controls(study, tok, tune, out.parent / f"{stem}-controls.png")
    lines += [*test_lines(tests(study, tok, sizes)), ""]
    for t in sorted({parse(r)["tok"] for r in study.rows} - {tok}):
        own_t = [(s, None) for s in study.sizes(t)]
        lines += [f"## Tokenizer {t}", "", *size_table(study, t, study.sizes(t)), "",
                  *gap_table(study, t, own_t, "size"), ""]  # fmt: skip
    lines += ["## Commands", "", "```bash", "make study                                # every stage; resumes",
              "python experiments/study.py --render      # redraw this page from the runs file",
              "# each run (plus --trainer.logger.init_args.save_dir=logs/study-v3 --trainer.logger.init_args.name=RUN"
              " --ckpt_path=last), then fixed-embed eval RUN/checkpoints/last.ckpt --suite study:"]  # fmt: skip
    for row in study.rows:
        configs = " ".join(f"--config {c}" for c in row["config"].split(" + "))
        lines.append(f"fixed-embed fit {configs} {' '.join(row['extra'])}".rstrip())
    lines += ["```", ""]
    atomic_write_text(f"{out}.md", "\n".join(lines) + "\n")
