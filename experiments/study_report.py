"""The study's summary (see study.py): paper-format tables and plots, drawn from its runs file alone.

Every number comes from ``study-runs.json``: a row per run with its final validation loss, its
lm-eval scores, its throughput and its logged curves. Nothing is read from ``logs/``, so the
summary can be redrawn on any machine from the committed file (``study.py --render``).
"""

from __future__ import annotations

import math
import re
import statistics
from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from runs import ROOT, merged_config

NAME = re.compile(r"^(?P<part>[^/]+)/(?P<variant>learned|binary16|gf2)(?:-code(?P<code>\d+))?-seed(?P<seed>\d+)$")
VARIANTS = ("learned", "binary16", "gf2")
COLORS = {"learned": "tab:blue", "binary16": "tab:orange", "gf2": "tab:green"}
PAPER_CODE_SEED = 12345
PART_TITLES = {
    "bpe8k": "8,192-token BPE trained on the corpus (K = 13 bits)",
    "smollm2": "SmolLM2 tokenizer, 49,152 tokens (K = 16 bits, the paper's code)",
}
SCORES = [  # (column key, title, scale, decimals)
    ("gutenberg_word_order|acc|0", "books word order acc (%)", 100.0, 1),
    ("gutenberg_ppl|bits_per_byte|0", "books bits/byte", 1.0, 3),
    ("wikitext2_local|word_perplexity|0", "WikiText-2 valid word ppl", 1.0, 0),
]


def parse(row: dict) -> dict:
    """The row's part, variant, GF(2) code seed (None: not GF(2)) and training seed, from its name."""
    match = NAME.match(row["name"])
    if match is None:
        raise ValueError(f"study run name {row['name']!r} is not PART/VARIANT[-codeC]-seedS")
    variant = match["variant"]
    code = int(match["code"]) if match["code"] else (PAPER_CODE_SEED if variant == "gf2" else None)
    return {"part": match["part"], "variant": variant, "code": code, "seed": int(match["seed"])}


def mean_sd(values: Sequence[float], scale: float = 1.0, decimals: int = 3) -> str:
    if not values:
        return "--"
    mean = statistics.mean(values) * scale
    if len(values) == 1:
        return f"{mean:.{decimals}f} (1 run)"
    return f"{mean:.{decimals}f} ± {statistics.stdev(values) * scale:.{decimals}f}"


def training_tokens_per_sec(row: dict) -> float:
    """Median of the ThroughputMonitor's windows: training steps only (no start-up, validation, eval)."""
    values = [v for _, v in row["curves"].get("perf/tokens_per_sec", [])]
    return statistics.median(values) if values else float("nan")


def groups(rows: list[dict]) -> dict[tuple[str, str], list[dict]]:
    """Runs of the paper's three variants (GF(2) with the paper's code seed) by (part, variant)."""
    out: dict[tuple[str, str], list[dict]] = {}
    for row in rows:
        meta = parse(row)
        if meta["variant"] != "gf2" or meta["code"] == PAPER_CODE_SEED:
            out.setdefault((meta["part"], meta["variant"]), []).append(row)
    return out


def parameter_split(row: dict) -> tuple[int, int, int]:
    """(trainable interface, blocks + final norm, head) of the row's model, built from its configs."""
    from fixed_embed.accounting import parameter_report
    from fixed_embed.cli.params import build_model

    model = merged_config([ROOT / config for config in row["config"].split(" + ")])["model"]
    report = parameter_report(build_model(model).decoder)
    return report.interface_trainable, report.backbone, report.head


