"""Identity probe: how linearly decodable is each token's id from the hidden state at its position?

For every layer l (0 = the interface's output, l = after block l), a logistic-regression probe
maps the hidden state to the K = ceil(log2 V) bits of the token's id (its plain binary code, the
same target for every interface, so interfaces are comparable). Probes are trained on the tokens
of the first ``train_fraction`` of the blocks and scored on the rest: per-bit accuracy, and id
accuracy (all K bits right, i.e. the id recovered exactly). Features are standardised per layer
with training statistics; full-batch Adam, no regularisation beyond a small weight decay.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from fixed_embed.codes import bits_of, code_width
from fixed_embed.model import Decoder

__all__ = ["identity_probe", "plot_probe"]


@torch.no_grad()
def _states(decoder: Decoder, blocks: torch.Tensor, batch_size: int) -> list[torch.Tensor]:
    device = next(decoder.parameters()).device
    per_layer: list[list[torch.Tensor]] = []
    for start in range(0, len(blocks), batch_size):
        ids = blocks[start : start + batch_size, :-1].to(device)
        for i, state in enumerate(decoder.hidden_states(ids)):
            if len(per_layer) <= i:
                per_layer.append([])
            per_layer[i].append(state.float().flatten(0, 1).cpu())
    return [torch.cat(chunks) for chunks in per_layer]


def _fit_probe(x: torch.Tensor, y: torch.Tensor, steps: int, lr: float) -> torch.nn.Linear:
    probe = torch.nn.Linear(x.shape[1], y.shape[1])
    optimizer = torch.optim.Adam(probe.parameters(), lr=lr, weight_decay=1e-4)
    for _ in range(steps):
        optimizer.zero_grad(set_to_none=True)
        F.binary_cross_entropy_with_logits(probe(x), y).backward()
        optimizer.step()
    return probe


def identity_probe(
    decoder: Decoder,
    blocks: torch.Tensor,
    train_fraction: float = 0.75,
    steps: int = 300,
    lr: float = 1e-2,
    batch_size: int = 8,
) -> dict:
    """Per-layer bit and id accuracy of linear probes on held-out tokens; a JSON-ready dict."""
    if not 0 < train_fraction < 1 or len(blocks) < 2:
        raise ValueError(f"need 0 < train_fraction < 1 and >= 2 blocks, got {train_fraction}, {len(blocks)}")
    was_training = decoder.training
    decoder.eval()
    try:
        states = _states(decoder, blocks, batch_size)
    finally:
        decoder.train(was_training)
    k = code_width(decoder.config.vocab_size)
    targets = bits_of(blocks[:, :-1].flatten(), k).float()
    split = max(1, int(len(blocks) * train_fraction)) * (blocks.shape[1] - 1)
    layers = []
    for depth, x in enumerate(states):
        mean, std = x[:split].mean(0), x[:split].std(0).clamp_min(1e-6)
        x = (x - mean) / std
        with torch.enable_grad():
            probe = _fit_probe(x[:split], targets[:split], steps, lr)
        with torch.no_grad():
            correct = (probe(x[split:]) > 0).float() == targets[split:]
        layers.append({
            "layer": depth,
            "bit_accuracy": correct.float().mean().item(),
            "id_accuracy": correct.all(-1).float().mean().item(),
        })  # fmt: skip
    return {
        "interface": type(decoder.interface).__name__,
        "code_bits": k,
        "train_tokens": split,
        "test_tokens": targets.shape[0] - split,
        "layers": layers,
    }


def plot_probe(results: dict[str, dict], path: str) -> None:
    """Bit and id accuracy vs depth, one line per model (``results``: label -> identity_probe output)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 4), sharex=True)
    for label, result in results.items():
        depth = [row["layer"] for row in result["layers"]]
        axes[0].plot(depth, [row["bit_accuracy"] for row in result["layers"]], marker="o", label=label)
        axes[1].plot(depth, [row["id_accuracy"] for row in result["layers"]], marker="o", label=label)
    for ax, title in zip(axes, ("bit accuracy (chance 0.5)", "id accuracy (all bits right)"), strict=True):
        ax.set_title(title)
        ax.set_xlabel("layer (0 = input)")
        ax.set_ylim(0, 1.02)
        ax.set_xticks(depth)
        ax.grid(alpha=0.3)
    axes[1].legend()
    fig.suptitle("Linear identity probes on held-out tokens")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
