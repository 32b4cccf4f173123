"""Tokenize streamed documents, pack them into fixed blocks, shard, shuffle, and resume exactly.

Packing: each document becomes ``[BOS] + tokens + [EOS]`` and is appended to a running
buffer cut into blocks of ``seq_len + 1`` tokens (inputs = block[:-1], targets = block[1:]),
so every block has exactly ``seq_len`` targets and no padding; the remainder carries over.

Sharding: the source has ``S`` shards of its own (its files; for a hub stream, the stream's
``num_shards``) and the stream ``V`` virtual shards (``num_shards``; ``None``, or fewer than
the readers: one per reader). Think of an ``S x V`` grid of units, ``V`` per source shard;
virtual shard ``v`` is the units ``[v * S, (v + 1) * S)``: whole files when ``V`` divides
``S``, a ``1 / (V / S)`` slice of one file when ``S`` divides ``V``, in general at most
``ceil(S / V) + 1`` consecutive files. Within a file, document ``j`` is in part ``j % m``
(``m = V / gcd(S, V)``, the finest cut any shard boundary needs), which spans ``gcd(S, V)``
units: so virtual shard ``(f * V + gcd(S, V) * (j % m)) // S`` for document ``j`` of file
``f``. Each virtual shard packs its own documents (its own carry), in file then document order.

The ``R = world_size x num_workers`` readers own consecutive virtual shards (reader ``r``:
``[r * V // R, (r + 1) * V // R)``), hence a consecutive run of units, and open only the source
shards those units lie in, each with ``datasets``' ``shard``: a reader downloads and parses
exactly its ``S / R`` files when ``R`` divides ``S`` (and ``V``), the one file it shares with
``R / S - 1`` other readers when ``S`` divides ``R``, and in general about ``S / R + 1`` source
shards at most -- never the whole stream. Within a shared file documents are split by index.

What the blocks depend on: ``V``, the source and the packing settings -- not the world. With a
fixed ``num_shards >= R``, any number of ranks and workers yields exactly the blocks of one
process (disjoint and complete); with more readers than ``num_shards`` (or ``num_shards=None``)
``V = R`` and the blocks depend on the number of readers. Readers own equal shares of the
documents when ``R`` divides ``V``. A resume with another reader count is refused either way.

Resume: the state (the source shard being read and its ``datasets`` state at the last
tokenization batch, the document and block reached within it, every carry, the shuffle buffer
and its RNG) is small and exact, so a resumed stream continues with the first block not yet
delivered -- across any number of resumes.
"""

from __future__ import annotations

import copy
import hashlib
import json
import math
import os
import random
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import IterableDataset, get_worker_info

from fixed_embed.data.corpus import cache_root
from fixed_embed.data.sources import DocumentSource
from fixed_embed.data.tokenizer import load_tokenizer
from fixed_embed.errors import CheckpointError, DataError

__all__ = [
    "BlockCache",
    "PackedBlocks",
    "PackingStats",
    "document_cycle",
    "is_held_out",
    "reader_plan",
    "virtual_shard_count",
    "virtual_shard_of",
]

# Version of the saved reader state; states without it (one global document index) resume only
# from a single-file source, where both layouts agree.
_STATE_LAYOUT = 2


def is_held_out(text: str, per_mille: int) -> bool:
    """Hash-based document hold-out: the same documents on every machine and run."""
    return per_mille > 0 and int(hashlib.sha256(text.encode("utf-8", "replace")).hexdigest()[:8], 16) % 1000 < per_mille


def virtual_shard_count(num_shards: int | None, readers: int) -> int:
    """The virtual shards a stream of ``num_shards`` uses with ``readers`` readers (never fewer than them)."""
    return readers if num_shards is None or num_shards < readers else num_shards


def document_cycle(source_shards: int, virtual_shards: int) -> int:
    """``m``: document ``j`` of a source shard is in its part ``j % m`` (see the module docstring)."""
    return virtual_shards // math.gcd(source_shards, virtual_shards)


