"""Analyses of trained models: identity probes, layer ablation, held-out token blocks
(docs/controls.md)."""
# ruff: noqa: F401  (re-exports)

from fixed_embed.evaluation.analysis.ablation import layer_ablation
from fixed_embed.evaluation.analysis.blocks import text_blocks
from fixed_embed.evaluation.analysis.probe import identity_probe
