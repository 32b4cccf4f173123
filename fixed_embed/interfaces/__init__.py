"""Input interfaces: what the decoder sees for each token id.

Each maps ``ids: LongTensor[B, T]`` to ``FloatTensor[B, T, d_model]``, is built from
``(vocab_size, d_model, **options)`` and is chosen in a YAML by class path::

    interface:
      class_path: fixed_embed.interfaces.GF2CodeInput
      init_args: {code_seed: 12345}

* :mod:`.base` -- :class:`InputInterface`: the contract, cost report, spec, id checks.
* :mod:`.tiling` -- repeating a K-dim code to d_model, and its norm.
* :mod:`.paper` -- the paper's three: :class:`LearnedInput` (a trainable V x d table),
  :class:`BinaryCodeInput` (the id's K = ceil(log2 V) little-endian bits, tiled) and
  :class:`GF2CodeInput` (the bits through a fixed invertible affine map over GF(2)).
* :mod:`.controls` -- what the paper leaves open, one property of the fixed codes each:
  :class:`PermutedCodeInput` (a non-linear assignment), :class:`RandomCodeInput` (fixed but
  continuous), :class:`LowRankLearnedInput` (the codes' geometry, learned),
  :class:`NormMatchedLearnedInput` (learned, at the codes' scale); ``bipolar=True`` on the
  binary interfaces centres the codes (-1/+1).

Configs and checkpoints name classes ``fixed_embed.interfaces.<Name>`` (see
:meth:`InputInterface.spec`), whichever file defines them.

Token 0 is the all-zero code of the paper's interfaces (a linear GF(2) map keeps it there), on
purpose: it is still a distinct code, and the decoder takes it -- RMSNorm of 0 is exactly 0 with a
finite gradient and the blocks are bias-free, so the position is filled by attention to earlier
tokens (``tests/test_interfaces.py``). A non-zero ``offset`` on :class:`GF2CodeInput` moves it.
"""

from fixed_embed.interfaces.base import InputInterface
from fixed_embed.interfaces.controls import (
    LowRankLearnedInput,
    NormMatchedLearnedInput,
    PermutedCodeInput,
    RandomCodeInput,
)
from fixed_embed.interfaces.paper import BinaryCodeInput, GF2CodeInput, LearnedInput
from fixed_embed.interfaces.tiling import binary_code_norm, tile, tiled_norm

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