def virtual_shard_of(source_shards: int, virtual_shards: int, shard: int, doc: int) -> int:
    """The virtual shard of document ``doc`` (its index within the source shard) of source shard ``shard``."""
    g = math.gcd(source_shards, virtual_shards)
    return (shard * virtual_shards + g * (doc % (virtual_shards // g))) // source_shards


def reader_plan(source_shards: int, virtual_shards: int, reader: int, readers: int) -> list[tuple[int, int, int]]:
    """The source shards reader ``reader`` of ``readers`` opens, as ``(shard, lo, hi)``, in reading order.

    The reader keeps document ``j`` of source shard ``shard`` when ``lo <= j % m < hi``, with
    ``m = document_cycle(source_shards, virtual_shards)`` (``lo, hi = 0, m``: the whole shard).
    """
    s, v = source_shards, virtual_shards
    if not (s >= 1 and v >= readers >= 1 and 0 <= reader < readers):
        raise ValueError(f"bad sharding: {s} source shards, {v} virtual shards, reader {reader} of {readers}")
    g = math.gcd(s, v)
    first, end = reader * v // readers * s, (reader + 1) * v // readers * s  # its units [first, end)
    return [(f, max(first - f * v, 0) // g, min(end - f * v, v) // g) for f in range(first // v, (end - 1) // v + 1)]


@dataclass
class PackingStats:
    """What this reader has read since its stream started (or resumed): for tests, diagnostics and
    the "no block from a whole pass" check. Not saved: a resume has no use for the old counts."""

    documents: int = 0
    empty_documents: int = 0
    replaced_characters: int = 0
    tokens: int = 0
    blocks: int = 0
    rows_read: int = 0  # documents pulled from the source, own or not (what the reader downloads and parses)


@dataclass
class _ReaderState:
    epoch: int = 0
    source_shards: int | None = None  # how many shards the source had (checked on resume)
    source_shard: int = 0  # the source shard of the current tokenization batch
    source_state: dict | None = None  # datasets' state of that shard's stream at the start of the batch
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


class PackedBlocks(IterableDataset):
    """An endless (or, with ``epochs=1``, one-pass) stream of packed ``LongTensor[seq_len + 1]`` blocks.

    ``num_shards``: virtual shards (see the module docstring); ``None``: one per reader.
    """

    def __init__(
        self,
        source: DocumentSource,
        tokenizer: str,
        seq_len: int,
        eos_id: int,
        bos_id: int | None = None,
        num_shards: int | None = 64,
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
        if (num_shards is not None and num_shards < 1) or shuffle_buffer < 0 or tokenize_batch < 1:
            raise ValueError(
                f"num_shards ({num_shards}: null or >= 1), tokenize_batch ({tokenize_batch}) must be >= 1, "
                f"shuffle_buffer ({shuffle_buffer}) >= 0"
            )
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} is not in a world of {world_size}")
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
        return self.rank * workers + worker, self.world_size * workers

    # -- state ----------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        reader, readers = self._reader()
        state = self._state or _ReaderState()
        return {
            "fingerprint": json.dumps(self.config_fingerprint(), sort_keys=True),
            "layout": _STATE_LAYOUT,
            "reader": [reader, readers],
            "epoch": state.epoch,
            "source_shards": state.source_shards,
            "source_shard": state.source_shard,
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
            "flushing": state.flushing,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        expected = json.dumps(self.config_fingerprint(), sort_keys=True)
        if state["fingerprint"] != expected:
            saved, now = json.loads(state["fingerprint"]), json.loads(expected)
            changed = "; ".join(
                f"{key}: checkpoint {saved.get(key)!r}, now {now.get(key)!r}"
                for key in sorted(set(saved) | set(now))
                if saved.get(key) != now.get(key)
            )
            raise CheckpointError(
                f"refusing to resume: the checkpoint's data stream was made with other data settings ({changed}); "
                "resume with the run's own data settings, or start a new run (--run NAME)"
            )
        self._pending_state = state

    def _restore(self, reader: int, readers: int, source_shards: int) -> _ReaderState:
        saved, self._pending_state = self._pending_state, None
        if saved is None:
            state = _ReaderState(source_shards=source_shards)
            state.rng_state = random.Random(f"{self.seed}/{reader}").getstate()
            return state
        if saved["reader"] != [reader, readers]:
            raise CheckpointError(
                f"refusing to resume: the checkpoint was written by reader {saved['reader'][0]} of "
                f"{saved['reader'][1]} but this is reader {reader} of {readers} (nodes, devices or num_workers "
                "changed); resume with the same world and data.num_workers"
            )
        if saved.get("layout") is None and source_shards != 1:
            raise CheckpointError(
                "refusing to resume: the checkpoint's data state predates per-file sharding and can only be "
                f"resumed from a single-file source; {self.source.path} has {source_shards} shards"
            )
        saved_shards = saved.get("source_shards")
        if saved_shards is not None and saved_shards != source_shards:
            raise CheckpointError(
                f"refusing to resume: {self.source.path} had {saved_shards} shards (files) when the checkpoint "
                f"was written and has {source_shards} now"
            )
        return _ReaderState(
            epoch=saved["epoch"],
            source_shards=source_shards,
            source_shard=saved.get("source_shard", 0),
            source_state=saved["source_state"],
            source_doc_index=saved["source_doc_index"],
            doc_in_batch=saved["doc_in_batch"],
            blocks_from_doc=saved["blocks_from_doc"],
            carry_at_doc=saved["carry_at_doc"].tolist(),
            carries={int(k): v.tolist() for k, v in saved["carries"].items()},
            buffer=list(saved["buffer"].unbind(0)),
            rng_state=_rng_from_list(saved["rng_state"]),
            blocks_delivered=saved["blocks_delivered"],
            flushing=saved.get("flushing", False),
        )  # older states also hold "stats": ignored

    @property
    def stats(self) -> PackingStats:
        return self._state.stats if self._state else PackingStats()

    # -- the stream -----------------------------------------------------------------------

    def __iter__(self) -> Iterator[torch.Tensor]:
        reader, readers = self._reader()
        ds = self.source.open()
        source_shards = ds.num_shards
        state = self._state = self._restore(reader, readers, source_shards)
        virtual = virtual_shard_count(self.num_shards, readers)
        plan = reader_plan(source_shards, virtual, reader, readers)
        tokenizer = load_tokenizer(self.tokenizer_spec)
        rng = random.Random()
        rng.setstate(state.rng_state)
        block_len = self.seq_len + 1
        while self.epochs is None or state.epoch < self.epochs:
            produced_before = state.stats.blocks
            # a pass resumed partway may have nothing left (saved right after its last block): only a
            # whole pass without a block means the data cannot fill one
            whole_pass = state.source_state is None
            for owned in self._owned_batches(ds, plan, virtual, state):
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
            if whole_pass and state.stats.blocks == produced_before and state.blocks_from_doc == 0:
                cycle = document_cycle(source_shards, virtual)
                files = ", ".join(f"{f}" if (lo, hi) == (0, cycle) else f"{f}[{lo}:{hi}]/{cycle}" for f, lo, hi in plan)
                share = f"{self.source.path} (source shards {files} of {source_shards}, {virtual} virtual shards)"
                if state.stats.documents == 0:
                    raise DataError(
                        f"reader {reader} of {readers} (ranks x data.num_workers) got no document from its share of "
                        f"{share}: the corpus has too few documents for {readers} readers; lower data.num_workers "
                        "or give more documents"
                    )
                raise DataError(
                    f"reader {reader} of {readers} got no block of {self.seq_len + 1} tokens from a whole pass over "
                    f"its {state.stats.documents} documents of {share}: lower data.seq_len or give more text"
                )
            state.epoch += 1
            state.source_state, state.source_shard = None, plan[0][0]
        # one-pass streams (validation) flush what the buffer still holds, in a seeded order (shuffled
        # once: a stream resumed mid-flush goes on with the same order)
        if not state.flushing:
            rng.shuffle(state.buffer)
            state.flushing, state.rng_state = True, rng.getstate()
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

    def _owned_batches(self, ds, plan: list[tuple[int, int, int]], virtual: int, state: _ReaderState):
        """Yield this reader's documents as ``[(virtual shard, text), ...]`` per tokenization batch, resumably.

        Only the source shards in ``plan`` are opened. Before each batch is handed out, ``state``
        records where the batch starts (source shard, its stream state, document index).
        """
        restored = state.source_state
        first = 0
        if restored is not None:
            first = next((i for i, (f, _, _) in enumerate(plan) if f == state.source_shard), None)
            if first is None:
                raise ValueError(f"the saved data state reads source shard {state.source_shard}, not this reader's")
        field_name, source_shards = self.source.text_field, ds.num_shards
        cycle = document_cycle(source_shards, virtual)
        for f, lo, hi in plan[first:]:
            shard = ds.shard(num_shards=source_shards, index=f, contiguous=True)
            if restored is not None:
                shard.load_state_dict(restored)
            doc_index = state.source_doc_index if restored is not None else 0
            whole = (lo, hi) == (0, cycle)
            # ds.iter(), not iter(ds): inside a DataLoader worker, iter(ds) silently reads only that
            # worker's share of the shards, which would break the document numbering.
            batches = shard.iter(batch_size=self.tokenize_batch)
            while True:
                # Right after load_state_dict, datasets reports the *initial* state until the first row
                # is read (datasets issue #8308): a second resume would restart the shard. Use the
                # loaded state itself for the first batch.
                start_state = copy.deepcopy(restored if restored is not None else shard.state_dict())
                start_index, counted, restored = doc_index, restored is None, None  # a resumed batch was counted
                batch = next(batches, None)
                if batch is None:
                    break
                if field_name not in batch:
                    raise KeyError(f"text field {field_name!r} not found; fields are {sorted(batch)}")
                texts = batch[field_name]
                owned: list[tuple[int, str]] = []
                for j, text in enumerate(texts, start_index):
                    if not (whole or lo <= j % cycle < hi):
                        continue
                    if not isinstance(text, str) or not text.strip():
                        state.stats.empty_documents += counted
                        continue
                    if is_held_out(text, self.holdout_per_mille) != (self.keep == "held_out"):
                        continue
                    state.stats.replaced_characters += counted * text.count("\ufffd")
                    owned.append((virtual_shard_of(source_shards, virtual, f, j), text))
                doc_index = start_index + len(texts)
                state.stats.rows_read += counted * len(texts)
                state.source_shard, state.source_state, state.source_doc_index = f, start_state, start_index
                yield owned


class BlockCache:
    """Materialised blocks kept on disk, keyed by everything they depend on. It is a cache: an entry
    that cannot be read, or does not match, is rebuilt (with a warning), never trusted or fatal.

    The file is ``folder / <sha256 of key>.pt`` (``folder`` defaults to ``cache_root() / kind``)
    holding the blocks and that digest; it is written atomically (temporary file, fsync,
    ``os.replace``), so a reader never sees half a file, and concurrent writers just race to an
    identical result.
    """

    def __init__(self, key: dict[str, Any], kind: str = "blocks", folder: str | os.PathLike | None = None) -> None:
        self.digest = hashlib.sha256(json.dumps(key, sort_keys=True, default=str).encode()).hexdigest()
        self.path = Path(folder if folder is not None else cache_root() / kind) / f"{self.digest[:32]}.pt"

    def load(self, width: int | None = None) -> torch.Tensor | None:
        """The cached ``LongTensor[n, width]``, or ``None`` when absent or unusable."""
        try:
            saved = torch.load(self.path, map_location="cpu", weights_only=True)
        except FileNotFoundError:
            return None
        except Exception as error:  # truncated, corrupt, unreadable: any of many types
            reason = (str(error).splitlines() or [""])[0][:200]
            warnings.warn(
                f"block cache {self.path} is unreadable ({type(error).__name__}: {reason}); rebuilding", stacklevel=2
            )
            return None
        saved = saved if isinstance(saved, dict) else {}
        blocks = saved.get("blocks")
        usable = (
            saved.get("key") == self.digest
            and isinstance(blocks, torch.Tensor)
            and blocks.dtype == torch.int64
            and blocks.dim() == 2
            and len(blocks) > 0
            and (width is None or blocks.shape[1] == width)
        )
        if not usable:
            warnings.warn(f"block cache {self.path} does not hold the expected blocks; rebuilding", stacklevel=2)
            return None
        return blocks

    def save(self, blocks: torch.Tensor) -> bool:
        """Write ``blocks`` atomically; a failure (read-only or full disk) warns and returns False."""
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with open(tmp, "wb") as file:
                torch.save({"key": self.digest, "blocks": blocks.contiguous()}, file)
                file.flush()
                os.fsync(file.fileno())
            os.replace(tmp, self.path)
            return True
        except OSError as error:
            tmp.unlink(missing_ok=True)
            warnings.warn(f"could not write the block cache {self.path}: {error}", stacklevel=2)
            return False

    def get(self, build: Callable[[], torch.Tensor], width: int | None = None) -> tuple[torch.Tensor, float | None]:
        """The cached blocks, or ``build()`` saved; with the seconds the build took (``None``: from cache)."""
        blocks = self.load(width)
        if blocks is not None:
            return blocks, None
        start = time.perf_counter()
        blocks = build()
        seconds = time.perf_counter() - start
        self.save(blocks)
        return blocks, seconds


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
