"""`make demo`: train the three tiny variants on CPU (offline corpus) and print one table.

Each variant runs `fixed-embed fit --config experiments/tiny/<variant>.yaml` in its own
process; the table reads the final validation loss from the run's TensorBoard events.
"""

from __future__ import annotations

import argparse
import math
import subprocess
import sys
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from fixed_embed.cli.params import reports

ROOT = Path(__file__).resolve().parents[1]
VARIANTS = ("learned", "binary16", "gf2")


def last_scalar(run_dir: Path, tag: str) -> float:
    events = EventAccumulator(str(run_dir))
    events.Reload()
    return events.Scalars(tag)[-1].value


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--logs", default="logs/demo")
    parser.add_argument("extra", nargs="*", help="extra fixed-embed fit arguments, e.g. --trainer.max_steps=50")
    args = parser.parse_args()
    rows = []
    for variant in VARIANTS:
        config = ROOT / "experiments" / "tiny" / f"{variant}.yaml"
        start = time.perf_counter()
        subprocess.run(
            [sys.executable, "-m", "fixed_embed", "fit", "--config", str(config),
             f"--trainer.logger.init_args.save_dir={args.logs}", *args.extra],
            check=True,
        )  # fmt: skip
        seconds = time.perf_counter() - start
        run_dirs = sorted((Path(args.logs) / "tiny" / variant).glob("version_*"), key=lambda p: p.stat().st_mtime)
        run_dir = run_dirs[-1]
        tokens = last_scalar(run_dir, "train/tokens")
        val_loss = last_scalar(run_dir, "val/loss")
        _, report, _ = reports(str(config))
        rows.append((variant, report.trainable, val_loss, math.exp(val_loss), tokens / seconds, run_dir))
    table = Table(title="make demo: tiny variants on the offline corpus (CPU)")
    for col in ("variant", "trainable params", "final val loss", "val ppl", "tokens/s (wall)", "logs"):
        table.add_column(col, justify="right")
    for variant, trainable, loss, ppl, rate, run_dir in rows:
        table.add_row(variant, f"{trainable:,}", f"{loss:.3f}", f"{ppl:.1f}", f"{rate:,.0f}", str(run_dir))
    Console(width=140).print(table)


if __name__ == "__main__":
    main()
