"""Input interfaces: what the decoder sees for each token id.

Every interface maps ``ids: LongTensor[B, T]`` to ``FloatTensor[B, T, d_model]`` and is built
from ``(vocab_size, d_model, **options)``, so an experiment YAML selects one by class path::

    interface:
      class_path: fixed_embed.interfaces.GF2CodeInput
      init_args: {code_seed: 12345}

* :class:`LearnedInput` -- the control: a trainable V x d table.
* :class:`BinaryCodeInput` -- the id's K = ceil(log2 V) little-endian bits, values 0/1,
  tiled (repeated) to d_model. Nothing trainable, no projection, no V x d table: codes are
  computed from the ids with bitwise ops on the ids' device.
* :class:`GF2CodeInput` -- the same, after a fixed invertible affine map over GF(2):
  code = A bits(id) xor b, A drawn from ``code_seed`` with a platform-stable generator.

Controls the paper leaves open (each separates one property of the fixed codes):

* ``bipolar=True`` on the binary interfaces -- values -1/+1 instead of 0/1: the input is
  centred, every code has norm sqrt(d), and token 0 is no longer the zero vector.
* :class:`PermutedCodeInput` -- a random injective id -> K-bit code assignment (not linear
  over GF(2)): "which assignment" beyond the GF(2) family.
* :class:`RandomCodeInput` -- fixed random *continuous* codes (Gaussian or uniform), K-dim
  tiled or full d, optionally norm-matched to the binary codes: fixed, but not binary.
* :class:`LowRankLearnedInput` -- a *trainable* K-dim vector per token, tiled like the binary
  codes (initialised at the binary code by default): the codes' geometry, but learned.
* :class:`NormMatchedLearnedInput` -- a full learned table whose rows are rescaled to the
  binary codes' norms: learned, but with the fixed codes' input scale.

Token 0 and the all-zero code
-----------------------------
With the paper's codes, id 0 (``<|endoftext|>`` in SmolLM2, i.e. every document boundary)
is the all-zero vector; a linear GF(2) map keeps it at zero (A 0 = 0). We keep that on
purpose -- it *is* the paper's interface and the zero vector is still a distinct code. The
decoder is built to take it: RMSNorm computes x / sqrt(mean(x^2) + eps), which is exactly 0
(not NaN) for x = 0, with a finite gradient 1/sqrt(eps); the attention and SwiGLU layers are
bias-free, so a zero input contributes nothing and the position's residual stream is filled
only by attention to earlier tokens. A sequence made only of token 0 yields finite (uniform)
logits and finite gradients; ``tests/test_interfaces.py`` checks it. To move token 0 off the
origin, give :class:`GF2CodeInput` a non-zero ``offset`` (an affine recoding).
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from fixed_embed.codes import (
    bits_of,
    decode_bits,
    gf2_apply,
    gf2_inverse,
    matrix_from_rows,
    random_injection,
    random_invertible_gf2,
    rows_from_matrix,
)
from fixed_embed.codes import (
    code_width as minimal_code_width,
)

__all__ = [
    "BinaryCodeInput",
    "GF2CodeInput",
    "InputInterface",
    "LearnedInput",
    "LowRankLearnedInput",
    "NormMatchedLearnedInput",
    "PermutedCodeInput",
    "RandomCodeInput",
    "binary_code_norm",
    "tile",
    "tiled_norm",
]


def tile(x: torch.Tensor, d_model: int) -> torch.Tensor:
    """Repeat the last dimension (K) until it is ``d_model`` long; the last copy is truncated."""
    reps = math.ceil(d_model / x.shape[-1])
    tiled = x.repeat(*([1] * (x.dim() - 1)), reps)
    return tiled[..., :d_model] if tiled.shape[-1] != d_model else tiled


def tiled_norm(x: torch.Tensor, d_model: int) -> torch.Tensor:
    """The L2 norm of ``tile(x, d_model)`` over the last dimension, without materialising it."""
    reps, rem = divmod(d_model, x.shape[-1])
    squares = x.double().pow(2)
    return (reps * squares.sum(-1) + squares[..., :rem].sum(-1)).sqrt().float()


def binary_code_norm(ids: torch.Tensor, vocab_size: int, d_model: int) -> torch.Tensor:
    """The norm of the paper's 0/1 binary code of each id (K = ceil(log2 V)), tiled to d_model."""
    return tiled_norm(bits_of(ids.to(torch.int64), minimal_code_width(vocab_size)), d_model)


