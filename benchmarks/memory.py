"""Peak memory of one training step: the loss from the full logits vs the chunked head +
cross-entropy.

One step (forward, loss, backward) of ``LanguageModel`` at the paper's vocabulary and context
(V 49,152, T 2,048, micro-batch 8: 16,384 targets) on a small backbone (d 256, 2 layers, 4 heads,
SwiGLU 1024), on CPU in fp32, so that the head and the loss dominate. Each mode runs in a fresh
subprocess; after the model and the batch are built, the process's peak RSS is reset (Linux:
``/proc/self/clear_refs``; elsewhere the ``ru_maxrss`` delta) and the step's growth of the peak over
that baseline is reported. ``unchunked`` is ``model.loss_chunk_tokens=0`` (``F.cross_entropy`` over
the full fp32 [B, T, V] logits, the path :mod:`fixed_embed.model.loss` replaces); ``chunked``
the default chunk (``--chunk``). Full fp32 logits alone are B T V x 4 bytes = 3.0 GiB here. Each
row also gives
:func:`fixed_embed.measure.memory.memory_estimate`'s growth for the same step (its allocated
peak less the weights and AdamW moments, which a forward + backward does not add: gradients,
activations, loss, backward transient; fp32 on CPU) and its error against the measured growth;
``--calibrate`` measures several shapes for that comparison (docs/benchmarks.md).

    python benchmarks/memory.py [--modes unchunked chunked] [--chunk 4096] [--target-gib 3.4]
    [--out rows.json]
"""

from __future__ import annotations

import argparse
import gc
import json
import re
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MODES = ("unchunked", "chunked")
GIB = 2**30


def _hwm_bytes() -> int | None:
    """The process's peak RSS (VmHWM) in bytes, or None off Linux."""
    try:
        return 1024 * int(
            re.search(r"VmHWM:\s+(\d+) kB", Path("/proc/self/status").read_text()).group(1)
        )
    except (OSError, AttributeError):
        return None


def _reset_hwm() -> bool:
    try:
        Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM to the current RSS
    except OSError:
        return False
    return True


def _rss_bytes() -> int:
    try:
        return 1024 * int(
            re.search(r"VmRSS:\s+(\d+) kB", Path("/proc/self/status").read_text()).group(1)
        )
    except (OSError, AttributeError):
        return 0


def measure(mode: str, args: argparse.Namespace) -> dict:
    """One training step in this process; the peak RSS growth over the state after building."""
    import torch

    from fixed_embed.train.module import LanguageModel

    torch.manual_seed(0)
    decoder = {
        "vocab_size": args.vocab,
        "d_model": args.d_model,
        "n_layers": args.layers,
        "n_heads": args.heads,
        "ffn_dim": args.ffn,
        "max_seq_len": args.seq,
    }
    chunk = 0 if mode == "unchunked" else args.chunk
    model = LanguageModel(decoder=decoder, loss_chunk_tokens=chunk)
    block = torch.randint(0, args.vocab, (args.batch, args.seq + 1))
    gc.collect()
    baseline = _rss_bytes()
    exact = _reset_hwm()
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: kB
    start = time.perf_counter()
    loss, _ = model.block_loss(block)
    loss.backward()
    seconds = time.perf_counter() - start
    # without the reset: a lower bound if building the model peaked above the baseline
    peak = _hwm_bytes() if exact else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    growth = peak - (baseline if exact else before)
    from fixed_embed.measure.memory import RunShape, memory_estimate

    # what the estimate says one forward + backward adds over the built model (fp32 on CPU)
    estimate = memory_estimate(model, RunShape(args.batch, args.seq))
    step_growth = estimate.allocated - estimate.weights - estimate.optimizer
    return {
        "mode": mode,
        "loss_chunk_tokens": chunk,
        "shape": f"V {args.vocab} T {args.seq} B {args.batch} d {args.d_model} L {args.layers} F "
        f"{args.ffn}",
        "peak_growth_gib": growth / GIB,
        "estimate_gib": step_growth / GIB,
        "error": step_growth / growth - 1 if growth > 0 else None,
        "baseline_gib": baseline / GIB,
        "seconds": seconds,
        "loss": float(loss),
        "peak_source": "VmHWM reset" if exact else "ru_maxrss delta",
    }


