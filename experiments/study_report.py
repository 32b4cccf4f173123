"""The study's report (see study.py): tables and figures drawn from its runs file alone.

Every number comes from ``study-v2-runs.json``: a row per run with its final validation loss and
bits per byte, its lm-eval scores, its wall time and its logged curves. Nothing is read from
``logs/``, so the report can be redrawn on any machine from the committed file (``--render``).
Differences between variants are paired by training seed (the same seed: the same data order and,
for the two fixed codes, the same initial weights); "mean ± sd" is the sample sd over seeds.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from experiments.runs import ROOT, merged_config
from experiments.study_plan import CONTROLS, METRIC, PAPER, SIZES, non_embedding_params, parse_name, widened

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
COLORS = {"learned": "tab:blue", "binary16": "tab:orange", "gf2": "tab:green", "matched": "tab:red",
          "norm_matched": "tab:purple", "random_full": "tab:brown", "lowrank_binary": "tab:pink",
          "lowrank_normal": "tab:gray"}  # fmt: skip
SCORES = [  # (column key, title, scale, decimals)
    ("gutenberg_ppl|bits_per_byte|0", "lm-eval books bits/byte", 1.0, 3),
    ("gutenberg_word_order|acc|0", "books word order acc (%)", 100.0, 1),
    ("wikitext2_local|word_perplexity|0", "WikiText-2 word ppl", 1.0, 0),
]


def parse(row: dict) -> dict:
    """The tokenizer, size, variant, rate and seed in the row's name (:func:`study_plan.parse_name`)."""
    return parse_name(row["name"])


def mean_sd(values: Sequence[float], scale: float = 1.0, decimals: int = 3, sign: bool = False) -> str:
    if not values:
        return "--"
    fmt = f"{'+' if sign else ''}.{decimals}f"
    mean = statistics.mean(values) * scale
    if len(values) == 1:
        return f"{mean:{fmt}} (1 run)"
    return f"{mean:{fmt}} ± {statistics.stdev(values) * scale:.{decimals}f}"


def non_embedding(row: dict) -> int:
    decoder = merged_config([ROOT / c for c in row["config"].split(" + ")])["model"]["decoder"]
    return non_embedding_params(widened(decoder, row["extra"]))


def _finite(value: float | None) -> float:
    """A diverged run (NaN, inf or nothing logged) ranks last."""
    return value if value is not None and math.isfinite(value) else math.inf


class Study:
    """The runs, indexed by (tokenizer, size, variant) -> {lr: {seed: row}}."""

    def __init__(self, rows: list[dict], tune: str = "m") -> None:
        self.rows, self.tune = rows, tune
        self.index: dict[tuple[str, str, str], dict[float, dict[int, dict]]] = {}
        for row in rows:
            m = parse(row)
            self.index.setdefault((m["tok"], m["size"], m["variant"]), {}).setdefault(m["lr"], {})[m["seed"]] = row

    def sizes(self, tok: str) -> list[str]:
        found = {size for t, size, _ in self.index if t == tok}
        return [s for s in SIZES if s in found]

    def swept_best(self, tok: str, size: str, variant: str) -> float | None:
        """The rate with the lowest seed-1 validation bits/byte at ``size``; None without a seed-1 run."""
        scored = {lr: _finite(seeds[1].get(METRIC)) for lr, seeds in self.index.get((tok, size, variant), {}).items()
                  if 1 in seeds}  # fmt: skip
        return min(scored, key=scored.get) if scored else None

    def main_lr(self, tok: str, size: str, variant: str) -> float | None:
        """The comparison's rate: the variant's best in the sweep at the tuning size, as the study chose it,
        where it ran at ``size``; otherwise (a run outside the plan) the rate with the most seeds."""
        by_lr = self.index.get((tok, size, variant), {})
        best = self.swept_best(tok, self.tune, variant)
        if best in by_lr:
            return best
        return max(by_lr, key=lambda lr: (len(by_lr[lr]), -lr)) if by_lr else None

    def runs(self, tok: str, size: str, variant: str) -> dict[int, dict]:
        lr = self.main_lr(tok, size, variant)
        return self.index[(tok, size, variant)][lr] if lr is not None else {}

    def paired(self, tok: str, size: str, a: str, b: str, key: str = "val_bpb") -> list[float]:
        """b - a per training seed both ran."""
        ra, rb = self.runs(tok, size, a), self.runs(tok, size, b)
        return [rb[s][key] - ra[s][key] for s in sorted(set(ra) & set(rb))]


