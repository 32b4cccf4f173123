"""Input interfaces: what the decoder sees for each token id (``ids[B, T] -> x[B, T, d_model]``).

Built from ``(vocab_size, d_model, **options)`` and chosen in a YAML by class path
(``class_path: fixed_embed.interfaces.GF2CodeInput``, ``init_args: {code_seed: 12345}``): configs and
checkpoints name every class by this package, whichever file defines it. The paper's three are in
:mod:`.paper`, the controls in :mod:`.controls` (docs/controls.md); token 0 is the all-zero code on
purpose (docs/design.md, "Token 0 is the all-zero code").
"""
# ruff: noqa: F401  (re-exports)

from fixed_embed.interfaces.base import InputInterface
from fixed_embed.interfaces.controls import (
    LowRankLearnedInput,
    NormMatchedLearnedInput,
    PermutedCodeInput,
    RandomCodeInput,
)
from fixed_embed.interfaces.paper import BinaryCodeInput, GF2CodeInput, LearnedInput
from fixed_embed.interfaces.tiling import binary_code_norm
