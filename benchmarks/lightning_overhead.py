"""What the Lightning loop and the monitors cost: `fixed-embed fit` vs a plain PyTorch loop,
same model and batches.

Both sides are built from the same experiment YAML by the same LightningCLI parser (model,
seed, data module), so they train the identical model on the identical batch stream:

- ``fit``: the CLI's own Trainer with every callback and logger of the config (rich progress bar,
  parameter summary, preemption handler, TensorBoard, gradient clipping, LR schedule, logging);
  validation and checkpoints are switched off so both sides do the same work.
- ``fit-bare``: the same without the monitors (gradients, input norms, throughput);
- ``plain``: ``for block in loader: forward, cross-entropy, backward, clip, AdamW, LR step``.

The benchmark callback (lm-eval every N steps) is left out of all three: its cost is an
evaluation, not a per-step overhead. In ``fit`` every monitor hook is also timed from inside, so
the monitors' share of the step time is measured directly, free of run-to-run noise; so is the
input layer's (its forward, and for a learned table its backward into the table's gradient).

Tokens/s is measured between the end of step ``warmup`` and the end of the last step, so it
includes everything the loop does between batches. Each measurement runs in its own process
(clean peak RSS, no shared allocator state).
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import lightning as L
import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
VARIANTS = ("learned", "binary16", "gf2")


MONITORS = ("GradientMonitor", "InputNormMonitor", "SpeedMonitor")
HOOKS = ("on_train_batch_start", "on_train_batch_end", "on_before_optimizer_step", "_capture")


class HookTimer:
    """Wraps the monitors' hooks; records (end time, duration) of every call."""

    def __init__(self, callbacks) -> None:
        self.calls: list[tuple[float, float]] = []
        for callback in callbacks:
            for name in HOOKS:
                if hasattr(callback, name):
                    setattr(callback, name, self._timed(getattr(callback, name)))

    def _timed(self, hook):
        def timed(*args, **kwargs):
            start = time.perf_counter()
            try:
                return hook(*args, **kwargs)
            finally:
                end = time.perf_counter()
                self.calls.append((end, end - start))

        return timed

    def seconds_between(self, start: float, end: float) -> float:
        return sum(d for t, d in self.calls if start < t <= end)


class InputLayerTimer:
    """Time spent in the input interface: its forward, and (learned tables) its backward, i.e.
    from the moment the gradient of its output arrives until the table's gradient is accumulated."""

    def __init__(self, interface: torch.nn.Module) -> None:
        self.calls: list[tuple[float, float]] = []
        self._start = self._grad_arrived = 0.0
        interface.register_forward_pre_hook(self._before)
        interface.register_forward_hook(self._after)
        for weight in interface.parameters():
            weight.register_post_accumulate_grad_hook(self._accumulated)

    def _before(self, *args) -> None:
        self._start = time.perf_counter()

    def _after(self, module, args, output) -> None:
        end = time.perf_counter()
        self.calls.append((end, end - self._start))
        if output.requires_grad:
            output.register_hook(self._output_grad)

    def _output_grad(self, grad):
        self._grad_arrived = time.perf_counter()

    def _accumulated(self, param) -> None:
        end = time.perf_counter()
        self.calls.append((end, end - self._grad_arrived))

    def seconds_between(self, start: float, end: float) -> float:
        return sum(d for t, d in self.calls if start < t <= end)


class StepClock(L.Callback):
    def __init__(self) -> None:
        self.ends: list[float] = []

    def on_train_batch_end(self, *args) -> None:
        self.ends.append(time.perf_counter())


def build(variant: str, steps: int, log_dir: str, monitors: bool = True):
    from fixed_embed.cli.train import FixedEmbedCLI

    args = [
        "--config",
        str(ROOT / f"experiments/tiny/{variant}.yaml"),
        f"--trainer.max_steps={steps}",
        "--trainer.limit_val_batches=0",
        f"--trainer.logger.init_args.save_dir={log_dir}",
    ]
    cli = FixedEmbedCLI(args=args, run=False)
    # No checkpoints (the plain loop saves nothing either), no in-loop lm-eval.
    # with FixedEmbedCLI: this script's --help needs neither
    from callbacks.benchmarks import (
        BenchmarkCallback,
    )

    dropped = (L.pytorch.callbacks.Checkpoint, BenchmarkCallback)
    kept = [c for c in cli.trainer.callbacks if not isinstance(c, dropped)]
    cli.trainer.callbacks = [c for c in kept if monitors or type(c).__name__ not in MONITORS]
    return cli


