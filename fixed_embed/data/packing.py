"""Tokenize streamed documents, pack them into fixed blocks, shard, shuffle, and resume exactly.

Packing: each document becomes ``[BOS] + tokens + [EOS]`` and is appended to a running
buffer cut into blocks of ``seq_len + 1`` tokens (inputs = block[:-1], targets = block[1:]),
so every block has exactly ``seq_len`` targets and no padding; the remainder carries over.

Sharding: document ``i`` belongs to virtual shard ``i % num_shards``, and each virtual shard
packs its own documents. The virtual shards are dealt out to the ``world_size x num_workers``
readers (reader ``r`` owns shards ``v`` with ``v % readers == r``). Blocks therefore depend
only on ``num_shards``: any number of ranks and workers (up to ``num_shards``) yields exactly
the same set of blocks as one process -- disjoint and complete. Every reader scans the document
stream but tokenizes only its own documents.

Resume: the state (source position at the last tokenization batch, the document and block
reached within it, every carry, the shuffle buffer and its RNG) is small and exact, so a resumed
stream continues with the first block not yet delivered -- across any number of resumes.
"""

from __future__ import annotations

import copy
import hashlib
import json
import random
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils.data import IterableDataset, get_worker_info

from fixed_embed.data.sources import DocumentSource
from fixed_embed.data.tokenizer import load_tokenizer

__all__ = ["PackedBlocks", "PackingStats", "is_held_out"]


def is_held_out(text: str, per_mille: int) -> bool:
    """Hash-based document hold-out: the same documents on every machine and run."""
    return per_mille > 0 and int(hashlib.sha256(text.encode("utf-8", "replace")).hexdigest()[:8], 16) % 1000 < per_mille


@dataclass
class PackingStats:
    documents: int = 0
    empty_documents: int = 0
    replaced_characters: int = 0
    tokens: int = 0
    blocks: int = 0


@dataclass
class _ReaderState:
    epoch: int = 0
    source_state: dict | None = None  # datasets' state at the start of the current tokenization batch
    source_doc_index: int = 0  # global index of that batch's first document
    doc_in_batch: int = 0  # documents of that batch already fully packed
    blocks_from_doc: int = 0  # blocks already cut from the document being packed
    carry_at_doc: list[int] = field(default_factory=list)  # its shard's carry before that document
    carries: dict[int, list[int]] = field(default_factory=dict)
    buffer: list[torch.Tensor] = field(default_factory=list)
    rng_state: Any = None
    blocks_delivered: int = 0
    stats: PackingStats = field(default_factory=PackingStats)