def sweep_lines(study: Study, tok: str, size: str) -> list[str]:
    lrs = sorted({lr for v in PAPER for lr in study.index.get((tok, size, v), {})})
    if len(lrs) < 2:
        return []
    lines = [f"### Learning-rate sweep (size {size.upper()}, seed 1): validation bits/byte", "",
             "| variant | " + " | ".join(f"lr {lr:g}" for lr in lrs) + " | best |",
             "|---|" + "---:|" * (len(lrs) + 1)]  # fmt: skip
    for v in PAPER:
        by_lr = study.index.get((tok, size, v), {})
        scored = {lr: by_lr[lr][1]["val_bpb"] for lr in lrs if 1 in by_lr.get(lr, {})}
        best = study.swept_best(tok, size, v)
        cells = [
            f"**{scored[lr]:.4f}**" if lr == best else (f"{scored[lr]:.4f}" if lr in scored else "--") for lr in lrs
        ]
        lines.append(f"| {v} | " + " | ".join(cells) + f" | {'--' if best is None else f'{best:g}'} |")
    lines += ["", "Ranking at each rate (best first): " + "; ".join(
        f"lr {lr:g}: " + " < ".join(sorted((v for v in PAPER if 1 in study.index.get((tok, size, v), {}).get(lr, {})),
                                           key=lambda v, lr=lr: study.index[(tok, size, v)][lr][1]["val_bpb"]))
        for lr in lrs) + ".", ""]  # fmt: skip
    return lines


def size_table(study: Study, tok: str, variants: Sequence[str], sizes: Sequence[str]) -> list[str]:
    header = ["size", "variant", "lr", "seeds", "non-emb. params", "trainable params", "targets", "val bits/byte",
              "val loss (nats/token)", *[t for _, t, _, _ in SCORES], "wall / run (min)"]  # fmt: skip
    lines = ["| " + " | ".join(header) + " |", "|---|---|" + "---:|" * (len(header) - 2)]
    for size in sizes:
        for v in variants:
            runs = list(study.runs(tok, size, v).values())
            if not runs:
                continue
            first = runs[0]
            cells = [size.upper(), v, f"{study.main_lr(tok, size, v):g}", str(len(runs)),
                     f"{non_embedding(first):,}", f"{first['trainable_params']:,}",
                     f"{first['tokens_seen'] / 1e6:.2f}M", mean_sd([r["val_bpb"] for r in runs], decimals=4),
                     mean_sd([r["val_loss"] for r in runs])]  # fmt: skip
            for key, _, scale, decimals in SCORES:
                cells.append(mean_sd([r["scores"][key]["value"] for r in runs if key in r.get("scores", {})], scale,
                                     decimals))  # fmt: skip
            whole = [r["wall_seconds"] for r in runs if not r.get("resumed")]  # a resumed run's wall is partial
            cells.append(f"{statistics.mean(whole) / 60:.1f}" if whole else "--")
            lines.append("| " + " | ".join(cells) + " |")
    return lines


def gap_lines(study: Study, tok: str, sizes: Sequence[str]) -> list[str]:
    pairs = (("learned", "binary16"), ("learned", "gf2"), ("binary16", "gf2"))
    lines = ["| size | non-emb. params | " + " | ".join(f"{b} − {a}" for a, b in pairs) + " |",
             "|---|---:|" + "---:|" * len(pairs)]  # fmt: skip
    for size in sizes:
        runs = study.runs(tok, size, "learned")
        if not runs:
            continue
        cells = [mean_sd(study.paired(tok, size, a, b), decimals=4, sign=True) for a, b in pairs]
        lines.append(f"| {size.upper()} | {non_embedding(next(iter(runs.values()))):,} | " + " | ".join(cells) + " |")
    return lines