def run_fit(cli, steps: int) -> tuple[list[float], HookTimer, InputLayerTimer]:
    clock = StepClock()
    timer = HookTimer([c for c in cli.trainer.callbacks if type(c).__name__ in MONITORS])
    input_layer = InputLayerTimer(cli.model.decoder.interface)
    cli.trainer.callbacks.append(clock)
    cli.trainer.fit(cli.model, cli.datamodule)
    return clock.ends, timer, input_layer


def run_plain(cli, steps: int) -> tuple[list[float], None, None]:
    from fixed_embed.model.recipe import build_adamw, lr_at

    model, datamodule = cli.model, cli.datamodule
    datamodule.setup("fit")
    optimizer = build_adamw(model, model.optimizer_config)
    sched, peak = model.schedule_config, model.optimizer_config.lr
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: lr_at(s, peak, sched.warmup_steps, steps, sched.min_lr_ratio) / peak
    )
    model.train()
    ends = []
    for step, block in enumerate(datamodule.train_dataloader()):
        if step == steps:
            break
        logits = model.decoder(block[:, :-1])
        loss = F.cross_entropy(logits.float().flatten(0, 1), block[:, 1:].flatten())
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        ends.append(time.perf_counter())
    return ends, None, None


def measure(loop: str, variant: str, steps: int, warmup: int) -> dict:
    with tempfile.TemporaryDirectory() as log_dir:
        cli = build(variant, steps, log_dir, monitors=loop == "fit")
        ends, timer, input_layer = (run_plain if loop == "plain" else run_fit)(cli, steps)
    if len(ends) != steps:
        raise RuntimeError(f"{loop} {variant}: expected {steps} steps, timed {len(ends)}")
    tokens_per_step = cli.datamodule.batch_size * cli.datamodule.seq_len
    start, end = ends[warmup - 1], ends[-1]
    result = {
        "loop": loop,
        "variant": variant,
        "tokens_per_sec": tokens_per_step * (steps - warmup) / (end - start),
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }
    if timer is not None:
        result["monitor_frac"] = timer.seconds_between(start, end) / (end - start)
        result["input_layer_frac"] = input_layer.seconds_between(start, end) / (end - start)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--warmup", type=int, default=5, help="steps excluded from the timing")
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=VARIANTS)
    parser.add_argument("--one", nargs=2, metavar=("LOOP", "VARIANT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if not 0 < args.warmup < args.steps:
        parser.error(f"need 0 < --warmup < --steps, got warmup {args.warmup}, steps {args.steps}")
    if args.one:
        print(json.dumps(measure(*args.one, args.steps, args.warmup)))
        return

    from rich.console import Console
    from rich.table import Table

    table = Table(
        title=f"Lightning loop and monitors vs a plain PyTorch loop (tiny config, {args.steps} "
        "steps, CPU)"
    )
    columns = (
        "variant",
        "plain tok/s",
        "fit-bare tok/s",
        "fit tok/s",
        "fit / plain",
        "monitors, in-hook",
        "monitors, end-to-end",
        "input layer",
        "fit RSS MB",
    )
    for column in columns:
        table.add_column(column, justify="left" if column == "variant" else "right")
    for variant in args.variants:
        result = {}
        for loop in ("plain", "fit-bare", "fit"):
            out = subprocess.run(
                [
                    sys.executable,
                    __file__,
                    "--one",
                    loop,
                    variant,
                    "--steps",
                    str(args.steps),
                    "--warmup",
                    str(args.warmup),
                ],
                capture_output=True,
                text=True,
                check=True,
                cwd=ROOT,
            ).stdout
            result[loop] = json.loads(out.strip().splitlines()[-1])
        plain, bare, fit = (result[k]["tokens_per_sec"] for k in ("plain", "fit-bare", "fit"))
        table.add_row(
            variant,
            f"{plain:,.0f}",
            f"{bare:,.0f}",
            f"{fit:,.0f}",
            f"{fit / plain:.3f}",
            f"{100 * result['fit']['monitor_frac']:.2f} %",
            f"{100 * (1 - fit / bare):+.1f} %",
            f"{100 * result['fit']['input_layer_frac']:.2f} %",
            f"{result['fit']['peak_rss_mb']:,.0f}",
        )
    Console(width=120).print(table)


if __name__ == "__main__":
    main()
