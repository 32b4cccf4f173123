"""``fixed-embed fit|validate|test``: LightningCLI over LanguageModel and TextDataModule."""

from __future__ import annotations

import sys

from lightning.pytorch.cli import LightningCLI

from fixed_embed.config import expand_config_args
from fixed_embed.data import TextDataModule
from fixed_embed.module import LanguageModel


class FixedEmbedCLI(LightningCLI):
    """LightningCLI whose ``--config`` files may compose a ``__base__``."""

    def __init__(self, args: list[str] | None = None, run: bool = True) -> None:
        super().__init__(
            LanguageModel,
            TextDataModule,
            save_config_kwargs={"overwrite": True},
            auto_configure_optimizers=False,
            args=None if args is None else expand_config_args(args),
            run=run,
        )


def run(argv: list[str]) -> int:
    # LightningCLI reads sys.argv; hand it the composed configs.
    sys.argv = [sys.argv[0], *expand_config_args(argv)]
    FixedEmbedCLI()
    return 0