class PackedBlocks(IterableDataset):
    """An endless (or, with ``epochs=1``, one-pass) stream of packed ``LongTensor[seq_len + 1]`` blocks."""

    def __init__(
        self,
        source: DocumentSource,
        tokenizer: str,
        seq_len: int,
        eos_id: int,
        bos_id: int | None = None,
        num_shards: int = 64,
        shuffle_buffer: int = 256,
        seed: int = 0,
        rank: int = 0,
        world_size: int = 1,
        epochs: int | None = None,
        holdout_per_mille: int = 0,
        keep: str = "train",
        tokenize_batch: int = 64,
        length: int | None = None,
    ) -> None:
        if seq_len < 1:
            raise ValueError(f"seq_len must be >= 1, got {seq_len}")
        if num_shards < 1 or shuffle_buffer < 0 or tokenize_batch < 1:
            raise ValueError(
                f"num_shards ({num_shards}) and tokenize_batch ({tokenize_batch}) must be >= 1, "
                f"shuffle_buffer ({shuffle_buffer}) >= 0"
            )
        if keep not in ("train", "held_out"):
            raise ValueError(f"keep must be 'train' or 'held_out', got {keep!r}")
        self.source, self.tokenizer_spec, self.seq_len = source, tokenizer, seq_len
        self.eos_id, self.bos_id = eos_id, bos_id
        self.num_shards, self.shuffle_buffer, self.seed = num_shards, shuffle_buffer, seed
        self.rank, self.world_size, self.epochs = rank, world_size, epochs
        self.holdout_per_mille, self.keep, self.tokenize_batch = holdout_per_mille, keep, tokenize_batch
        self.length = length
        self._state: _ReaderState | None = None
        self._pending_state: dict | None = None

    def __len__(self) -> int:
        # A length lets Lightning skip its one-batch look-ahead, which would otherwise make the
        # saved loader state one batch too far.
        if self.length is None:
            raise TypeError("this PackedBlocks stream has no length")
        return self.length

    # -- identity -------------------------------------------------------------------------

    def config_fingerprint(self) -> dict[str, Any]:
        """What must match for a saved state to be resumed (refused otherwise)."""
        return {
            "source": self.source.fingerprint(),
            "tokenizer": self.tokenizer_spec,
            "seq_len": self.seq_len,
            "eos_id": self.eos_id,
            "bos_id": self.bos_id,
            "num_shards": self.num_shards,
            "shuffle_buffer": self.shuffle_buffer,
            "seed": self.seed,
            "holdout_per_mille": self.holdout_per_mille,
            "keep": self.keep,
            "tokenize_batch": self.tokenize_batch,
        }

    def _reader(self) -> tuple[int, int]:
        info = get_worker_info()
        workers, worker = (info.num_workers, info.id) if info else (1, 0)
        readers = self.world_size * workers
        if readers > self.num_shards:
            raise ValueError(
                f"{self.world_size} ranks x {workers} workers = {readers} readers exceed num_shards = "
                f"{self.num_shards}; raise data.num_shards so every reader owns at least one shard"
            )
        return self.rank * workers + worker, readers

    # -- state ----------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        reader, readers = self._reader()
        state = self._state or _ReaderState()
        return {
            "fingerprint": json.dumps(self.config_fingerprint(), sort_keys=True),
            "reader": [reader, readers],
            "epoch": state.epoch,
            "source_state": copy.deepcopy(state.source_state),
            "source_doc_index": state.source_doc_index,
            "doc_in_batch": state.doc_in_batch,
            "blocks_from_doc": state.blocks_from_doc,
            "carry_at_doc": torch.tensor(state.carry_at_doc, dtype=torch.int64),
            "carries": {str(k): torch.tensor(v, dtype=torch.int64) for k, v in state.carries.items()},
            "buffer": torch.stack(state.buffer)
            if state.buffer
            else torch.empty(0, self.seq_len + 1, dtype=torch.int64),
            "rng_state": _rng_to_list(state.rng_state),
            "blocks_delivered": state.blocks_delivered,
            "stats": vars(state.stats).copy(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        expected = json.dumps(self.config_fingerprint(), sort_keys=True)
        if state["fingerprint"] != expected:
            raise ValueError(
                "refusing to resume: the checkpoint's data stream was made with a different configuration.\n"
                f"  checkpoint: {state['fingerprint']}\n  now:        {expected}"
            )
        self._pending_state = state

    def _restore(self, reader: int, readers: int) -> _ReaderState:
        saved, self._pending_state = self._pending_state, None
        if saved is None:
            state = _ReaderState()
            state.rng_state = random.Random(f"{self.seed}/{reader}").getstate()
            return state
        if saved["reader"] != [reader, readers]:
            raise ValueError(
                f"refusing to resume: the checkpoint was written by reader {saved['reader'][0]} of "
                f"{saved['reader'][1]} but this is reader {reader} of {readers} (devices or num_workers changed)"
            )
        return _ReaderState(
            epoch=saved["epoch"],
            source_state=saved["source_state"],
            source_doc_index=saved["source_doc_index"],
            doc_in_batch=saved["doc_in_batch"],
            blocks_from_doc=saved["blocks_from_doc"],
            carry_at_doc=saved["carry_at_doc"].tolist(),
            carries={int(k): v.tolist() for k, v in saved["carries"].items()},
            buffer=list(saved["buffer"].unbind(0)),
            rng_state=_rng_from_list(saved["rng_state"]),
            blocks_delivered=saved["blocks_delivered"],
            stats=PackingStats(**saved["stats"]),
        )

    @property
    def stats(self) -> PackingStats:
        return self._state.stats if self._state else PackingStats()

    # -- the stream -----------------------------------------------------------------------

    def __iter__(self) -> Iterator[torch.Tensor]:
        reader, readers = self._reader()
        state = self._state = self._restore(reader, readers)
        tokenizer = load_tokenizer(self.tokenizer_spec)
        rng = random.Random()
        rng.setstate(state.rng_state)
        block_len = self.seq_len + 1
        while self.epochs is None or state.epoch < self.epochs:
            produced_before = state.stats.blocks
            for owned in self._owned_batches(reader, readers, state):
                encodings = tokenizer.encode_batch([text for _, text in owned], add_special_tokens=False)
                for position, ((shard, _), encoding) in enumerate(zip(owned, encodings, strict=True)):
                    if position < state.doc_in_batch:
                        continue  # packed before the checkpoint
                    resumed_mid_doc = state.blocks_from_doc > 0
                    if not resumed_mid_doc:
                        state.carry_at_doc = state.carries.get(shard, [])
                        state.stats.documents += 1
                        state.stats.tokens += len(encoding.ids)
                    tokens = state.carry_at_doc + ([self.bos_id] if self.bos_id is not None else [])
                    tokens += [*encoding.ids, self.eos_id]
                    n_blocks = len(tokens) // block_len
                    for b in range(state.blocks_from_doc, n_blocks):
                        block = torch.tensor(tokens[b * block_len : (b + 1) * block_len], dtype=torch.int64)
                        state.blocks_from_doc = b + 1
                        state.stats.blocks += 1
                        out = self._shuffle(block, state, rng)
                        if out is not None:
                            state.rng_state = rng.getstate()
                            state.blocks_delivered += 1
                            yield out
                    state.carries[shard] = tokens[n_blocks * block_len :]
                    state.doc_in_batch, state.blocks_from_doc = position + 1, 0
                state.doc_in_batch = 0
            if state.stats.blocks == produced_before and state.blocks_from_doc == 0:
                raise ValueError(
                    f"reader {reader} of {readers} got no block from a whole pass over {self.source.path}: "
                    f"the corpus is too small for seq_len {self.seq_len} and {self.num_shards} shards"
                )
            state.epoch += 1
            state.source_state = None
        # one-pass streams (validation) flush what the buffer still holds, in a seeded order
        rng.shuffle(state.buffer)
        while state.buffer:
            state.blocks_delivered += 1
            yield state.buffer.pop()

    def _shuffle(self, block: torch.Tensor, state: _ReaderState, rng: random.Random) -> torch.Tensor | None:
        if self.shuffle_buffer == 0:
            return block
        if len(state.buffer) < self.shuffle_buffer:
            state.buffer.append(block)
            return None
        index = rng.randrange(self.shuffle_buffer)
        out, state.buffer[index] = state.buffer[index], block
        return out

    def _owned_batches(self, reader: int, readers: int, state: _ReaderState):
        """Yield this reader's documents as ``[(shard, text), ...]`` per tokenization batch, resumably.

        Before each batch is handed out, ``state`` records where the batch starts in the source.
        """
        ds = self.source.open()
        restored = state.source_state
        if restored is not None:
            ds.load_state_dict(restored)
        doc_index = state.source_doc_index if restored is not None else 0
        field_name = self.source.text_field
        # ds.iter(), not iter(ds): inside a DataLoader worker, iter(ds) silently reads only that
        # worker's share of the files, which would break the global document numbering.
        batches = ds.iter(batch_size=self.tokenize_batch)
        while True:
            # Right after load_state_dict, datasets reports the *initial* state until the first row
            # is read (datasets issue #8308): a second resume would restart the stream. Use the
            # loaded state itself for the first batch.
            start_state = copy.deepcopy(restored if restored is not None else ds.state_dict())
            start_index, restored = doc_index, None
            batch = next(batches, None)
            if batch is None:
                return
            if field_name not in batch:
                raise KeyError(f"text field {field_name!r} not found; fields are {sorted(batch)}")
            owned: list[tuple[int, str]] = []
            for text in batch[field_name]:
                index, doc_index = doc_index, doc_index + 1
                shard = index % self.num_shards
                if shard % readers != reader:
                    continue
                if not isinstance(text, str) or not text.strip():
                    state.stats.empty_documents += 1
                    continue
                if is_held_out(text, self.holdout_per_mille) != (self.keep == "held_out"):
                    continue
                state.stats.replaced_characters += text.count("\ufffd")
                owned.append((shard, text))
            state.source_state, state.source_doc_index = start_state, start_index
            yield owned


def _rng_to_list(rng_state: Any) -> list | None:
    if rng_state is None:
        return None
    version, internal, gauss = rng_state
    return [version, list(internal), gauss]


def _rng_from_list(saved: list | None) -> Any:
    if saved is None:
        return random.Random().getstate()
    version, internal, gauss = saved
    return (version, tuple(internal), gauss)
