"""Run experiment configs one after another, each `fixed-embed fit` in its own process, and tabulate them.

Used by `make demo`, `make controls` and `make sweep-recodings`. A run's row (final validation loss
and perplexity, trainable parameters, wall time, tokens/s, its log folder and exact arguments) is
read back from its TensorBoard events. With ``--out``, rows go to ``OUT.json`` after every run
(completed runs are skipped when the command is repeated, so a long sweep resumes) and the table
to ``OUT.md`` with the git commit that produced it.
"""

from __future__ import annotations

import json
import math
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

ROOT = Path(__file__).resolve().parents[1]


def last_scalar(run_dir: Path, tag: str) -> float:
    events = EventAccumulator(str(run_dir))
    events.Reload()
    return events.Scalars(tag)[-1].value


def tokens_seen(run_dir: Path) -> int:
    """Prediction tokens the run trained on, from its last checkpoint."""
    import torch

    return torch.load(run_dir / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)["tokens_seen"]


def run(name: str, config: Path, logs: str, extra: list[str]) -> dict:
    """Fit ``config`` (plus ``extra`` flags) with its logs under ``logs/<name>``; return its row."""
    from fixed_embed.cli.params import build_model
    from fixed_embed.config import load_experiment

    logger = [f"--trainer.logger.init_args.save_dir={logs}", f"--trainer.logger.init_args.name={name}"]
    args = [sys.executable, "-m", "fixed_embed", "fit", "--config", str(config), *logger, *extra]
    start = time.perf_counter()
    subprocess.run(args, check=True, cwd=ROOT)
    seconds = time.perf_counter() - start
    run_dir = max((Path(logs) / name).glob("version_*"), key=lambda p: p.stat().st_mtime)
    model_config = load_experiment(config).get("model") or {}
    for flag in extra:  # interface options given on the command line change the model too
        if flag.startswith("--model.interface.init_args."):
            key, value = flag.removeprefix("--model.interface.init_args.").split("=", 1)
            model_config.setdefault("interface", {}).setdefault("init_args", {})[key] = json.loads(value)
    trainable = sum(p.numel() for p in build_model(model_config).parameters() if p.requires_grad)
    val_loss = last_scalar(run_dir, "val/loss")
    return {
        "name": name,
        "config": str(config.relative_to(ROOT)),
        "extra": extra,
        "trainable_params": trainable,
        "val_loss": val_loss,
        "val_ppl": math.exp(val_loss),
        "tokens_per_sec": tokens_seen(run_dir) / seconds,
        "wall_seconds": seconds,
        "logs": str(run_dir),
        "commit": _git_commit(),
    }


def tiny_variants(extra: list[str]) -> list[tuple[str, Path, list[str]]]:
    """The plan for the paper's three variants at tiny scale."""
    return [(f"tiny/{v}", ROOT / "experiments" / "tiny" / f"{v}.yaml", extra) for v in ("learned", "binary16", "gf2")]


def run_all(plan: list[tuple[str, Path, list[str]]], logs: str, title: str, out: str | None = None) -> list[dict]:
    done = {}
    if out and Path(f"{out}.json").is_file():
        done = {row["name"]: row for row in json.loads(Path(f"{out}.json").read_text())["runs"]}
    planned = {name for name, _, _ in plan}
    kept = [row for name, row in done.items() if name not in planned]  # earlier runs outside this plan stay
    rows = []
    for name, config, extra in plan:
        rows.append(done.get(name) or run(name, config, logs, extra))
        if out:
            _write(kept + rows, title, out)
    Console(width=150).print(table(rows, title))
    return rows


def table(rows: list[dict], title: str) -> Table:
    result = Table(title=title)
    for column in ("run", "trainable params", "final val loss", "val ppl", "tokens/s (wall)", "wall"):
        result.add_column(column, justify="left" if column == "run" else "right")
    for r in rows:
        result.add_row(r["name"], f"{r['trainable_params']:,}", f"{r['val_loss']:.3f}", f"{r['val_ppl']:.1f}",
                       f"{r['tokens_per_sec']:,.0f}", f"{r['wall_seconds'] / 60:.1f} min")  # fmt: skip
    return result


def _git_commit() -> str:
    return subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, cwd=ROOT).stdout.strip()


def _write(rows: list[dict], title: str, out: str, commit: str | None = None) -> None:
    commit = commit or _git_commit()
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    Path(f"{out}.json").write_text(json.dumps({"title": title, "commit": commit, "runs": rows}, indent=2) + "\n")
    note = "one `fixed-embed fit` per row; the JSON has each row's flags (`extra`) and, since added, its commit"
    lines = [f"# {title}", "", f"commit `{commit}`; {note}.", "",
             "| run | trainable params | final val loss | val ppl | tokens/s | wall (min) |",
             "|---|---:|---:|---:|---:|---:|"]  # fmt: skip
    for r in rows:
        lines.append(f"| {r['name']} | {r['trainable_params']:,} | {r['val_loss']:.3f} | {r['val_ppl']:.1f} | "
                     f"{r['tokens_per_sec']:,.0f} | {r['wall_seconds'] / 60:.1f} |")  # fmt: skip
    groups = seed_groups(rows)
    if any(len(losses) > 1 for losses in groups.values()):
        lines += ["", "Over training seeds (runs named `NAME` and `NAME-seedS`): mean ± sample sd.", "",
                  "| run | seeds | val loss mean | sd | min | max |", "|---|---:|---:|---:|---:|---:|"]  # fmt: skip
        for name, losses in groups.items():
            sd = statistics.stdev(losses) if len(losses) > 1 else float("nan")
            lines.append(f"| {name} | {len(losses)} | {statistics.mean(losses):.3f} | {sd:.3f} | "
                         f"{min(losses):.3f} | {max(losses):.3f} |")  # fmt: skip
    Path(f"{out}.md").write_text("\n".join(lines) + "\n")


def seed_groups(rows: list[dict]) -> dict[str, list[float]]:
    """Final validation losses grouped by run name without its ``-seedS`` suffix."""
    groups: dict[str, list[float]] = {}
    for r in rows:
        groups.setdefault(re.sub(r"-seed\d+$", "", r["name"]), []).append(r["val_loss"])
    return groups


if __name__ == "__main__":  # re-render OUT.md from OUT.json: python experiments/runs.py OUT
    data = json.loads(Path(f"{sys.argv[1]}.json").read_text())
    _write(data["runs"], data["title"], sys.argv[1], commit=data["commit"])
