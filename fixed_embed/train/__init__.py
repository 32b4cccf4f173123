"""Training: the LightningModule, what a resume may change, and an experiment built from its
config."""
