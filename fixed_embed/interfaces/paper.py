"""The paper's three interfaces: a learned table, the id's bits, and the bits through a fixed
GF(2) map."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from fixed_embed.config import PositiveFinite
from fixed_embed.errors import ConfigError
from fixed_embed.interfaces.base import InputInterface
from fixed_embed.interfaces.codes import (
    bits_of,
    decode_bits,
    gf2_apply,
    gf2_rank,
    matrix_from_rows,
    random_invertible_gf2,
    rows_from_matrix,
)
from fixed_embed.interfaces.codes import code_width as minimal_code_width
from fixed_embed.interfaces.tiling import tile, tiled_norm


class LearnedInput(InputInterface):
    """A trainable V x d embedding table, initialised N(0, init_std^2)."""

    def __init__(self, vocab_size: int, d_model: int, init_std: PositiveFinite = 0.02) -> None:
        super().__init__(vocab_size, d_model)
        self.init_std = init_std
        self.weight = nn.Parameter(torch.empty(vocab_size, d_model))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        nn.init.normal_(self.weight, mean=0.0, std=self.init_std)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        self.check_ids(ids)
        return nn.functional.embedding(ids, self.weight)

    def expected_norm(self, ids: torch.Tensor) -> torch.Tensor:
        return self.weight.detach()[ids].float().norm(dim=-1)


class BinaryCodeInput(InputInterface):
    """The id's K-bit little-endian code (0/1, or -1/+1 if ``bipolar``; K: ceil(log2 V) unless
    given), tiled to d."""

    fixed = True
    max_code_width = 62  # codes are int64 (the permuted control's 2^K shuffle allows fewer)

    def __init__(
        self, vocab_size: int, d_model: int, code_width: int | None = None, bipolar: bool = False
    ) -> None:
        super().__init__(vocab_size, d_model)
        minimal = minimal_code_width(vocab_size)
        width = minimal if code_width is None else code_width
        if width < minimal:
            raise ConfigError(
                f"vocab_size {vocab_size} needs {minimal} bits but code_width={width} holds only "
                f"2^{width} = {2**width} codes: set code_width {minimal}"
            )
        if width > self.max_code_width:  # a config's vocab_size (<= 2**24) needs fewer
            raise ConfigError(
                f"{type(self).__name__} takes code_width <= {self.max_code_width}, got {width}: "
                "set "
                f"code_width {minimal}, what vocab_size {vocab_size} needs"
            )
        if d_model < width:
            raise ConfigError(
                f"d_model ({d_model}) must be >= the code width K = {width} so every bit is seen"
            )
        self.code_width, self.bipolar = width, bool(bipolar)

    def encode(self, ids: torch.Tensor) -> torch.Tensor:
        """Integer code of each id (the identity here; recodings override it)."""
        return ids.to(torch.int64)

    def bits(self, ids: torch.Tensor) -> torch.Tensor:
        """The K-bit code of each id: ``ids.shape + (K,)``, int64 0/1, element 0 = least
        significant bit."""
        return bits_of(self.encode(ids), self.code_width)

    def values(self, ids: torch.Tensor) -> torch.Tensor:
        """The K code values of each id: the bits (0/1), or 2 bits - 1 (-1/+1) when bipolar."""
        code = self.bits(ids).to(torch.get_default_dtype())
        return 2 * code - 1 if self.bipolar else code

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        self.check_ids(ids)
        return tile(self.values(ids), self.d_model)

    def expected_norm(self, ids: torch.Tensor) -> torch.Tensor:
        """0/1: sqrt(popcount(code) * floor(d/K) + popcount of the truncated copy's bits);
        -1/+1: sqrt(d)."""
        return tiled_norm(self.values(ids), self.d_model)


class GF2CodeInput(BinaryCodeInput):
    """The bits after a fixed invertible affine map over GF(2), A bits(id) xor b, tiled. A:
    drawn from ``code_seed`` (12345: the paper's seed, not its draw) or ``matrix`` (K x K 0/1);
    b: ``offset``, a mask or K bits (paper: 0)."""

    code_buffer = "code_matrix"

    def __init__(
        self,
        vocab_size: int,
        d_model: int,
        code_seed: int = 12345,
        matrix: list[list[int]] | None = None,
        offset: int | list[int] = 0,
        code_width: int | None = None,
        bipolar: bool = False,
    ) -> None:
        super().__init__(vocab_size, d_model, code_width, bipolar)
        width = self.code_width
        self.code_seed = code_seed
        self.matrix = [list(map(int, r)) for r in matrix] if matrix is not None else None
        self._defined_rows()  # raises for a wrongly sized or singular matrix
        self.offset = _offset_mask(offset, width)  # the K-bit offset b as an integer mask
        self.register_buffer(
            "code_matrix", torch.empty(width, width, dtype=torch.uint8), persistent=True
        )
        self.reset_parameters()

    def _defined_rows(self) -> list[int]:
        """A's row masks as the options define it: drawn from ``code_seed``, or the explicit
        ``matrix``."""
        if self.matrix is None:
            return random_invertible_gf2(self.code_width, self.code_seed)
        rows = rows_from_matrix(self.matrix)
        if len(rows) != self.code_width:
            k, fits = (
                len(rows),
                minimal_code_width(self.vocab_size) <= len(rows) <= self.max_code_width,
            )
            raise ConfigError(
                f"matrix must be K x K = {self.code_width} x {self.code_width} for vocab_size "
                f"{self.vocab_size}, got {k} rows{f': set code_width {k}' if fits else ''}"
            )
        if (rank := gf2_rank(rows)) < self.code_width:
            raise ConfigError(
                f"GF(2) matrix is singular (rank {rank} < {self.code_width}); a recoding must be "
                "invertible so that every token keeps a distinct code"
            )
        return rows

    def reset_parameters(self) -> None:
        """(Re)compute the matrix from the options, e.g. after meta-device init."""
        self.code_matrix.copy_(matrix_from_rows(self._defined_rows(), self.code_width))

    def code_from_options(self) -> tuple[torch.Tensor, str]:
        source = f"code_seed={self.code_seed}" if self.matrix is None else "the explicit matrix"
        return matrix_from_rows(self._defined_rows(), self.code_width), source

    def encode(self, ids: torch.Tensor) -> torch.Tensor:
        return gf2_apply(decode_bits(self.code_matrix), ids) ^ self.offset  # A's row masks


def _offset_mask(offset: int | Sequence[int], width: int) -> int:
    if isinstance(offset, bool):
        raise ConfigError(f"offset must be an int mask or a list of {width} bits, got {offset!r}")
    if isinstance(offset, int):
        if not 0 <= offset < 2**width:
            raise ConfigError(
                f"offset must be a {width}-bit mask in [0, {2**width - 1}], got {offset}"
            )
        return offset
    bits = list(offset)
    if len(bits) != width:
        raise ConfigError(f"offset must have K = {width} bits, got {len(bits)}")
    if any(b not in (0, 1) for b in bits):
        raise ConfigError(f"offset bits must be 0 or 1, got {bits}")
    return sum(int(b) << i for i, b in enumerate(bits))
