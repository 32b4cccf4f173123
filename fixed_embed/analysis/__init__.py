"""Analyses of trained models: where token identity lives across depth, and what each block is worth.

- :mod:`.probe`: linear probes that recover each token's id bits from every layer's hidden state.
- :mod:`.ablation`: the loss increase when one block at a time is removed (zero) or replaced by
  its mean contribution.
- :mod:`.blocks`: held-out text packed into token blocks with a checkpoint's tokenizer.

Each returns plain dicts (JSON-ready) and has a plot; ``fixed-embed analyze`` writes both.
"""

from fixed_embed.analysis.ablation import layer_ablation
from fixed_embed.analysis.blocks import text_blocks
from fixed_embed.analysis.probe import identity_probe

__all__ = ["identity_probe", "layer_ablation", "text_blocks"]
