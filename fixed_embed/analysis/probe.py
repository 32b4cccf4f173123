"""Identity probe: how linearly decodable is each token's id from the hidden state at its position?

For every layer l (0 = the interface's output, l = after block l), a logistic-regression probe
maps the hidden state to the K = ceil(log2 V) bits of the token's id (its plain binary code, the
same target for every interface, so interfaces are comparable). Two held-out splits, each scored
by per-bit accuracy and id accuracy (all K bits right, i.e. the id recovered exactly):

* ``position``: trained on the tokens of the first ``train_fraction`` of the blocks, scored on the
  rest. Most test tokens are types the probe saw in training, so a probe can succeed by
  recognising each type's state (a lookup), whether or not the bits are laid out linearly.
* ``type``: a seeded quarter of the token types is never trained on; scored on those types only.
  Success needs a read-out that generalises to unseen ids: the bits themselves, linearly present.

Features are standardised per layer with training statistics; full-batch Adam, no regularisation
beyond a small weight decay.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from fixed_embed.codes import bits_of, code_width
from fixed_embed.model import Decoder

__all__ = ["identity_probe", "plot_probe"]

TYPE_SEED = 20261201  # which quarter of the vocabulary the type split holds out


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
    ids = blocks[:, :-1].flatten()
    targets = bits_of(ids, k).float()
    cut = max(1, int(len(blocks) * train_fraction)) * (blocks.shape[1] - 1)
    by_position = torch.arange(len(ids)) < cut
    held_types = torch.randperm(decoder.config.vocab_size, generator=torch.Generator().manual_seed(TYPE_SEED))
    held = torch.zeros(decoder.config.vocab_size, dtype=torch.bool)
    held[held_types[: decoder.config.vocab_size // 4]] = True
    by_type = ~held[ids]
    layers = []
    for depth, x in enumerate(states):
        row = {"layer": depth}
        for split, train in (("position", by_position), ("type", by_type)):
            mean, std = x[train].mean(0), x[train].std(0).clamp_min(1e-6)
            z = (x - mean) / std
            with torch.enable_grad():
                probe = _fit_probe(z[train], targets[train], steps, lr)
            with torch.no_grad():
                correct = (probe(z[~train]) > 0).float() == targets[~train]
            suffix = "" if split == "position" else "_unseen_types"
            row[f"bit_accuracy{suffix}"] = correct.float().mean().item()
            row[f"id_accuracy{suffix}"] = correct.all(-1).float().mean().item()
        layers.append(row)
    return {
        "interface": type(decoder.interface).__name__,
        "code_bits": k,
        "train_tokens": cut,
        "test_tokens": len(ids) - cut,
        "unseen_type_tokens": int((~by_type).sum()),
        "layers": layers,
    }


def plot_probe(results: dict[str, dict], path: str) -> None:
    """Bit and id accuracy vs depth for both splits, one line per model (label -> identity_probe output)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(10, 7.5), sharex=True)
    styles = ["-", "--", ":", "-."]
    markers = ["o", "s", "^", "D", "v", "x", "P", "*"]
    for i, (label, result) in enumerate(results.items()):
        depth = [row["layer"] for row in result["layers"]]
        # distinct dashes and markers: models with equal accuracies stay visible on top of each other
        style = {"linestyle": styles[i % len(styles)], "marker": markers[i % len(markers)], "label": label,
                 "markersize": 7 - i % 4, "alpha": 0.85}  # fmt: skip
        for r, suffix in enumerate(("", "_unseen_types")):
            for c, metric in enumerate(("bit_accuracy", "id_accuracy")):
                values = [row.get(metric + suffix) for row in result["layers"]]
                if None not in values:
                    axes[r][c].plot(depth, values, **style)
    titles = [["bit accuracy (chance 0.5)", "id accuracy (all bits right)"]] * 2
    for r, split in enumerate(("held-out positions", "held-out token types")):
        for c in range(2):
            ax = axes[r][c]
            ax.set_title(f"{titles[r][c]}, {split}", fontsize=10)
            ax.set_ylim(0, 1.02)
            ax.grid(alpha=0.3)
            if r == 1:
                ax.set_xlabel("layer (0 = input)")
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=min(4, len(labels)), fontsize=8)  # below the data
    fig.suptitle("Linear identity probes")
    fig.tight_layout(rect=(0, 0.08, 1, 1))
    fig.savefig(path, dpi=120)
    plt.close(fig)
