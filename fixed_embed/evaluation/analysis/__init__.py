"""Analyses of trained models: where token identity lives across depth (:mod:`.probe`), and what each
block is worth (:mod:`.ablation`), on held-out token blocks (:mod:`.blocks`). ``fixed-embed analyze``
writes each one's JSON-ready dict and its plot."""
# ruff: noqa: F401  (re-exports)

from fixed_embed.evaluation.analysis.ablation import layer_ablation
from fixed_embed.evaluation.analysis.blocks import text_blocks
from fixed_embed.evaluation.analysis.probe import identity_probe
