"""Input-layer cost on CPU: forward+backward time and training-state bytes per interface.

ids (8, 2048), d_model 2048, V 49,152 (the paper's shapes). The backward pass feeds a
fixed upstream gradient into the interface output, as the first block would; a fixed code
has nothing to differentiate, so its backward is free. Training-state bytes are measured
from the tensors that exist after one AdamW step: parameters + gradients + optimizer state.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch
from rich.console import Console
from rich.table import Table

from fixed_embed.interfaces import BinaryCodeInput, GF2CodeInput, LearnedInput


def time_fwd_bwd(interface, ids, grad_out, repeats: int) -> float:
    times = []
    for _ in range(repeats + 1):
        start = time.perf_counter()
        out = interface(ids)
        if out.requires_grad:
            out.backward(grad_out)
        times.append(time.perf_counter() - start)
        interface.zero_grad(set_to_none=True)
    return statistics.median(times[1:])  # first call warms up allocator and kernels


def training_state_bytes(interface, ids, grad_out) -> int:
    params = [p for p in interface.parameters() if p.requires_grad]
    if not params:
        return 0
    optimizer = torch.optim.AdamW(params, lr=1e-4)
    interface(ids).backward(grad_out)
    optimizer.step()
    state = [
        t
        for s in optimizer.state.values()
        for t in s.values()
        if torch.is_tensor(t) and t.dim() > 0
    ]
    return sum(t.numel() * t.element_size() for t in [*params, *(p.grad for p in params), *state])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq", type=int, default=2048)
    parser.add_argument("--d-model", type=int, default=2048)
    parser.add_argument("--vocab", type=int, default=49152)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    torch.manual_seed(0)
    ids = torch.randint(0, args.vocab, (args.batch, args.seq))
    grad_out = torch.randn(args.batch, args.seq, args.d_model)
    rows = []
    for cls in (LearnedInput, BinaryCodeInput, GF2CodeInput):
        interface = cls(args.vocab, args.d_model)
        seconds = time_fwd_bwd(interface, ids, grad_out, args.repeats)
        rows.append((cls.__name__, seconds, training_state_bytes(interface, ids, grad_out)))
    learned_time = rows[0][1]
    table = Table(
        title=f"input layer, ids {args.batch}x{args.seq}, d {args.d_model}, V {args.vocab:,}, "
        f"{torch.get_num_threads()} threads"
    )
    for col in ("interface", "fwd+bwd ms (median)", "x learned", "params+grads+AdamW bytes"):
        table.add_column(col, justify="right")
    for name, seconds, nbytes in rows:
        table.add_row(name, f"{seconds * 1e3:.1f}", f"{seconds / learned_time:.2f}", f"{nbytes:,}")
    Console(width=120).print(table)
    Console(width=120).print(paper_training_state())


def paper_training_state(n_gpus: int = 2) -> Table:
    """fp32 weights + gradients + AdamW moments of the whole paper model, per GPU, learned vs
    binary16.

    Built on the meta device and stepped once with AdamW there, so the bytes are those of the
    tensors that training really allocates (without allocating them). Under DDP every GPU holds
    all of it; FSDP divides it by the number of GPUs.
    """
    from fixed_embed.config import load_experiment
    from fixed_embed.model.recipe import AdamWConfig, build_adamw
    from fixed_embed.train.experiment import build_model

    root = Path(__file__).resolve().parents[1] / "experiments" / "paper"
    sizes = {}
    for variant in ("learned", "binary16"):
        model = build_model(load_experiment(root / f"{variant}.yaml")["model"])  # meta
        for p in model.parameters():
            p.grad = torch.zeros_like(p)
        optimizer = build_adamw(model, AdamWConfig(implementation="for-loop"))
        optimizer.step()
        params = list(model.parameters())
        state = [
            t
            for s in optimizer.state.values()
            for t in s.values()
            if torch.is_tensor(t) and t.dim() > 0
        ]
        sizes[variant] = sum(
            t.numel() * t.element_size() for t in [*params, *(p.grad for p in params), *state]
        )
    table = Table(title=f"paper config: fp32 weights + grads + AdamW state per GPU ({n_gpus} GPUs)")
    for col in ("interface", "DDP bytes/GPU", f"FSDP bytes/GPU (/{n_gpus})"):
        table.add_column(col, justify="right")
    for variant, nbytes in sizes.items():
        table.add_row(variant, f"{nbytes:,}", f"{nbytes // n_gpus:,}")
    saved = sizes["learned"] - sizes["binary16"]
    table.add_row("saved by fixed codes", f"{saved:,}", f"{saved // n_gpus:,}")
    return table


if __name__ == "__main__":
    main()
