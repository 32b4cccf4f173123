"""Input interfaces (``ids[B, T] -> x[B, T, d_model]``): the paper's in :mod:`.paper`, the controls in :mod:`.controls`
(docs/controls.md); configs and checkpoints name each by this package, whichever file defines it."""
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