def run_fresh(mode: str, args: argparse.Namespace) -> dict:
    sizes = ("chunk", "vocab", "seq", "batch", "d_model", "layers", "heads", "ffn")
    argv = [
        item for name in sizes for item in (f"--{name.replace('_', '-')}", str(getattr(args, name)))
    ]
    run = subprocess.run(
        [sys.executable, __file__, *argv, "--one", mode], capture_output=True, text=True, cwd=ROOT
    )
    if run.returncode != 0:
        raise RuntimeError(f"{mode} measurement failed:\n{run.stderr[-3000:]}")
    return json.loads(run.stdout.strip().splitlines()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--modes", nargs="+", default=list(MODES), choices=MODES)
    parser.add_argument(
        "--chunk", type=int, default=None, help="chunk tokens (default: LanguageModel's default)"
    )
    parser.add_argument("--vocab", type=int, default=49152)
    parser.add_argument("--seq", type=int, default=2048)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--d-model", type=int, default=256)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--ffn", type=int, default=1024)
    parser.add_argument(
        "--target-gib", type=float, default=3.4, help="the chunked step's peak RSS growth target"
    )
    parser.add_argument("--out", help="also write the rows as JSON")
    parser.add_argument(
        "--calibrate",
        action="store_true",
        help="the estimate against measured peaks, several shapes",
    )
    # internal: measure in this process
    parser.add_argument("--one", choices=MODES, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.chunk is None:
        import inspect

        from fixed_embed.train.module import LanguageModel

        args.chunk = inspect.signature(LanguageModel).parameters["loss_chunk_tokens"].default
    if args.one:
        print(json.dumps(measure(args.one, args)))
        return 0
    if args.calibrate:
        return calibrate(args)
    rows = [run_fresh(mode, args) for mode in args.modes]

    from rich.console import Console
    from rich.table import Table

    logits_gib = args.batch * args.seq * args.vocab * 4 / GIB
    title = (
        f"One training step, CPU fp32: V {args.vocab:,}, T {args.seq:,}, micro-batch {args.batch}, "
        f"d {args.d_model} x {args.layers} layers; full fp32 logits {logits_gib:.2f} GiB"
    )
    table = Table(title=title)
    for column in (
        "mode",
        "loss_chunk_tokens",
        "peak RSS growth GiB",
        "estimate GiB",
        "error",
        "step s",
        "loss",
    ):
        table.add_column(column, justify="left" if column == "mode" else "right")
    for r in rows:
        error = f"{100 * r['error']:+.1f} %" if r["error"] is not None else "--"
        table.add_row(
            r["mode"],
            str(r["loss_chunk_tokens"]),
            f"{r['peak_growth_gib']:.2f}",
            f"{r['estimate_gib']:.2f}",
            error,
            f"{r['seconds']:.1f}",
            f"{r['loss']:.5f}",
        )
    console = Console(width=140)
    console.print(table)
    console.print(f"peak measured by {rows[0]['peak_source']}, each mode in a fresh process")
    chunked = [r for r in rows if r["mode"] == "chunked"]
    status = 0
    if chunked:
        met = chunked[0]["peak_growth_gib"] <= args.target_gib
        console.print(
            f"target: chunked <= {args.target_gib} GiB -> {'MET' if met else 'NOT MET'} "
            f"({chunked[0]['peak_growth_gib']:.2f} GiB)",
            highlight=False,
        )
        status = 0 if met else 1
    if args.out:
        Path(args.out).write_text(json.dumps(rows, indent=2) + "\n")
    return status


#: (vocab, seq, batch, d_model, layers, heads, ffn): the head-dominated default, then
#: backbone-heavier shapes
CALIBRATION_SHAPES = [
    (49152, 1024, 8, 256, 2, 4, 1024),
    (49152, 1024, 4, 512, 4, 8, 2048),
    (8192, 512, 8, 768, 4, 12, 3072),
    (32000, 512, 4, 1024, 4, 16, 4096),
]


def calibrate(args: argparse.Namespace) -> int:
    """Both modes at each of CALIBRATION_SHAPES; a table of measured growth, estimate and error."""
    from rich.console import Console
    from rich.table import Table

    rows = []
    for vocab, seq, batch, d_model, layers, heads, ffn in CALIBRATION_SHAPES:
        shape = argparse.Namespace(
            **{
                **vars(args),
                "vocab": vocab,
                "seq": seq,
                "batch": batch,
                "d_model": d_model,
                "layers": layers,
                "heads": heads,
                "ffn": ffn,
            }
        )
        rows += [run_fresh(mode, shape) for mode in args.modes]
    table = Table(
        title="memory_estimate vs measured peak RSS growth of one fp32 training step (CPU)"
    )
    for column in ("shape", "mode", "measured GiB", "estimate GiB", "error"):
        table.add_column(column, justify="left" if column in ("shape", "mode") else "right")
    for r in rows:
        table.add_row(
            r["shape"],
            r["mode"],
            f"{r['peak_growth_gib']:.2f}",
            f"{r['estimate_gib']:.2f}",
            f"{100 * r['error']:+.1f} %" if r["error"] is not None else "--",
        )
    Console(width=140).print(table)
    errors = [abs(r["error"]) for r in rows if r["error"] is not None]
    mean = sum(errors) / len(errors)
    print(
        f"largest |error| {100 * max(errors):.1f} %, mean {100 * mean:.1f} % over {len(errors)} "
        "rows"
    )
    if args.out:
        Path(args.out).write_text(json.dumps(rows, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
