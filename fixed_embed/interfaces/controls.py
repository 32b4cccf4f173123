"""Controls the paper leaves open, each separating one property of the fixed codes (listed in ``__init__``)."""

from __future__ import annotations

import math

import torch
from torch import nn

from fixed_embed.interfaces.base import InputInterface
from fixed_embed.interfaces.codes import bits_of, random_injection
from fixed_embed.interfaces.codes import code_width as minimal_code_width
from fixed_embed.interfaces.paper import BinaryCodeInput, LearnedInput
from fixed_embed.interfaces.tiling import binary_code_norm, tile, tiled_norm


class PermutedCodeInput(BinaryCodeInput):
    """The binary interface with a random injective id -> K-bit code assignment, fixed by ``code_seed``.

    Unlike a GF(2) recoding (linear: A 0 = 0, codes of sums are sums of codes) this is an
    arbitrary injection, drawn with the platform-stable SHA-256 stream; token 0 gets a random
    code. The V codes are a persistent buffer, so a checkpoint records the assignment.
    """

    def __init__(
        self,
        vocab_size: int,
        d_model: int,
        code_seed: int = 0,
        code_width: int | None = None,
        bipolar: bool = False,
    ) -> None:
        super().__init__(vocab_size, d_model, code_width, bipolar)
        if self.code_width > 24:
            raise ValueError(f"PermutedCodeInput supports code_width <= 24, got {self.code_width}")
        self.code_seed = code_seed
        self._codes = random_injection(vocab_size, self.code_width, code_seed)
        self.register_buffer("assignment", torch.empty(vocab_size, dtype=torch.int64), persistent=True)
        self.register_buffer("inverse", torch.empty(2**self.code_width, dtype=torch.int64), persistent=False)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        with torch.no_grad():
            self.assignment.copy_(torch.tensor(self._codes, dtype=torch.int64))
            self.inverse.fill_(-1)  # codes no id uses decode to -1
            self.inverse[self.assignment] = torch.arange(self.vocab_size, device=self.inverse.device)

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs) -> None:
        expected = lambda: torch.tensor(self._codes, dtype=torch.int64)  # noqa: E731
        self._verify_stored(state_dict, prefix, "assignment", expected, f"code_seed={self.code_seed}")
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def encode(self, ids: torch.Tensor) -> torch.Tensor:
        return self.assignment[ids.to(torch.int64)]

    def decode_codes(self, codes: torch.Tensor) -> torch.Tensor:
        return self.inverse[codes.to(torch.int64)]

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, code_seed={self.code_seed}"


