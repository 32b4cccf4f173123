"""Validation blocks from every held-out document, and the bytes targets stand for
(docs/data.md, "Validation")."""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

import numpy as np
import torch
from lightning.pytorch.utilities import rank_zero_warn
from tokenizers import Tokenizer, decoders

from fixed_embed.errors import ConfigError


def spread_blocks(
    documents: Iterable[Sequence[int]], width: int, total: int, where: str
) -> torch.Tensor:
    """``total`` blocks of ``width`` tokens, an equal share (:func:`_shares`) from each of
    ``documents`` (each its ids + EOS) at evenly spaced positions; ``where``: their source."""
    blocks = (
        torch.from_numpy(np.asarray(ids[: len(ids) // width * width], dtype=np.int64))
        for ids in documents
    )
    documents = [b.view(-1, width) for b in blocks if len(b)]  # each document's blocks, [n, width]
    if not documents:
        raise ConfigError(f"no validation document of {where} holds a block of {width} tokens")
    if total < len(documents):
        raise ConfigError(
            f"data.val_per_document takes blocks from each of the {len(documents)} validation "
            "documents of "
            f"{where}: set data.val_sequences >= {len(documents)} (got {total})"
        )
    counts = _shares(total, [len(blocks) for blocks in documents])
    # the centres of k equal parts of each document: distinct positions because k <= n
    out = torch.cat(
        [
            b[[(2 * j + 1) * len(b) // (2 * k) for j in range(k)]]
            for b, k in zip(documents, counts, strict=True)
        ]
    )
    if len(out) < total:
        rank_zero_warn(
            f"validation: {len(out)} of the {total} blocks asked for: the {len(documents)} "
            "documents of "
            f"{where} hold no more"
        )
    return out


def _shares(total: int, available: list[int]) -> list[int]:
    """Blocks per document: equal shares (the first one more), a short document's rest handed on
    to the others."""
    counts, left = [0] * len(available), total
    while left > 0:
        open_ = [i for i, n in enumerate(available) if counts[i] < n]
        if not open_:
            break
        share, extra = divmod(left, len(open_))
        for rank, i in enumerate(open_):
            take = min(share + (rank < extra), available[i] - counts[i])
            counts[i] += take
            left -= take
    return counts


def token_bytes(tokenizer: Tokenizer) -> torch.Tensor:
    """UTF-8 bytes of each token id's text (0 for special tokens)."""
    size = tokenizer.get_vocab_size(with_added_tokens=True)
    special = {i for i, token in tokenizer.get_added_tokens_decoder().items() if token.special}
    byte_level = isinstance(tokenizer.decoder, decoders.ByteLevel)
    lengths = torch.zeros(size, dtype=torch.int64)
    for i in range(size):
        token = "" if i in special else tokenizer.id_to_token(i) or ""
        if byte_level:  # one vocabulary character per byte (GPT-2's byte-to-unicode map)
            lengths[i] = len(token)
        else:  # SentencePiece-style vocabularies: "▁" is a space, "<0xNN>" one byte
            is_byte = re.fullmatch("<0x..>", token)
            lengths[i] = 1 if is_byte else len(token.replace("\u2581", " ").encode("utf-8"))
    return lengths


def bytes_per_target(blocks: torch.Tensor, tokenizer: Tokenizer) -> float:
    """Mean UTF-8 bytes per prediction target (``blocks[:, 1:]``)."""
    targets = blocks[:, 1:]
    return float(token_bytes(tokenizer)[targets].sum()) / targets.numel()
