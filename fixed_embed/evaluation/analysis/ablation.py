"""Layer ablation: the loss rise when one block's output x + f(x) becomes x (``zero``) or x +
mean(f(x)) (``mean``)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from fixed_embed.evaluation.analysis.blocks import per_batch
from fixed_embed.model.decoder import Decoder


def _loss(decoder: Decoder, blocks: torch.Tensor, batch_size: int) -> float:
    def summed(block: torch.Tensor) -> float:
        logits = decoder(block[:, :-1]).float().flatten(0, 1)
        return F.cross_entropy(logits, block[:, 1:].flatten(), reduction="sum").item()

    return sum(per_batch(decoder, blocks, batch_size, summed)) / blocks[:, 1:].numel()


def layer_ablation(
    decoder: Decoder, blocks: torch.Tensor, mode: str = "zero", batch_size: int = 8
) -> dict:
    """The intact loss and, per block, the loss with that block ablated; a JSON-ready dict."""
    if mode not in ("zero", "mean"):
        raise ValueError(f"mode must be 'zero' or 'mean', got {mode!r}")

    def ablate(module, args, output):
        x = args[0]
        return x if mode == "zero" else x + (output - x).mean(dim=(0, 1), keepdim=True)

    base = _loss(decoder, blocks, batch_size)
    rows = []
    for i, block in enumerate(decoder.layers):
        with block.register_forward_hook(ablate):  # removed on exit
            loss = _loss(decoder, blocks, batch_size)
        rows.append({"block": i, "loss": loss, "increase": loss - base})
    return {
        "interface": type(decoder.interface).__name__,
        "mode": mode,
        "loss": base,
        "blocks": rows,
    }


def plot_ablation(results: dict[str, dict], path: str) -> None:
    """Loss increase per ablated block, one group of bars per model."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(8, 4))
    ax = fig.subplots()
    width = 0.8 / max(1, len(results))
    for j, (label, result) in enumerate(results.items()):
        xs = [row["block"] + j * width for row in result["blocks"]]
        ax.bar(xs, [row["increase"] for row in result["blocks"]], width=width, label=label)
    ax.set_xticks([row["block"] for row in next(iter(results.values()))["blocks"]])
    ax.set_xlabel("ablated block")
    ax.set_ylabel("validation loss increase (nats/token)")
    ax.set_title(f"{next(iter(results.values()))['mode']}-ablation of one block at a time")
    ax.grid(alpha=0.3, axis="y")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
