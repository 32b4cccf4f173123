"""The exact resume state of one ``PackedBlocks`` reader, and its checkpoint form (ints, lists,
tensors). Checkpoints hold these keys: a key may be added (read with a default), never renamed
or dropped."""

from __future__ import annotations

import copy
import random
from dataclasses import dataclass, field, fields
from typing import Any

import torch

from fixed_embed.errors import CheckpointError

# States without a layout (one global document index) resume only from a single-file source, where
# both agree.
_STATE_LAYOUT = 2


@dataclass
class PackingStats:
    """What this reader has read since its stream started or resumed (not saved)."""

    documents: int = 0
    empty_documents: int = 0
    replaced_characters: int = 0
    blocks: int = 0
    rows_read: int = (
        0  # documents pulled from the source, own or not (what the reader downloads and parses)
    )


@dataclass
class ReaderState:
    epoch: int = 0
    source_shards: int | None = None  # how many shards the source had (checked on resume)
    source_shard: int = 0  # the source shard of the current tokenization batch
    source_state: dict | None = (
        None  # datasets' state of that shard's stream at the start of the batch
    )
    source_doc_index: int = 0  # index of that batch's first document within its source shard
    doc_in_batch: int = 0  # documents of that batch already fully packed
    blocks_from_doc: int = 0  # blocks already cut from the document being packed
    carry_at_doc: list[int] = field(default_factory=list)  # its shard's carry before that document
    carries: dict[int, list[int]] = field(default_factory=dict)
    buffer: list[torch.Tensor] = field(default_factory=list)
    rng_state: Any = None
    blocks_delivered: int = 0
    flushing: bool = False  # a one-pass stream is emptying its (already shuffled) buffer
    stats: PackingStats = field(default_factory=PackingStats)


# Saved as they are: every field but these, converted (to tensors and back) or, the stats, not
# saved.
_CONVERTED = ("source_shards", "carry_at_doc", "carries", "buffer", "rng_state", "stats")
_PLAIN = [f.name for f in fields(ReaderState) if f.name not in _CONVERTED]


def state_to_dict(
    state: ReaderState, fingerprint: str, reader: int, readers: int, block_len: int
) -> dict[str, Any]:
    """The checkpoint form of ``state``; ``fingerprint``: the stream's settings, as JSON."""
    return {
        "fingerprint": fingerprint,
        "layout": _STATE_LAYOUT,
        "reader": [reader, readers],
        "source_shards": state.source_shards,
        **{name: copy.deepcopy(getattr(state, name)) for name in _PLAIN},
        "carry_at_doc": torch.tensor(state.carry_at_doc, dtype=torch.int64),
        "carries": {str(k): torch.tensor(v, dtype=torch.int64) for k, v in state.carries.items()},
        "buffer": torch.stack(state.buffer)
        if state.buffer
        else torch.empty(0, block_len, dtype=torch.int64),
        "rng_state": None if (rng := state.rng_state) is None else [rng[0], list(rng[1]), rng[2]],
    }


def restore_state(
    saved: dict | None, reader: int, source_shards: int, seed: int, source_path: str
) -> ReaderState:
    """The state to start from: a fresh one (RNG seeded by ``seed`` and the reader) or
    ``saved``'s."""
    if saved is None:
        return ReaderState(
            source_shards=source_shards, rng_state=random.Random(f"{seed}/{reader}").getstate()
        )
    if saved.get("layout") is None and source_shards != 1:
        raise CheckpointError(
            "refusing to resume: the checkpoint's data state predates per-file sharding and can "
            "only be "
            f"resumed from a single-file source; {source_path} has {source_shards} shards"
        )
    if (saved_shards := saved.get("source_shards")) not in (None, source_shards):
        raise CheckpointError(
            f"refusing to resume: {source_path} had {saved_shards} shards (files) when the "
            "checkpoint "
            f"was written and has {source_shards} now"
        )
    rng = saved["rng_state"] or random.Random().getstate()
    return ReaderState(
        source_shards=source_shards,
        **{
            name: saved.get(name, getattr(ReaderState, name)) for name in _PLAIN
        },  # a key added later: its default
        carry_at_doc=saved["carry_at_doc"].tolist(),
        carries={int(k): v.tolist() for k, v in saved["carries"].items()},
        buffer=list(saved["buffer"].unbind(0)),
        rng_state=(rng[0], tuple(rng[1]), rng[2]),
        # a "stats" entry, which some saved states hold, is ignored: the counts restart with each
        # stream
    )
