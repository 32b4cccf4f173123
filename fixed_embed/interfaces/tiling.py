"""Tiling: a K-dim code repeated to d_model (the last copy truncated), and its norm."""

from __future__ import annotations

import math

import torch

from fixed_embed.interfaces.codes import bits_of, code_width


def tile(x: torch.Tensor, d_model: int) -> torch.Tensor:
    """Repeat the last dimension (K) until it is ``d_model`` long; the last copy is truncated."""
    # the last dimension: tile prepends 1s to the repeats
    return x.tile((math.ceil(d_model / x.shape[-1]),))[..., :d_model]


def tiled_norm(x: torch.Tensor, d_model: int) -> torch.Tensor:
    """The L2 norm of ``tile(x, d_model)`` over the last dimension, without materialising it."""
    reps, rem = divmod(d_model, x.shape[-1])
    squares = x.double().pow(2)
    return (reps * squares.sum(-1) + squares[..., :rem].sum(-1)).sqrt().float()


def binary_code_norm(ids: torch.Tensor, vocab_size: int, d_model: int) -> torch.Tensor:
    """The norm of the paper's 0/1 binary code of each id (K = ceil(log2 V)), tiled to d_model."""
    return tiled_norm(bits_of(ids.to(torch.int64), code_width(vocab_size)), d_model)
