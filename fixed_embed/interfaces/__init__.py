"""Input interfaces: the paper's (.paper), the controls (.controls, docs/controls.md); configs
name them by package."""
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
