"""Identity probe: how linearly decodable each token's id bits are from each layer's state
(docs/controls.md), held out by ``position`` (later tokens, mostly seen types: a lookup
suffices) or ``type`` (a quarter unseen: needs the bits)."""

from __future__ import annotations

import itertools
import json

import torch
import torch.nn.functional as F

from fixed_embed.evaluation.analysis.blocks import per_batch
from fixed_embed.interfaces.codes import bits_of, code_width
from fixed_embed.model.decoder import Decoder

TYPE_SEED = 20261201  # which quarter of the vocabulary the type split holds out
_LINE_STYLES = ["-", "--", ":", "-."]
_MARKERS = ["o", "s", "^", "D", "v", "x", "P", "*"]


def _states(decoder: Decoder, blocks: torch.Tensor, batch_size: int) -> list[torch.Tensor]:
    def states(block: torch.Tensor) -> list[torch.Tensor]:
        return [state.float().flatten(0, 1).cpu() for state in decoder.hidden_states(block[:, :-1])]

    return [
        torch.cat(per_layer)
        for per_layer in zip(*per_batch(decoder, blocks, batch_size, states), strict=True)
    ]


def _fit_probe(x: torch.Tensor, y: torch.Tensor, steps: int, lr: float) -> torch.nn.Linear:
    probe = torch.nn.Linear(x.shape[1], y.shape[1])
    optimizer = torch.optim.Adam(probe.parameters(), lr=lr, weight_decay=1e-4)
    for _ in range(steps):
        optimizer.zero_grad(set_to_none=True)
        F.binary_cross_entropy_with_logits(probe(x), y).backward()
        optimizer.step()
    return probe


