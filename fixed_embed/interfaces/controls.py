"""Controls the paper leaves open, each separating one property of the fixed codes (listed in
``__init__``)."""

from __future__ import annotations

import math
from typing import Literal

import torch
from torch import nn

from fixed_embed.config import PositiveFinite, PositiveInt, domain
from fixed_embed.errors import ConfigError
from fixed_embed.interfaces.base import InputInterface
from fixed_embed.interfaces.codes import bits_of, random_injection
from fixed_embed.interfaces.codes import code_width as minimal_code_width
from fixed_embed.interfaces.paper import BinaryCodeInput, LearnedInput
from fixed_embed.interfaces.tiling import binary_code_norm, tile, tiled_norm

# what Generator.manual_seed takes
TorchSeed = domain("an integer in [0, 2**64)", int, (">=", 0), ("<", 2**64))


class PermutedCodeInput(BinaryCodeInput):
    """Binary codes assigned by a random injective (not linear) map fixed by ``code_seed``
    (token 0's too; stored)."""

    max_code_width = 24  # a shuffle of 2^K Python ints
    code_buffer = "assignment"

    def __init__(
        self,
        vocab_size: int,
        d_model: int,
        code_seed: int = 0,
        code_width: int | None = None,
        bipolar: bool = False,
    ) -> None:
        super().__init__(vocab_size, d_model, code_width, bipolar)
        self.code_seed = code_seed
        self._codes = random_injection(vocab_size, self.code_width, code_seed)
        self.register_buffer(
            "assignment", torch.empty(vocab_size, dtype=torch.int64), persistent=True
        )
        self.reset_parameters()

    def reset_parameters(self) -> None:
        self.assignment.copy_(torch.tensor(self._codes, dtype=torch.int64))

    def code_from_options(self) -> tuple[torch.Tensor, str]:
        return torch.tensor(self._codes, dtype=torch.int64), f"code_seed={self.code_seed}"

    def encode(self, ids: torch.Tensor) -> torch.Tensor:
        return self.assignment[ids.to(torch.int64)]


class RandomCodeInput(InputInterface):
    """Fixed random codes: a seeded V x K table (Gaussian or uniform, unit variance; K:
    ceil(log2 V) unless given) tiled to d; ``norm_match``: rows at their 0/1 code's norm.
    Checkpoints hold its fingerprint, refusing another draw."""

    fixed = True
    code_buffer = "fingerprint"

    def __init__(
        self,
        vocab_size: int,
        d_model: int,
        code_seed: TorchSeed = 0,
        distribution: str = "gaussian",
        code_width: PositiveInt | None = None,
        norm_match: bool = False,
    ) -> None:
        super().__init__(vocab_size, d_model)
        # d_model >= it: least_d_model
        width = minimal_code_width(vocab_size) if code_width is None else code_width
        if distribution not in ("gaussian", "uniform"):
            raise ConfigError(f"distribution must be 'gaussian' or 'uniform', got {distribution!r}")
        self.code_seed, self.distribution, self.code_width, self.norm_match = (
            code_seed,
            distribution,
            width,
            norm_match,
        )
        self.register_buffer("codes", torch.empty(vocab_size, width), persistent=False)
        self.register_buffer("fingerprint", torch.empty(2, dtype=torch.float64), persistent=True)
        self.reset_parameters()

    def _draw(self) -> torch.Tensor:
        generator = torch.Generator().manual_seed(self.code_seed)
        shape = (self.vocab_size, self.code_width)
        if self.distribution == "gaussian":
            table = torch.randn(shape, generator=generator, dtype=torch.float64)
        else:
            table = (
                torch.rand(shape, generator=generator, dtype=torch.float64) * 2 - 1
            ) * math.sqrt(3)
        if self.norm_match:
            ids = torch.arange(self.vocab_size)
            target = binary_code_norm(ids, self.vocab_size, self.d_model).double()
            table = table * (target / tiled_norm(table, self.d_model).double()).unsqueeze(-1)
        return table

    def reset_parameters(self) -> None:
        table = self._draw()
        self.codes.copy_(table.to(self.codes.dtype))
        self.fingerprint.copy_(_fingerprint(table))

    def code_from_options(self) -> tuple[torch.Tensor, str]:
        # Another torch version may draw another table from the same seed: the fingerprint says so.
        return _fingerprint(self._draw()), f"code_seed={self.code_seed} with this torch"

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        self.check_ids(ids)
        return tile(nn.functional.embedding(ids, self.codes), self.d_model)

    def expected_norm(self, ids: torch.Tensor) -> torch.Tensor:
        return tiled_norm(self.codes[ids], self.d_model)


class LowRankLearnedInput(InputInterface):
    """A trainable K-dim vector per token, tiled to d; ``init``: ``binary`` (as binary16) or
    ``normal`` (init_std)."""

    def __init__(
        self,
        vocab_size: int,
        d_model: int,
        code_width: int | None = None,
        init: Literal["binary", "normal"] = "binary",
        init_std: PositiveFinite = 0.02,
    ) -> None:
        super().__init__(vocab_size, d_model)
        minimal = minimal_code_width(vocab_size)
        width = minimal if code_width is None else code_width
        if not minimal <= width <= d_model:
            raise ConfigError(
                f"code_width must lie in [{minimal}, d_model={d_model}] (vocab_size {vocab_size}), "
                "got "
                f"{width}: set code_width {max(minimal, min(width, d_model))}"
            )
        self.code_width, self.init, self.init_std = width, init, init_std
        self.weight = nn.Parameter(torch.empty(vocab_size, width))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        with torch.no_grad():
            if self.init == "binary":
                ids = torch.arange(self.vocab_size, device=self.weight.device)
                self.weight.copy_(bits_of(ids, self.code_width).to(self.weight.dtype))
            else:
                nn.init.normal_(self.weight, mean=0.0, std=self.init_std)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        self.check_ids(ids)
        return tile(nn.functional.embedding(ids, self.weight), self.d_model)

    def expected_norm(self, ids: torch.Tensor) -> torch.Tensor:
        return tiled_norm(self.weight.detach()[ids], self.d_model)


class NormMatchedLearnedInput(LearnedInput):
    """A learned V x d table, each output row rescaled to the norm of the id's 0/1 code (token
    0: zero, no gradient)."""

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        rows = super().forward(ids)
        target = binary_code_norm(ids, self.vocab_size, self.d_model).to(rows.dtype)
        return rows * (target / rows.norm(dim=-1).clamp_min(1e-12)).unsqueeze(-1)

    def expected_norm(self, ids: torch.Tensor) -> torch.Tensor:
        return binary_code_norm(ids, self.vocab_size, self.d_model)


def _fingerprint(table: torch.Tensor) -> torch.Tensor:
    """Two float64 numbers that change if any entry of a random code table does."""
    rows = torch.arange(1, table.shape[0] + 1, dtype=torch.float64)
    return torch.stack([table.double().pow(2).sum(), (table.double().sum(-1) * rows).sum()])