class RandomCodeInput(InputInterface):
    """Fixed random continuous codes: a seeded V x K table (Gaussian or uniform), tiled to d; nothing trainable.

    ``code_width`` K defaults to ceil(log2 V), the binary codes' width; ``code_width=d_model`` gives
    full-width random codes (no tiling). Elements have unit variance (uniform: U(-sqrt 3, sqrt 3)),
    so a K-dim code tiled to d has norm ~sqrt(d), like a bipolar code. ``norm_match=True`` rescales
    each id's vector to the norm of its 0/1 binary code instead (token 0 then maps to zero, as in
    the paper), separating "continuous and random" from "input scale".

    The table is drawn with torch's CPU generator from ``code_seed`` and never stored: a checkpoint
    holds a two-number fingerprint of it, enough to refuse a table drawn differently (another seed,
    or another torch version's generator). Storing the table instead would put V x K floats (V x d
    at full width) in every checkpoint and a key that existing sharded checkpoints lack.
    """

    fixed = True

    def __init__(
        self,
        vocab_size: int,
        d_model: int,
        code_seed: int = 0,
        distribution: str = "gaussian",
        code_width: int | None = None,
        norm_match: bool = False,
    ) -> None:
        super().__init__(vocab_size, d_model)
        width = minimal_code_width(vocab_size) if code_width is None else code_width
        if not 1 <= width <= d_model:
            raise ValueError(f"code_width must lie in [1, d_model={d_model}], got {width}")
        if distribution not in ("gaussian", "uniform"):
            raise ValueError(f"distribution must be 'gaussian' or 'uniform', got {distribution!r}")
        self.code_seed, self.distribution, self.code_width, self.norm_match = code_seed, distribution, width, norm_match
        self.register_buffer("codes", torch.empty(vocab_size, width), persistent=False)
        self.register_buffer("fingerprint", torch.empty(2, dtype=torch.float64), persistent=True)
        self.reset_parameters()

    def _draw(self) -> torch.Tensor:
        generator = torch.Generator().manual_seed(self.code_seed)
        shape = (self.vocab_size, self.code_width)
        if self.distribution == "gaussian":
            table = torch.randn(shape, generator=generator, dtype=torch.float64)
        else:
            table = (torch.rand(shape, generator=generator, dtype=torch.float64) * 2 - 1) * math.sqrt(3)
        if self.norm_match:
            ids = torch.arange(self.vocab_size)
            target = binary_code_norm(ids, self.vocab_size, self.d_model).double()
            table = table * (target / tiled_norm(table, self.d_model).double()).unsqueeze(-1)
        return table

    def reset_parameters(self) -> None:
        table = self._draw()
        with torch.no_grad():
            self.codes.copy_(table.to(self.codes.dtype))
            self.fingerprint.copy_(_fingerprint(table))

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs) -> None:
        # Another torch version may draw another table from the same seed: the fingerprint says so.
        what = f"code_seed={self.code_seed} with this torch"
        self._verify_stored(state_dict, prefix, "fingerprint", lambda: _fingerprint(self._draw()), what)
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        self.check_ids(ids)
        return tile(nn.functional.embedding(ids, self.codes), self.d_model)

    def expected_norm(self, ids: torch.Tensor) -> torch.Tensor:
        return tiled_norm(self.codes[ids], self.d_model)

    def table(self) -> torch.Tensor:
        return tile(self.codes, self.d_model)

    def extra_repr(self) -> str:
        match = ", norm-matched" if self.norm_match else ""
        return f"{super().extra_repr()}, {self.distribution} K={self.code_width}, code_seed={self.code_seed}{match}"


class LowRankLearnedInput(InputInterface):
    """A trainable K-dim vector per token, tiled to d exactly like the binary codes (V x K parameters).

    ``init="binary"`` (default) starts every vector at the token's 0/1 binary code, so the model
    starts where binary16 does and differs only in being allowed to move; ``init="normal"`` draws
    N(0, init_std^2).
    """

    def __init__(
        self,
        vocab_size: int,
        d_model: int,
        code_width: int | None = None,
        init: str = "binary",
        init_std: float = 0.02,
    ) -> None:
        super().__init__(vocab_size, d_model)
        width = minimal_code_width(vocab_size) if code_width is None else code_width
        if not minimal_code_width(vocab_size) <= width <= d_model:
            raise ValueError(f"code_width must lie in [{minimal_code_width(vocab_size)}, {d_model}], got {width}")
        if init not in ("binary", "normal") or init_std <= 0:
            raise ValueError(f"init must be 'binary' or 'normal' and init_std > 0, got {init!r}, {init_std}")
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

    def table(self) -> torch.Tensor:
        return tile(self.weight.detach(), self.d_model)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, K={self.code_width}, init={self.init}"


class NormMatchedLearnedInput(LearnedInput):
    """A learned V x d table whose output rows are rescaled to the norm of the id's 0/1 binary code.

    The direction is learned, the length is the fixed codes' (sqrt(popcount x d/K)); token 0's
    target norm is 0, so it maps to the zero vector as with the binary codes (and its row gets no
    gradient). Separates "learned" from "input scale".
    """

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        rows = super().forward(ids)
        target = binary_code_norm(ids, self.vocab_size, self.d_model).to(rows.dtype)
        return rows * (target / rows.norm(dim=-1).clamp_min(1e-12)).unsqueeze(-1)

    def expected_norm(self, ids: torch.Tensor) -> torch.Tensor:
        return binary_code_norm(ids, self.vocab_size, self.d_model)

    def table(self) -> torch.Tensor:
        with torch.no_grad():
            return self.forward(torch.arange(self.vocab_size, device=self.weight.device))


def _fingerprint(table: torch.Tensor) -> torch.Tensor:
    """Two float64 numbers that change if any entry of a random code table does."""
    rows = torch.arange(1, table.shape[0] + 1, dtype=torch.float64)
    return torch.stack([table.double().pow(2).sum(), (table.double().sum(-1) * rows).sum()])