def control_lines(study: Study, tok: str, size: str) -> list[str]:
    lines = [f"| variant (size {size.upper()}) | seeds | trainable params | val bits/byte | − learned (paired) | "
             "− binary16 (paired) |", "|---|---:|---:|---:|---:|---:|"]  # fmt: skip
    for v in (*PAPER, *CONTROLS):
        runs = study.runs(tok, size, v)
        if not runs:
            continue
        first = next(iter(runs.values()))
        gaps = [mean_sd(study.paired(tok, size, ref, v), decimals=4, sign=True) if v != ref else ""
                for ref in ("learned", "binary16")]  # fmt: skip
        bpb = mean_sd([r["val_bpb"] for r in runs.values()], decimals=4)
        params = f"{first['trainable_params']:,}"
        lines.append(f"| {v}: {LABELS[v]} | {len(runs)} | {params} | {bpb} | {gaps[0]} | {gaps[1]} |")
    return lines


def plot_gap(study: Study, tok: str, path: Path) -> None:
    figure, axis = plt.subplots(figsize=(6.2, 4.2))
    sizes = study.sizes(tok)
    for b, marker in (("binary16", "o"), ("gf2", "s")):
        xs, means, sds, counts = [], [], [], []
        for size in sizes:
            gaps = study.paired(tok, size, "learned", b)
            if gaps:
                xs.append(non_embedding(next(iter(study.runs(tok, size, "learned").values()))))
                means.append(statistics.mean(gaps))
                sds.append(statistics.stdev(gaps) if len(gaps) > 1 else 0.0)
                counts.append(len(gaps))
        axis.errorbar(xs, means, yerr=sds, marker=marker, capsize=4, color=COLORS[b], label=f"{b} − learned")
        for x, y, n in zip(xs, means, counts, strict=True):  # an sd of one seed is no sd: say how many
            axis.annotate(f"n={n}", (x, y), textcoords="offset points", xytext=(9, 5 if b == "binary16" else -12),
                          fontsize=7, color=COLORS[b])  # fmt: skip
    axis.axhline(0, color="black", linewidth=0.8)
    axis.set_xscale("log")
    axis.set_xlabel("non-embedding parameters")
    axis.set_ylabel("validation bits/byte gap (mean ± sd over seeds)")
    axis.set_title("Fixed codes minus the learned table, by model size", fontsize=10)
    axis.grid(alpha=0.3)
    axis.legend(fontsize=8, loc="best")
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def plot_curves(study: Study, tok: str, path: Path) -> None:
    """Validation bits/byte against training tokens: mean line and ± sd band over seeds, a panel per size."""
    sizes = study.sizes(tok)
    figure, axes = plt.subplots(1, len(sizes), figsize=(5.2 * len(sizes), 3.9), squeeze=False)
    for axis, size in zip(axes[0], sizes, strict=True):
        for v in PAPER:
            runs = list(study.runs(tok, size, v).values())
            curves = [r["curves"].get("val/bits_per_byte", []) for r in runs]
            curves = [c for c in curves if c]
            if not curves:
                continue
            length = min(len(c) for c in curves)
            steps = [p[0] + 1 for p in curves[0][:length]]
            values = [[c[i][1] for c in curves] for i in range(length)]
            mean = [statistics.mean(v_) for v_ in values]
            sd = [statistics.stdev(v_) if len(v_) > 1 else 0.0 for v_ in values]
            axis.plot(steps, mean, color=COLORS[v], marker="o", markersize=3, label=f"{v} ({len(curves)} seeds)")
            axis.fill_between(steps, [m - s for m, s in zip(mean, sd, strict=True)],
                              [m + s for m, s in zip(mean, sd, strict=True)], color=COLORS[v], alpha=0.2)  # fmt: skip
        axis.set_title(f"size {size.upper()}", fontsize=10)
        axis.set_xlabel("optimizer update")
        axis.set_ylabel("validation bits/byte")
        axis.grid(alpha=0.3)
        axis.legend(fontsize=8, loc="upper right")
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def plot_controls(study: Study, tok: str, size: str, path: Path) -> None:
    variants = [v for v in (*PAPER, *CONTROLS) if study.runs(tok, size, v)]
    values = [[r["val_bpb"] for r in study.runs(tok, size, v).values()] for v in variants]
    figure, axis = plt.subplots(figsize=(8.5, 4.2))
    means = [statistics.mean(v) for v in values]
    sds = [statistics.stdev(v) if len(v) > 1 else 0.0 for v in values]
    # Points, not bars: the axis does not start at zero, and a bar's length would mislead.
    for i, (v, runs) in enumerate(zip(variants, values, strict=True)):
        axis.errorbar([i], [means[i]], yerr=[sds[i]], fmt="D", markersize=7, capsize=5, color=COLORS[v], zorder=2)
        axis.scatter([i + 0.12] * len(runs), runs, color="black", s=9, zorder=3)
    axis.set_xlim(-0.5, len(variants) - 0.5)
    axis.set_xticks(range(len(variants)), variants, rotation=25, ha="right", fontsize=8)
    axis.set_ylabel("validation bits/byte (◆ mean ± sd; dots: seeds)")
    axis.set_title(f"Controls at size {size.upper()}", fontsize=10)
    axis.grid(alpha=0.3, axis="y")
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def validation_set(row: dict) -> str:
    """What the study validated on, from the run's configs."""
    data = merged_config(row["config"].split(" + ")).get("data", {})
    blocks = f"{data.get('val_sequences')} blocks of {data.get('seq_len')} targets"
    if data.get("val_per_document"):
        return f"{blocks} spread over every held-out document, the same for every run"
    return f"{blocks}, the same for every run"


