"""User errors: bad config, data, paths or checkpoints; the CLI prints their message without a traceback."""

from __future__ import annotations


class UserError(Exception):
    """A mistake in what the user gave (config, data, path, checkpoint): message says what and how to fix it."""


class ConfigError(UserError, ValueError):
    """A config value or command-line option that cannot work."""


class DataError(UserError, ValueError):
    """Data or a data-derived file (corpus, tokenizer) that is unusable as given."""


class MissingFileError(UserError, FileNotFoundError):
    """A path the user named that does not exist (or lacks the file it must hold)."""


class CheckpointError(UserError, ValueError):
    """A checkpoint that cannot be read or does not fit what it is used for."""
