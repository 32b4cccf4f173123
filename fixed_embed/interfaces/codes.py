"""Token-identity codes in integer algebra only (bit-identical on every device): little-endian
bit codes and GF(2) recodings, a K x K matrix A stored as K row masks (bit ``c`` of ``rows[r]``
is ``A[r, c]``)."""

from __future__ import annotations

import hashlib
import itertools
from collections.abc import Sequence

import torch

from fixed_embed.errors import ConfigError


def code_width(vocab_size: int) -> int:
    """K = ceil(log2 V): the fewest bits that give every id of a V-token vocabulary its own code."""
    return (vocab_size - 1).bit_length()


def bits_of(ids: torch.Tensor, width: int) -> torch.Tensor:
    """Little-endian bits of integer ``ids``: shape ``ids.shape + (width,)``, dtype int64,
    values 0/1."""
    shifts = torch.arange(width, device=ids.device, dtype=torch.int64)
    return (ids.to(torch.int64).unsqueeze(-1) >> shifts) & 1


def parity(x: torch.Tensor) -> torch.Tensor:
    """Parity (popcount mod 2) of each element of a non-negative int64 tensor below 2**63."""
    # xor-folding: torch has no popcount, and this stays exact on every device.
    for shift in (32, 16, 8, 4, 2, 1):
        x = x ^ (x >> shift)
    return x & 1


def gf2_apply(rows: torch.Tensor, codes: torch.Tensor) -> torch.Tensor:
    """y = A x over GF(2) for integer codes ``codes`` (any shape); ``rows`` is an int64 tensor
    of K row masks."""
    # bit r of y: parity(x & rows[r])
    return decode_bits(parity(codes.to(torch.int64).unsqueeze(-1) & rows))


def rows_from_matrix(matrix: Sequence[Sequence[int]]) -> list[int]:
    """Row masks of a K x K 0/1 matrix; raises ConfigError for a non-square or non-binary matrix."""
    rows = [[int(v) for v in row] for row in matrix]
    k = len(rows)
    if k == 0 or any(len(r) != k for r in rows):
        raise ConfigError(
            f"GF(2) matrix must be square, got rows of shape {k} x {sorted({len(r) for r in rows})}"
        )
    if bad := sorted({v for r in rows for v in r} - {0, 1}):
        raise ConfigError(f"GF(2) matrix entries must be 0 or 1, got {bad}")
    return [sum(v << c for c, v in enumerate(r)) for r in rows]


def matrix_from_rows(rows: Sequence[int], width: int) -> torch.Tensor:
    """The K x K uint8 matrix of row masks (entry [r, c] = bit c of rows[r])."""
    return torch.tensor([[(r >> c) & 1 for c in range(width)] for r in rows], dtype=torch.uint8)


def gf2_rank(rows: Sequence[int]) -> int:
    """Rank over GF(2) of the matrix given by its row masks (Gaussian elimination on ints)."""
    pivots: dict[int, int] = {}  # leading bit -> reduced row
    for row in rows:
        while row:
            lead = row.bit_length() - 1
            if lead not in pivots:
                pivots[lead] = row
                break
            row ^= pivots[lead]
    return len(pivots)


def _seeded_words(seed: int, label: str):
    """Endless 64-bit words, SHA-256 in counter mode: unlike torch's or NumPy's RNG, the same on
    every version."""
    for counter in itertools.count():
        digest = hashlib.sha256(
            f"fixed-embed/{label}/seed={seed}/block={counter}".encode()
        ).digest()
        for i in range(0, len(digest), 8):
            yield int.from_bytes(digest[i : i + 8], "little")


def random_invertible_gf2(width: int, seed: int) -> list[int]:
    """A uniformly random invertible ``width x width`` GF(2) matrix (row masks) fixed by
    ``seed``, by rejection."""
    words = _seeded_words(seed, f"gf2-matrix/K={width}")
    mask = (1 << width) - 1
    while True:  # a draw is invertible with probability > 0.28
        rows = [next(words) & mask for _ in range(width)]
        if gf2_rank(rows) == width:
            return rows


def random_injection(n: int, width: int, seed: int) -> list[int]:
    """``n`` distinct ``width``-bit codes in random order, fixed by ``seed`` (a partial
    Fisher-Yates shuffle)."""
    words = _seeded_words(seed, f"injection/K={width}")
    codes = list(range(2**width))
    for i in range(n):
        j = i + next(words) % (len(codes) - i)
        codes[i], codes[j] = codes[j], codes[i]
    return codes[:n]


def decode_bits(bits: torch.Tensor) -> torch.Tensor:
    """Inverse of :func:`bits_of`: little-endian 0/1 bits (last dim) back to integers."""
    weights = 1 << torch.arange(bits.shape[-1], device=bits.device, dtype=torch.int64)
    return (bits.to(torch.int64) * weights).sum(-1)