def render(data: dict, out: Path, tune: str = "m") -> None:
    """``OUT.md`` and its figures from the runs file's contents."""
    study = Study(data["runs"], tune)
    stem = out.name
    if not study.rows:
        raise SystemExit(f"{stem}: the runs file has no runs yet")
    out.parent.mkdir(parents=True, exist_ok=True)
    tok = "bpe8k" if any(parse(r)["tok"] == "bpe8k" for r in study.rows) else parse(study.rows[0])["tok"]
    sizes = study.sizes(tok)
    hours = sum(r["wall_seconds"] for r in study.rows) / 3600
    resumed = sum(bool(r.get("resumed")) for r in study.rows)
    commits = sorted({r["commit"][:10] for r in study.rows})
    lines = [f"# {data['title'].split(',')[0]}", "",
             f"{len(study.rows)} runs, {hours:.1f} h of training time summed over runs"
             + (f" ({resumed} resumed after a stop count their last attempt only)" if resumed else "")
             + f". Every row of [`{stem}-runs.json`]({stem}-runs.json) holds its configs, flags, "
             f"commit, curves and scores; [`{stem}-runs.md`]({stem}-runs.md) lists them. Commits: "
             + ", ".join(f"`{c}`" for c in commits) + ".", "",
             f"Headline metric: validation bits per byte ({validation_set(study.rows[0])}; tokenizer-free). Gaps are "
             "paired by training seed, which sets both the initialisation and the data order.", ""]  # fmt: skip
    lines += sweep_lines(study, tok, tune)
    if sizes:
        lines += ["## The gap across model sizes", "", *gap_lines(study, tok, sizes), "",
                  f"![gap vs size]({stem}-gap.png)", "", *size_table(study, tok, PAPER, sizes), "",
                  f"![validation bits/byte]({stem}-val-bpb.png)", ""]  # fmt: skip
        plot_gap(study, tok, out.parent / f"{stem}-gap.png")
        plot_curves(study, tok, out.parent / f"{stem}-val-bpb.png")
    if any(study.runs(tok, tune, c) for c in CONTROLS):
        lines += ["## Controls and the parameter-matched baseline", "", *control_lines(study, tok, tune), "",
                  f"![controls]({stem}-controls.png)", ""]  # fmt: skip
        plot_controls(study, tok, tune, out.parent / f"{stem}-controls.png")
    other = sorted({parse(r)["tok"] for r in study.rows} - {tok})
    for t in other:
        lines += [f"## Tokenizer {t}", "", *size_table(study, t, PAPER, study.sizes(t)), "",
                  *gap_lines(study, t, study.sizes(t)), ""]  # fmt: skip
    lines += ["## Commands", "", "```bash", "make study                                # every stage; resumes",
              "python experiments/study.py --render      # redraw this page from the runs file",
              "# each run (plus --trainer.logger.init_args.save_dir=logs/study-v2 --trainer.logger.init_args.name=RUN"
              " --ckpt_path=last), then fixed-embed eval RUN/checkpoints/last.ckpt --suite study:"]  # fmt: skip
    for row in study.rows:
        configs = " ".join(f"--config {c}" for c in row["config"].split(" + "))
        lines.append(f"fixed-embed fit {configs} {' '.join(row['extra'])}".rstrip())
    lines += ["```", ""]
    Path(f"{out}.md").write_text("\n".join(lines) + "\n")
