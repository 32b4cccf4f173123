"""What a data source reads of the data module that owns it: its settings, and the tokenizer
they name."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from tokenizers import Tokenizer


class SourceSettings(Protocol):
    hparams: Mapping[
        str, Any
    ]  # the data module's __init__ arguments, by name (``data.<name>`` in a config)
    seed: int
    seq_len: int
    batch_size: int
    num_workers: int

    tokenizer_path: str
    tokenizer: Tokenizer
