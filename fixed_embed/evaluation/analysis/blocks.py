"""Token blocks for analysis: documents -> tokens (+ end-of-text between documents) -> [N, T + 1] blocks."""

from __future__ import annotations

import torch
from tokenizers import Tokenizer

from fixed_embed.data.corpus import default_corpus
from fixed_embed.data.sources import DocumentSource
from fixed_embed.data.tokenizer import EOS, special_token_id


def text_blocks(
    tokenizer: Tokenizer, n_blocks: int, seq_len: int, source: str | None = None, text_field: str = "text"
) -> torch.Tensor:
    """The first ``n_blocks`` blocks of ``seq_len + 1`` tokens of ``source`` (a DocumentSource; default: held-out)."""
    path = source if source is not None else str(default_corpus() / "valid.jsonl")
    eos = special_token_id(tokenizer, EOS)
    needed = n_blocks * (seq_len + 1)
    tokens: list[int] = []
    for row in DocumentSource(path, text_field=text_field).open():
        tokens.extend(tokenizer.encode(row[text_field], add_special_tokens=False).ids)
        tokens.append(eos)
        if len(tokens) >= needed:
            break
    if len(tokens) < needed:
        raise ValueError(f"{path} holds {len(tokens):,} tokens; {n_blocks} blocks of {seq_len + 1} need {needed:,}")
    return torch.tensor(tokens[:needed]).view(n_blocks, seq_len + 1)