def ranking(by_variant: dict[str, dict[int, float]]) -> list[str]:
    """Plain statements: each fixed code against the learned table, and gf2 against binary16.

    ``by_variant`` maps a variant to its final loss per training seed. Besides the unpaired
    comparison, runs of the same training seed are paired: they saw the same batches in the same
    order, and binary16 and gf2 (no trainable interface) even start from the same weights.
    """
    lines = []
    for a, b in (("learned", "binary16"), ("learned", "gf2"), ("binary16", "gf2")):
        if len(by_variant.get(a, {})) < 2 or len(by_variant.get(b, {})) < 2:
            continue
        xa, xb = list(by_variant[a].values()), list(by_variant[b].values())
        diff = statistics.mean(xb) - statistics.mean(xa)
        se = math.sqrt(statistics.variance(xa) / len(xa) + statistics.variance(xb) / len(xb))
        apart = max(xa) < min(xb) or max(xb) < min(xa)
        verdict = "the seed ranges do not overlap" if apart else "the seed ranges overlap"
        line = (f"- {b} − {a}: {diff:+.3f} nats (standard error of the difference {se:.3f}, "
                f"{abs(diff) / se if se else float('inf'):.1f} of them); {verdict}.")  # fmt: skip
        seeds = sorted(set(by_variant[a]) & set(by_variant[b]))
        if len(seeds) >= 2:
            paired = [by_variant[b][s] - by_variant[a][s] for s in seeds]
            one_sign = all(d > 0 for d in paired) or all(d < 0 for d in paired)
            signs = "the same sign for every seed" if one_sign else "signs differ between seeds"
            line += (f" Paired by training seed: {', '.join(f'{d:+.3f}' for d in paired)} "
                     f"(mean {statistics.mean(paired):+.3f} ± {statistics.stdev(paired):.3f}; {signs}).")  # fmt: skip
        lines.append(line)
    return lines


def part_table(part: str, rows_by_variant: dict[str, list[dict]]) -> list[str]:
    header = ["variant", "runs", "trainable interface / blocks / head", "val loss", "val ppl",
              *[title for _, title, _, _ in SCORES], "train tok/s", "wall / run (min)"]  # fmt: skip
    lines = ["| " + " | ".join(header) + " |", "|---|" + "---:|" * (len(header) - 1)]
    for variant in VARIANTS:
        runs = rows_by_variant.get(variant, [])
        if not runs:
            continue
        interface, blocks, head = parameter_split(runs[0])
        losses = [r["val_loss"] for r in runs]
        cells = [variant, str(len(runs)), f"{interface:,} / {blocks:,} / {head:,}", mean_sd(losses),
                 mean_sd([math.exp(x) for x in losses], decimals=1)]  # fmt: skip
        for key, _, scale, decimals in SCORES:
            values = [r["scores"][key]["value"] for r in runs if key in r.get("scores", {})]
            cells.append(mean_sd(values, scale, decimals))
        cells.append(f"{statistics.mean(training_tokens_per_sec(r) for r in runs):,.0f}")
        cells.append(f"{statistics.mean(r['wall_seconds'] for r in runs) / 60:.1f}")
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def recoding_table(rows: list[dict], part: str) -> list[str]:
    """GF(2) code seeds at one training seed, beside binary16 and the training-seed spread."""
    metas = [(parse(r), r) for r in rows]
    recoded = [(m["code"], m["seed"], r) for m, r in metas if m["part"] == part and m["variant"] == "gf2"]
    first_seed = min((seed for _, seed, _ in recoded), default=None)
    paper_first = lambda item: (item[0] != PAPER_CODE_SEED, item[0])  # noqa: E731
    at_seed = sorted(((code, r) for code, seed, r in recoded if seed == first_seed), key=paper_first)
    if len(at_seed) < 2:
        return []
    lines = [f"| GF(2) code seed (training seed {first_seed}) | val loss | books word order acc (%) |",
             "|---|---:|---:|"]  # fmt: skip
    for code, r in at_seed:
        acc = r.get("scores", {}).get(SCORES[0][0], {}).get("value")
        lines.append(f"| {code}{' (paper)' if code == PAPER_CODE_SEED else ''} | {r['val_loss']:.3f} | "
                     f"{'--' if acc is None else f'{acc * 100:.1f}'} |")  # fmt: skip
    codes = [r["val_loss"] for _, r in at_seed]
    lines += ["", f"Spread over {len(codes)} code seeds: sd {statistics.stdev(codes):.3f} "
              f"(range {min(codes):.3f}–{max(codes):.3f})."]  # fmt: skip
    return lines