class InputInterface(nn.Module):
    """Base class: ``forward(ids[B, T]) -> x[B, T, d_model]`` plus a cost report.

    Subclasses take ``vocab_size`` and ``d_model`` as their first two arguments, so the
    language model can build any of them from a YAML ``class_path`` + ``init_args``.
    """

    #: True when the interface has no trainable state (its output is a fixed function of the id).
    fixed: bool = False

    def __init__(self, vocab_size: int, d_model: int) -> None:
        super().__init__()
        if not isinstance(vocab_size, int) or vocab_size < 2:
            raise ValueError(f"vocab_size must be an integer >= 2, got {vocab_size!r}")
        if not isinstance(d_model, int) or d_model < 1:
            raise ValueError(f"d_model must be a positive integer, got {d_model!r}")
        self.vocab_size = vocab_size
        self.d_model = d_model

    @property
    def trainable_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters() if p.requires_grad)

    def flops_per_token(self) -> int:
        """Training FLOPs (forward + backward) per token. A lookup or a bit code does no multiply-adds."""
        return 0

    def expected_norm(self, ids: torch.Tensor) -> torch.Tensor:
        """The L2 norm each id's output vector should have (shape of ``ids``)."""
        raise NotImplementedError

    def spec(self) -> dict[str, Any]:
        """``{"class_path", "init_args"}`` that rebuilds this interface (vocab_size and d_model excluded).

        Every option of ``__init__`` is kept as an attribute of the same name, so the spec is the
        signature read back -- a new interface gets it for free.
        """
        cls = type(self)
        names = list(inspect.signature(cls.__init__).parameters)[3:]  # self, vocab_size, d_model
        return {"class_path": f"{cls.__module__}.{cls.__qualname__}", "init_args": {n: getattr(self, n) for n in names}}

    def check_ids(self, ids: torch.Tensor) -> None:
        """Reject non-integer or out-of-vocabulary ids instead of silently encoding them."""
        if ids.dtype.is_floating_point or ids.dtype.is_complex or ids.dtype == torch.bool:
            raise TypeError(f"token ids must be an integer tensor, got dtype {ids.dtype}")
        if ids.device.type == "meta" or ids.numel() == 0:
            return
        if ids.device.type == "cuda":
            # No host sync on the hot path: the check fails asynchronously on the device.
            torch._assert_async(((ids >= 0) & (ids < self.vocab_size)).all())
            return
        lo, hi = int(ids.min()), int(ids.max())
        if lo < 0 or hi >= self.vocab_size:
            raise ValueError(f"token ids must lie in [0, {self.vocab_size - 1}], got min {lo} and max {hi}")

    def _verify_stored(self, state_dict: dict, prefix: str, name: str, expected, what: str) -> None:
        """Refuse a checkpoint whose stored buffer ``name`` differs from what this interface's options give.

        The options (seed, matrix) define the code used; a checkpoint trained with another code
        would otherwise be run with a different id -> vector assignment than it learned.
        """
        stored = state_dict.get(prefix + name)
        if stored is None or stored.device.type == "meta":
            return
        reference = expected()
        if not torch.allclose(stored.detach().cpu().to(reference.dtype), reference.cpu(), rtol=1e-9, atol=0):
            raise ValueError(f"the checkpoint's {name} differs from the one {what} gives")

    def extra_repr(self) -> str:
        return f"vocab_size={self.vocab_size}, d_model={self.d_model}"


class LearnedInput(InputInterface):
    """A trainable V x d embedding table, initialised N(0, init_std^2)."""

    def __init__(self, vocab_size: int, d_model: int, init_std: float = 0.02) -> None:
        super().__init__(vocab_size, d_model)
        if init_std <= 0:
            raise ValueError(f"init_std must be > 0, got {init_std}")
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

    def table(self) -> torch.Tensor:
        """The V x d matrix this interface computes (for export)."""
        return self.weight.detach()


class BinaryCodeInput(InputInterface):
    """The id's K-bit little-endian code (values 0/1), tiled to ``d_model``; nothing trainable.

    Element ``j`` of the output is bit ``j mod K`` of the code, so d = 2048, K = 16 gives
    128 copies; when d is not a multiple of K the last copy is truncated. ``code_width``
    defaults to ceil(log2 V) (16 for V = 49,152); a wider code may be asked for.
    ``bipolar=True`` writes the bits as -1/+1 (2 b - 1) instead of 0/1.
    """

    fixed = True

    def __init__(self, vocab_size: int, d_model: int, code_width: int | None = None, bipolar: bool = False) -> None:
        super().__init__(vocab_size, d_model)
        minimal = minimal_code_width(vocab_size)
        width = minimal if code_width is None else code_width
        if width < minimal:
            raise ValueError(
                f"vocab_size {vocab_size} needs {minimal} bits but code_width={width} "
                f"holds only 2^{width} = {2**width} codes"
            )
        if width > 62:
            raise ValueError(f"code_width must be <= 62 (int64 codes), got {width}")
        if d_model < width:
            raise ValueError(f"d_model ({d_model}) must be >= the code width K = {width} so every bit is seen")
        self.code_width = width
        self.bipolar = bool(bipolar)

    def encode(self, ids: torch.Tensor) -> torch.Tensor:
        """Integer code of each id (the identity here; recodings override it)."""
        return ids.to(torch.int64)

    def decode_codes(self, codes: torch.Tensor) -> torch.Tensor:
        """Inverse of :meth:`encode`."""
        return codes.to(torch.int64)

    def bits(self, ids: torch.Tensor) -> torch.Tensor:
        """The K-bit code of each id: ``ids.shape + (K,)``, int64 0/1, element 0 = least significant bit."""
        return bits_of(self.encode(ids), self.code_width)

    def decode(self, bits: torch.Tensor) -> torch.Tensor:
        """Ids from K-bit codes (last dim K): the inverse of :meth:`bits`."""
        if bits.shape[-1] != self.code_width:
            raise ValueError(f"expected codes with last dim K = {self.code_width}, got shape {tuple(bits.shape)}")
        return self.decode_codes(decode_bits(bits))

    def values(self, ids: torch.Tensor) -> torch.Tensor:
        """The K code values of each id: the bits (0/1), or 2 bits - 1 (-1/+1) when bipolar."""
        code = self.bits(ids).to(torch.get_default_dtype())
        return 2 * code - 1 if self.bipolar else code

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        self.check_ids(ids)
        return tile(self.values(ids), self.d_model)

    def expected_norm(self, ids: torch.Tensor) -> torch.Tensor:
        """0/1: sqrt(popcount(code) * floor(d/K) + popcount of the truncated copy's bits); -1/+1: sqrt(d)."""
        return tiled_norm(self.values(ids), self.d_model)

    def table(self) -> torch.Tensor:
        """The V x d matrix this interface computes, materialised (for export only)."""
        return self.forward(torch.arange(self.vocab_size, device=self._device()))

    def _device(self) -> torch.device:
        buffer = next(self.buffers(), None)
        return buffer.device if buffer is not None else torch.device("cpu")

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, code_width={self.code_width}" + (", bipolar" if self.bipolar else "")


