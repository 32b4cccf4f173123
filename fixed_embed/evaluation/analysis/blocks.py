"""Token blocks for analysis (documents -> tokens + end-of-text between them -> [N, T + 1]), run
in batches."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from tokenizers import Tokenizer

from fixed_embed.data.corpus import default_corpus
from fixed_embed.data.sources import DocumentSource
from fixed_embed.data.tokenizer import EOS, special_token_id
from fixed_embed.model.decoder import Decoder


def text_blocks(
    tokenizer: Tokenizer, n_blocks: int, seq_len: int, source: str | None = None
) -> torch.Tensor:
    """The first ``n_blocks`` blocks of ``seq_len + 1`` tokens of ``source`` (a DocumentSource;
    default: held-out)."""
    path = source if source is not None else str(default_corpus() / "valid.jsonl")
    eos = special_token_id(tokenizer, EOS)
    needed = n_blocks * (seq_len + 1)
    tokens: list[int] = []
    for row in DocumentSource(path).open():
        tokens.extend(tokenizer.encode(row["text"], add_special_tokens=False).ids)
        tokens.append(eos)
        if len(tokens) >= needed:
            break
    if len(tokens) < needed:
        raise ValueError(
            f"{path} holds {len(tokens):,} tokens; {n_blocks} blocks of {seq_len + 1} need "
            f"{needed:,}"
        )
    return torch.tensor(tokens[:needed]).view(n_blocks, seq_len + 1)


@torch.no_grad()
def per_batch(
    decoder: Decoder, blocks: torch.Tensor, batch_size: int, fn: Callable[[torch.Tensor], Any]
) -> list:
    """``fn`` of each batch of ``blocks``, moved to the decoder's device (the decoder has no
    layer that trains differently: no mode to set)."""
    device = next(decoder.parameters()).device
    return [
        fn(blocks[start : start + batch_size].to(device))
        for start in range(0, len(blocks), batch_size)
    ]
