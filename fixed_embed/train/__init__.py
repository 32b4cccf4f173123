"""Training: the LightningModule, resume decided in one place, and an experiment built from its
config."""
# ruff: noqa: F401  (re-exports)

from fixed_embed.train.module import LanguageModel