class GF2CodeInput(BinaryCodeInput):
    """Binary code after a fixed invertible affine map over GF(2): code = A bits(id) xor b, then tiled.

    ``A`` is drawn from ``code_seed`` (the paper: 12345) by rejection sampling from a SHA-256
    stream, so a seed names the same matrix everywhere; or pass ``matrix`` (K x K of 0/1)
    explicitly. ``offset`` b is a K-bit mask (an int, or K 0/1 values, element 0 first); the
    paper uses 0. Identity is preserved: :meth:`decode` inverts the map exactly.
    """

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
        if matrix is None:
            rows = random_invertible_gf2(width, code_seed)
        else:
            rows = rows_from_matrix(matrix)
            if len(rows) != width:
                raise ValueError(
                    f"matrix must be K x K = {width} x {width} for vocab_size {vocab_size}, got {len(rows)} rows"
                )
        self.code_seed = code_seed
        self.matrix = [list(map(int, r)) for r in matrix] if matrix is not None else None
        self._rows = rows
        self._inverse_rows = gf2_inverse(rows, width)  # raises for a singular matrix
        self._offset = _offset_mask(offset, width)
        # Persistent, so a checkpoint records the exact assignment it was trained with.
        self.register_buffer("code_matrix", matrix_from_rows(rows, width), persistent=True)
        self.register_buffer("rows", torch.empty(width, dtype=torch.int64), persistent=False)
        self.register_buffer("inverse_rows", torch.empty(width, dtype=torch.int64), persistent=False)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """(Re)compute the buffers from the Python-held matrix, e.g. after meta-device init."""
        with torch.no_grad():
            self.code_matrix.copy_(matrix_from_rows(self._rows, self.code_width))
            self.rows.copy_(torch.tensor(self._rows, dtype=torch.int64))
            self.inverse_rows.copy_(torch.tensor(self._inverse_rows, dtype=torch.int64))

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs) -> None:
        source = f"code_seed={self.code_seed}" if self.matrix is None else "the explicit matrix"
        expected = lambda: matrix_from_rows(self._rows, self.code_width)  # noqa: E731
        self._verify_stored(state_dict, prefix, "code_matrix", expected, source)
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    @property
    def offset(self) -> int:
        """The K-bit offset b as an integer mask."""
        return self._offset

    def encode(self, ids: torch.Tensor) -> torch.Tensor:
        return gf2_apply(self.rows, ids) ^ self._offset

    def decode_codes(self, codes: torch.Tensor) -> torch.Tensor:
        return gf2_apply(self.inverse_rows, codes.to(torch.int64) ^ self._offset)

    def extra_repr(self) -> str:
        source = f"code_seed={self.code_seed}" if self.matrix is None else "explicit matrix"
        return f"{super().extra_repr()}, {source}, offset={self._offset:#x}"


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

    The table is drawn with torch's CPU generator from ``code_seed`` and rebuilt when loading, so
    checkpoints stay small; a fingerprint (persistent) makes a checkpoint refuse to load into a
    table drawn differently (e.g. by another torch version).
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


def _offset_mask(offset: int | Sequence[int], width: int) -> int:
    if isinstance(offset, bool):
        raise ValueError(f"offset must be an int mask or a list of {width} bits, got {offset!r}")
    if isinstance(offset, int):
        if not 0 <= offset < 2**width:
            raise ValueError(f"offset must be a {width}-bit mask in [0, {2**width - 1}], got {offset}")
        return offset
    bits = list(offset)
    if len(bits) != width:
        raise ValueError(f"offset must have K = {width} bits, got {len(bits)}")
    if any(b not in (0, 1) for b in bits):
        raise ValueError(f"offset bits must be 0 or 1, got {bits}")
    return sum(int(b) << i for i, b in enumerate(bits))