def probe_sample(
    blocks: torch.Tensor, vocab_size: int, train_fraction: float = 0.75
) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
    """The probe's (and majority baseline's) samples, one per input position of ``blocks[N, T +
    1]`` in :func:`_states`' order: ids ``[N * T]``, K-bit targets ``[N * T, K]`` (float 0/1),
    each split's training mask (the rest: test)."""
    if not 0 < train_fraction < 1 or len(blocks) < 2:
        raise ValueError(
            f"need 0 < train_fraction < 1 and >= 2 blocks, got {train_fraction}, {len(blocks)}"
        )
    ids = blocks[:, :-1].flatten()
    targets = bits_of(ids, code_width(vocab_size)).float()
    # position: the first train_fraction of the blocks;
    # type: tokens outside the held-out quarter of types
    cut = max(1, int(len(blocks) * train_fraction)) * (blocks.shape[1] - 1)
    types = torch.randperm(vocab_size, generator=torch.Generator().manual_seed(TYPE_SEED))
    splits = {
        "position": torch.arange(len(ids)) < cut,
        "type": ~torch.isin(ids, types[: vocab_size // 4]),
    }
    return ids, targets, splits


def _scores(predicted: torch.Tensor, targets: torch.Tensor) -> dict[str, float]:
    correct = predicted == targets
    return {
        "bit_accuracy": correct.float().mean().item(),
        "id_accuracy": correct.all(-1).float().mean().item(),
    }


def majority_baseline(
    targets: torch.Tensor, splits: dict[str, torch.Tensor]
) -> dict[str, dict[str, float]]:
    """Per split, the test accuracies of guessing each bit's commonest training value (ties: 0):
    the probes' floor."""
    baseline = {}
    for split, train in splits.items():
        guess = (targets[train].mean(0) > 0.5).float()
        baseline[split] = _scores(guess.expand_as(targets[~train]), targets[~train])
    return baseline


def identity_probe(
    decoder: Decoder,
    blocks: torch.Tensor,
    train_fraction: float = 0.75,
    steps: int = 300,
    lr: float = 1e-2,
    batch_size: int = 8,
) -> dict:
    """Per-layer bit and id accuracy of linear probes on held-out tokens, and ``majority``; a
    JSON-ready dict."""
    # checked before any forward
    ids, targets, splits = probe_sample(blocks, decoder.config.vocab_size, train_fraction)
    layers = []
    for depth, x in enumerate(_states(decoder, blocks, batch_size)):
        row = {"layer": depth}
        for split, train in splits.items():
            mean, std = x[train].mean(0), x[train].std(0).clamp_min(1e-6)
            z = (x - mean) / std
            with torch.enable_grad():
                probe = _fit_probe(z[train], targets[train], steps, lr)
            with torch.no_grad():
                scores = _scores((probe(z[~train]) > 0).float(), targets[~train])
            suffix = "" if split == "position" else "_unseen_types"
            row.update({f"{metric}{suffix}": value for metric, value in scores.items()})
        layers.append(row)
    cut = int(splits["position"].sum())
    return {
        "interface": type(decoder.interface).__name__,
        "code_bits": targets.shape[1],
        "train_tokens": cut,
        "test_tokens": len(ids) - cut,
        "unseen_type_tokens": int((~splits["type"]).sum()),
        "layers": layers,
        "majority": majority_baseline(targets, splits),
    }


def plot_probe(results: dict[str, dict], path: str, seed: int | None = None) -> None:
    """Bit and id accuracy vs depth per split, a line per model (label -> identity_probe
    output), majority floors."""
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    fig = Figure(figsize=(10, 7.5))
    axes = fig.subplots(2, 2, sharex=True)
    splits = (
        ("position", "", "held-out positions"),
        ("type", "_unseen_types", "held-out token types"),
    )
    metrics = (("bit_accuracy", "bit accuracy"), ("id_accuracy", "id accuracy (all bits right)"))
    # rows: splits; columns: metrics
    panels = list(zip(axes.flat, itertools.product(splits, metrics), strict=True))
    floors = {
        label: result["majority"] for label, result in results.items() if "majority" in result
    }
    shared = len({json.dumps(floor, sort_keys=True) for floor in floors.values()}) == 1
    for i, (label, result) in enumerate(results.items()):
        _plot_model(panels, i, label, result, None if shared else floors.get(label))
    for ax, ((split, _, held_out), (metric, title)) in panels:
        if shared:
            ax.axhline(
                next(iter(floors.values()))[split][metric],
                color="black",
                linewidth=1.0,
                linestyle=(0, (8, 4)),
                zorder=1,
                label="majority class (each bit's most frequent training value)",
            )
        ax.set_title(f"{title}, {held_out}", fontsize=10)
        ax.set(ylim=(0, 1.02), xlabel="layer (0 = input)" if split == "type" else "")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(alpha=0.3)
    handles, labels = axes[0][0].get_legend_handles_labels()
    rows = -(-len(labels) // 4)
    # below the axes, never over the data: the figure reserves a strip for the legend's rows
    fig.legend(
        handles, labels, loc="lower center", ncol=min(4, len(labels)), fontsize=8, frameon=False
    )
    fig.suptitle("Linear identity probes" + (f", seed {seed}" if seed is not None else ""))
    fig.tight_layout(rect=(0, 0.01 + 0.03 * rows, 1, 1))
    fig.savefig(path, dpi=120)


def _plot_model(panels: list, i: int, label: str, result: dict, floors: dict | None) -> None:
    """The ``i``-th model's accuracies vs depth on every panel, and its own majority floors if
    given."""
    depth = [row["layer"] for row in result["layers"]]
    # distinct dashes and markers: models with equal accuracies stay visible on top of each other
    style = {
        "linestyle": _LINE_STYLES[i % len(_LINE_STYLES)],
        "marker": _MARKERS[i % len(_MARKERS)],
        "label": label,
        "markersize": 7 - i % 4,
        "alpha": 0.85,
    }
    for ax, ((split, suffix, _), (metric, _)) in panels:
        values = [row.get(metric + suffix) for row in result["layers"]]
        if None not in values:
            line = ax.plot(depth, values, **style)[0]
            if floors is not None:
                ax.axhline(
                    floors[split][metric],
                    color=line.get_color(),
                    linewidth=0.9,
                    linestyle=style["linestyle"],
                    alpha=0.6,
                    label=f"{label}: majority class",
                )
