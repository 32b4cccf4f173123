"""Tokenize streamed documents, pack ``tokens + [EOS]`` into ``seq_len + 1`` blocks (each
virtual shard with its own carry, no padding), shuffle, and resume exactly (state:
:mod:`fixed_embed.data.reader_state`)."""

from __future__ import annotations

import copy
import json
import random
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from tokenizers import Tokenizer
from torch.utils.data import IterableDataset, get_worker_info

from fixed_embed.data.reader_state import PackingStats, ReaderState, restore_state, state_to_dict
from fixed_embed.data.sharding import (
    document_cycle,
    is_held_out,
    reader_plan,
    virtual_shard_count,
    virtual_shard_of,
)
from fixed_embed.data.sources import DocumentSource
from fixed_embed.data.tokenizer import load_tokenizer
from fixed_embed.errors import DataError


@dataclass(eq=False)
class PackedBlocks(IterableDataset):
    """An endless (or, with ``epochs=1``, one-pass) stream of packed ``LongTensor[seq_len + 1]``
    blocks. ``num_shards``: virtual shards (:mod:`fixed_embed.data.sharding`); ``None``: one per
    reader."""

    source: DocumentSource
    tokenizer: str
    seq_len: int
    eos_id: int
    num_shards: int | None = 64
    shuffle_buffer: int = 256
    seed: int = 0
    rank: int = 0
    world_size: int = 1
    epochs: int | None = None
    holdout_per_mille: int = 0
    keep: str = "train"  # or "held_out": which side of the hash hold-out this stream reads
    tokenize_batch: int = 64
    length: int | None = None
    _state: ReaderState | None = field(default=None, init=False, repr=False)
    _pending_state: dict | None = field(default=None, init=False, repr=False)

    def __len__(self) -> int:
        # A length stops Lightning's one-batch look-ahead, which would save a loader state one
        # batch too far.
        if self.length is None:
            raise TypeError("this PackedBlocks stream has no length")
        return self.length

    def config_fingerprint(self) -> dict[str, Any]:
        """What must match for a saved state to be resumed (refused otherwise)."""
        # the blocks' makings and the stream's order; documents have no BOS: its key stays so saved
        # positions match
        stream = ("tokenizer", "seq_len", "eos_id", "num_shards", "shuffle_buffer", "seed")
        stream += ("holdout_per_mille", "keep", "tokenize_batch")
        return {
            "source": self.source.fingerprint(),
            "bos_id": None,
            **{name: getattr(self, name) for name in stream},
        }

    def _reader(self) -> tuple[int, int]:
        info = get_worker_info()
        workers, worker = (info.num_workers, info.id) if info else (1, 0)
        return self.rank * workers + worker, self.world_size * workers

    def state_dict(self) -> dict[str, Any]:
        reader, readers = self._reader()
        fingerprint = json.dumps(self.config_fingerprint(), sort_keys=True)
        return state_to_dict(
            self._state or ReaderState(), fingerprint, reader, readers, self.seq_len + 1
        )

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._pending_state = (
            state  # applied by the next __iter__, which knows the reader and the source
        )

    @property
    def stats(self) -> PackingStats:
        return self._state.stats if self._state else PackingStats()

    def __iter__(self) -> Iterator[torch.Tensor]:
        reader, readers = self._reader()
        ds = self.source.open()
        saved, self._pending_state = self._pending_state, None
        state = self._state = restore_state(
            saved, reader, ds.num_shards, self.seed, self.source.path
        )
        virtual = virtual_shard_count(self.num_shards, readers)
        plan = reader_plan(ds.num_shards, virtual, reader, readers)
        tokenizer = load_tokenizer(self.tokenizer)
        rng = random.Random()
        rng.setstate(state.rng_state)
        while self.epochs is None or state.epoch < self.epochs:
            produced_before = state.stats.blocks
            # only a whole pass without a block means the data cannot fill one (a resumed pass may
            # have none left)
            whole_pass = state.source_state is None
            batches = self._owned_batches(ds, plan, virtual, state)
            for block in self._blocks(batches, tokenizer, state):
                if (out := self._shuffle(block, state, rng)) is not None:
                    state.rng_state = rng.getstate()
                    state.blocks_delivered += 1
                    yield out
            if whole_pass and state.stats.blocks == produced_before and state.blocks_from_doc == 0:
                raise self._no_block(plan, virtual)
            state.epoch += 1
            state.source_state, state.source_shard = None, plan[0][0]
        # one-pass streams (validation) flush the buffer, shuffled once: a resume mid-flush keeps
        # the order
        if not state.flushing:
            rng.shuffle(state.buffer)
            state.flushing, state.rng_state = True, rng.getstate()
        while state.buffer:
            state.blocks_delivered += 1
            yield state.buffer.pop()

    def documents(self) -> Iterator[list[int]]:
        """One pass over the stream's documents, read as one reader, each its ids then EOS."""
        ds, tokenizer = self.source.open(), load_tokenizer(self.tokenizer)
        for owned in self._owned_batches(ds, reader_plan(ds.num_shards, 1, 0, 1), 1, ReaderState()):
            encodings = tokenizer.encode_batch(
                [text for _, text in owned], add_special_tokens=False
            )
            yield from ([*encoding.ids, self.eos_id] for encoding in encodings)

    def _blocks(
        self, batches: Iterator[list[tuple[int, str]]], tokenizer: Tokenizer, state: ReaderState
    ) -> Iterator[torch.Tensor]:
        """The blocks of the documents of ``batches``, each (its ids, then EOS) after its virtual
        shard's carry; ``state`` says how far, so a resume goes on from the same block."""
        block_len = self.seq_len + 1
        for owned in batches:
            encodings = tokenizer.encode_batch(
                [text for _, text in owned], add_special_tokens=False
            )
            for position, ((shard, _), encoding) in enumerate(zip(owned, encodings, strict=True)):
                if position < state.doc_in_batch:
                    continue  # packed before the checkpoint
                if state.blocks_from_doc == 0:  # else resumed inside this document
                    state.carry_at_doc = state.carries.get(shard, [])
                    state.stats.documents += 1
                tokens = [*state.carry_at_doc, *encoding.ids, self.eos_id]
                n_blocks = len(tokens) // block_len
                for b in range(state.blocks_from_doc, n_blocks):
                    state.blocks_from_doc = b + 1
                    state.stats.blocks += 1
                    yield torch.tensor(
                        tokens[b * block_len : (b + 1) * block_len], dtype=torch.int64
                    )
                state.carries[shard] = tokens[n_blocks * block_len :]
                state.doc_in_batch, state.blocks_from_doc = position + 1, 0
            state.doc_in_batch = 0

    def _no_block(self, plan: list[tuple[int, int, int]], virtual: int) -> DataError:
        """Why a whole pass over this reader's share (``plan``) gave no block."""
        (reader, readers), source_shards = self._reader(), self._state.source_shards
        cycle = document_cycle(source_shards, virtual)
        files = ", ".join(
            f"{f}" if (lo, hi) == (0, cycle) else f"{f}[{lo}:{hi}]/{cycle}" for f, lo, hi in plan
        )
        share = (
            f"{self.source.path} (source shards {files} of {source_shards}, {virtual} virtual "
            "shards)"
        )
        documents = self.stats.documents
        if documents == 0:  # lowering data.num_workers is suggested only where it is above 1
            fewer = "lower data.num_workers or " if readers > self.world_size else ""
            return DataError(
                f"reader {reader} of {readers} (ranks x data.num_workers) got no document from its "
                f"share of {share}: the corpus has too few documents for {readers} readers; "
                f"{fewer}give more documents (a .txt file is one document, a .jsonl line one)"
            )
        return DataError(
            f"reader {reader} of {readers} got no block of {self.seq_len + 1} tokens from a whole "
            f"pass over its {documents} documents of {share}: lower data.seq_len or give more text"
        )

    def _shuffle(
        self, block: torch.Tensor, state: ReaderState, rng: random.Random
    ) -> torch.Tensor | None:
        if self.shuffle_buffer == 0:
            return block
        if len(state.buffer) < self.shuffle_buffer:
            state.buffer.append(block)
            return None
        index = rng.randrange(self.shuffle_buffer)
        out, state.buffer[index] = state.buffer[index], block
        return out

    def _owned_batches(
        self, ds: Any, plan: list[tuple[int, int, int]], virtual: int, state: ReaderState
    ) -> Iterator[list[tuple[int, str]]]:
        """Yield this reader's documents as ``[(virtual shard, text), ...]`` per tokenization
        batch, from the shards in ``plan``; before each batch, ``state`` records where it starts
        (source shard, stream state, index)."""
        restored = state.source_state
        first = 0 if restored is None else [f for f, _, _ in plan].index(state.source_shard)
        field_name, source_shards = self.source.text_field, ds.num_shards
        cycle = document_cycle(source_shards, virtual)
        for f, lo, hi in plan[first:]:
            shard = ds.shard(num_shards=source_shards, index=f, contiguous=True)
            if restored is None:
                start_index, start_state = 0, shard.state_dict()
            else:  # datasets #8308: until a row is read, state_dict() is the *initial* one, so
                # the batch starts at the loaded state
                shard.load_state_dict(restored)
                start_index, start_state, restored = state.source_doc_index, restored, None
            # .iter(), not iter(): in a DataLoader worker, iter() reads only that worker's share
            # (wrong numbering).
            for batch in shard.iter(batch_size=self.tokenize_batch):
                if field_name not in batch:
                    raise KeyError(
                        f"text field {field_name!r} not found; fields are {sorted(batch)}"
                    )
                texts, owned = batch[field_name], []
                for j, text in enumerate(texts, start_index):
                    if not lo <= j % cycle < hi:
                        continue
                    if not isinstance(text, str) or not text.strip():
                        state.stats.empty_documents += 1
                        continue
                    if is_held_out(text, self.holdout_per_mille) != (self.keep == "held_out"):
                        continue
                    state.stats.replaced_characters += text.count("\ufffd")
                    owned.append((virtual_shard_of(source_shards, virtual, f, j), text))
                state.stats.rows_read += len(texts)
                state.source_shard, state.source_doc_index = f, start_index
                state.source_state = copy.deepcopy(start_state)
                yield owned
                start_index, start_state = start_index + len(texts), shard.state_dict()