def plot_curves(rows: list[dict], tag: str, ylabel: str, path: Path, parts: list[str], log: bool = False) -> None:
    figure, axes = plt.subplots(1, len(parts), figsize=(6.5 * len(parts), 4.2), squeeze=False)
    for axis, part in zip(axes[0], parts, strict=True):
        labelled = set()
        for row in rows:
            meta = parse(row)
            points = row["curves"].get(tag, [])
            if meta["part"] != part or not points:
                continue
            steps, values = zip(*points, strict=True)
            recoded = meta["variant"] == "gf2" and meta["code"] != PAPER_CODE_SEED
            label = f"{meta['variant']} (other GF(2) codes)" if recoded else meta["variant"]
            axis.plot(steps, values, color=COLORS[meta["variant"]], alpha=0.85, linewidth=1.2,
                      linestyle=":" if recoded else "-", marker="o" if tag == "val/loss" else None,
                      markersize=3, label=None if label in labelled else label)  # fmt: skip
            labelled.add(label)
        axis.set_title(part + ": " + PART_TITLES.get(part, ""), fontsize=9)
        axis.set_xlabel("optimizer update")
        if log:  # input norms: learned tables sit ~25x below the codes
            axis.set_yscale("log")
        axis.set_ylabel(ylabel)
        axis.grid(alpha=0.3)
        axis.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def render(data: dict, out: Path) -> None:
    """``OUT.md`` and ``OUT-{loss,val-loss,input-norm}.png`` from the runs file's contents."""
    rows = data["runs"]
    grouped = groups(rows)
    parts = [p for p in PART_TITLES if any(parse(r)["part"] == p for r in rows)]
    stem = out.name
    lines = [f"# {data['title'].split(',')[0]}", "",
             "Produced by `make study` (`python experiments/study.py`); each run is a row of "
             f"[`{stem}-runs.json`]({stem}-runs.json) with its flags, commit, curves and scores, and "
             f"[`{stem}-runs.md`]({stem}-runs.md) lists them. Commits: "
             + ", ".join(f"`{c[:10]}`" for c in sorted({r["commit"] for r in rows})) + ".", ""]  # fmt: skip
    for part in parts:
        by_variant = {v: grouped.get((part, v), []) for v in VARIANTS}
        lines += [f"## {part}: {PART_TITLES[part]}", "",
                  "Mean ± sample sd over training seeds "
                  + ", ".join(sorted({str(parse(r)['seed']) for rs in by_variant.values() for r in rs}))
                  + "; gf2 with the paper's code seed 12345. Accuracy and perplexities are lm-eval on "
                  "the final checkpoint.", ""]  # fmt: skip
        lines += [*part_table(part, by_variant), ""]
        statements = ranking({v: {parse(r)["seed"]: r["val_loss"] for r in rs} for v, rs in by_variant.items()})
        if statements:
            lines += ["Validation loss, pairwise:", "", *statements, ""]
        recodings = recoding_table(rows, part)
        if recodings:
            lines += [*recodings, ""]
    lines += [
        "## Commands",
        "",
        "```bash",
        "make study                              # = python experiments/study.py: the runs below, then this file",
        "python experiments/study.py --render    # redraw this file and the plots from study-runs.json",
        "# each run (plus --trainer.logger.init_args.save_dir=logs/study --trainer.logger.init_args.name=RUN):",
    ]
    for row in rows:
        configs = " ".join(f"--config {c}" for c in row["config"].split(" + "))
        lines.append(f"fixed-embed fit {configs} {' '.join(row['extra'])}".rstrip())
    lines += [
        "# then, on each run's final checkpoint:",
        "fixed-embed eval RUN/checkpoints/last.ckpt --suite study --device cpu --batch-size 32",
        "```",
        "",
    ]
    plots = [("val/loss", "validation loss (nats/token)", "val-loss"),
             ("train/loss", "training loss (nats/token)", "loss"),
             ("input/norm_mean", "mean input-vector norm over a batch (log scale)", "input-norm")]  # fmt: skip
    for tag, ylabel, suffix in plots:
        plot_curves(rows, tag, ylabel, out.parent / f"{stem}-{suffix}.png", parts, log=tag.startswith("input/"))
        lines.append(f"![{ylabel}]({stem}-{suffix}.png)")
    out.parent.mkdir(parents=True, exist_ok=True)
    Path(f"{out}.md").write_text("\n".join(lines) + "\n")
