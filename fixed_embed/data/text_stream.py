"""The text-stream source: documents from local files or the hub, tokenized and packed as they
are read. Its position belongs to its readers (ranks x workers), so a resume keeps both;
validation blocks are cached."""

from __future__ import annotations

import dataclasses
import itertools
import json
from typing import Any

import torch
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn
from torchdata.stateful_dataloader import StatefulDataLoader

from fixed_embed.data.block_cache import BlockCache
from fixed_embed.data.block_order import GLOBAL_POSITION
from fixed_embed.data.corpus import default_corpus
from fixed_embed.data.loader_state import (
    LOADER_STATES,
    find_states,
    fingerprint_refusal,
    saved_loader_state,
)
from fixed_embed.data.packing import PackedBlocks
from fixed_embed.data.sharding import virtual_shard_count
from fixed_embed.data.source_settings import SourceSettings
from fixed_embed.data.sources import DocumentSource
from fixed_embed.data.tokenizer import EOS, bpe_for_source, special_token_id, tokenizer_fingerprint
from fixed_embed.data.validation import spread_blocks
from fixed_embed.errors import DataError, MissingFileError

# Constant so the validation set never depends on data.num_shards or the world (changing it breaks
# val/loss history).
VALIDATION_SHARDS = 64
# Bump when packing changes the blocks it makes from the same data: cached validation sets are then
# rebuilt.
_VALIDATION_LAYOUT = 3  # 3: val_per_document (spread_blocks)


class TextStreamSource:
    """``data.train`` (``role`` "train") or ``data.valid`` ("valid") read as text; ``None``: the
    default corpus."""

    def __init__(self, data: SourceSettings, role: str) -> None:
        self.data, self.role = data, role
        self.path = data.hparams[role]

    def documents(self, reordered: bool = False) -> DocumentSource:
        """The documents as training reads them if ``reordered`` (passages, seeded order), else
        as the files hold."""
        hp = self.data.hparams
        path = self.path or str(default_corpus() / "train.jsonl")
        source = DocumentSource(path, hp[f"{self.role}_split"], hp.hub_name, hp.text_field)
        if not reordered:
            return source
        order = self.data.seed if hp.shuffle_documents else None
        return dataclasses.replace(source, passage_chars=hp.passage_chars, shuffle_seed=order)

    def default_tokenizer(self) -> str:
        """The byte-level BPE of ``data.tokenizer_vocab_size`` trained on these documents
        (cached)."""
        return str(bpe_for_source(self.documents(), self.data.hparams.tokenizer_vocab_size))

    def check_inputs(self) -> None:
        if self.path is None:
            return  # the default corpus is built on first use
        try:
            self.documents(reordered=self.role == "train").fingerprint()
        except FileNotFoundError as error:
            raise MissingFileError(f"data.{self.role}: {error}") from error

    def check(self) -> None:
        """Nothing to check against the tokenizer: the text is tokenized as it is read."""

    def stream(self, documents: DocumentSource, **options: Any) -> PackedBlocks:
        hp, data = self.data.hparams, self.data
        return PackedBlocks(
            documents,
            data.tokenizer_path,
            data.seq_len,
            special_token_id(data.tokenizer, EOS),
            **{"num_shards": hp.num_shards, **options},
            seed=data.seed,
            holdout_per_mille=hp.holdout_per_mille,
            tokenize_batch=hp.tokenize_batch,
        )

    def training_stream(
        self, rank: int = 0, world: int = 1, length: int | None = None
    ) -> PackedBlocks:
        return self.stream(
            self.documents(reordered=True),
            shuffle_buffer=self.data.hparams.shuffle_buffer,
            rank=rank,
            world_size=world,
            length=length or 2**62,
        )

    def train_loader(
        self, rank: int, world: int, length: int | None, pin_memory: bool
    ) -> StatefulDataLoader:
        workers = self.data.num_workers
        readers, shards = world * max(1, workers), self.data.hparams.num_shards
        virtual = virtual_shard_count(shards, readers)
        if virtual != shards:
            rank_zero_info(
                f"data: {readers} readers ({world} ranks x {max(1, workers)} workers), one virtual "
                "shard "
                f"each{'' if shards is None else f' (more readers than num_shards {shards})'}: the "
                "training "
                "blocks depend on the number of readers"
            )
        elif virtual % readers:
            rank_zero_info(
                f"data: {virtual} virtual shards over {readers} readers: readers own "
                f"{virtual // readers} or "
                f"{virtual // readers + 1} of them (a num_shards that {readers} divides gives "
                "equal shares)"
            )
        # Not fork: a rank forks with threads running, which can deadlock the child (seen: CPython
        # 3.11, DDP).
        return StatefulDataLoader(
            self.training_stream(rank, world, length),
            batch_size=self.data.batch_size,
            num_workers=workers,
            persistent_workers=workers > 0,
            drop_last=True,
            multiprocessing_context="forkserver" if workers > 0 else None,
            pin_memory=pin_memory,
        )

    def position_refusals(self, checkpoint: dict[str, Any], world_size: int | None) -> list[str]:
        """A text position resumes only the same stream (its fingerprint) read by the same
        readers."""
        state = saved_loader_state(checkpoint)
        if not (readers := find_states(state, "reader")):
            if not find_states(state, GLOBAL_POSITION):
                return []
            return [
                "refusing to resume: the checkpoint's data position is in token shards, and "
                "data.train is now text "
                f"({self.path!r}); resume with the run's own token shards (data.train: SHARDS/), "
                "or start a new run "
                "(--run NAME)"
            ]
        self.check_inputs()  # a missing data.train is said as such, not as a changed fingerprint
        now = (
            self.training_stream().config_fingerprint()
        )  # its tokenizer is compared not by path here but
        now["tokenizer"] = json.loads(readers[0]["fingerprint"]).get(
            "tokenizer"
        )  # by content (_tokenizer_refusal)
        why = fingerprint_refusal(readers[0]["fingerprint"], now)
        refusals = [why] if why else []
        saved_workers = (checkpoint.get("datamodule_hyper_parameters") or {}).get("num_workers")
        if saved_workers not in (None, self.data.num_workers):
            refusals.append(
                f"refusing to resume: the checkpoint's data position was saved by {saved_workers} "
                "loader worker(s) "
                f"per device and data.num_workers is {self.data.num_workers} now (each worker "
                "reads its own share "
                f"of the data); resume with data.num_workers {saved_workers}, or start a new run "
                "(--run NAME). Token "
                "shards (fixed-embed pretokenize, data.train: SHARDS/) resume at any number of "
                "workers and ranks"
            )
        per_rank = checkpoint.get(LOADER_STATES)
        saved_world = (
            len(per_rank) if per_rank else readers[0]["reader"][1] // max(1, saved_workers or 0)
        )
        if world_size is not None and saved_world != world_size:
            refusals.append(
                f"refusing to resume: the checkpoint holds the data position of {saved_world} "
                "ranks but this run has "
                f"{world_size}; resume on the same number of nodes x devices. A text stream's "
                "position belongs to "
                "its readers; to continue on another world size, train from token shards "
                "(fixed-embed pretokenize, "
                "data.train: SHARDS/), whose position is global"
            )
        return refusals

    def validation_documents(self, held_out: bool) -> tuple[DocumentSource, str]:
        """The validation documents and which side of the hash hold-out they are on ("train":
        all of them)."""
        if not held_out:
            return self.documents(), "train"
        if self.path is None:  # the default corpus has its own validation file
            return DocumentSource(str(default_corpus() / "valid.jsonl")), "train"
        return self.documents(), "held_out"

    def validation_cache(self, held_out: bool) -> BlockCache:
        hp, data = self.data.hparams, self.data
        documents, keep = self.validation_documents(held_out)
        key = {
            "layout": _VALIDATION_LAYOUT,
            "source": documents.content_stamp(),
            "keep": keep,
            "seq_len": data.seq_len,
            "tokenizer": tokenizer_fingerprint(data.tokenizer),
            "num_shards": VALIDATION_SHARDS,
            **{
                name: hp[name]
                for name in ("val_sequences", "val_per_document", "holdout_per_mille")
            },
        }
        return BlockCache(key, "validation")  # under cache_root()

    def validation_blocks(self, held_out: bool) -> torch.Tensor:
        """Built once and cached on disk, keyed by everything they depend on (an unreadable file
        is rebuilt)."""
        cache = self.validation_cache(held_out)
        blocks, seconds = cache.get(lambda: self._build(*self.validation_documents(held_out)))
        if seconds is None:
            rank_zero_info(f"validation: {len(blocks)} blocks from cache {cache.path}")
        else:
            rank_zero_info(
                f"validation: built {len(blocks)} blocks in {seconds:.1f} s, cached at {cache.path}"
            )
        return blocks

    def _build(self, documents: DocumentSource, keep: str) -> torch.Tensor:
        hp, width = self.data.hparams, self.data.seq_len + 1
        stream = self.stream(
            documents, shuffle_buffer=0, epochs=1, keep=keep, num_shards=VALIDATION_SHARDS
        )
        if hp.val_per_document:  # spread_blocks warns of short documents and names what it refuses
            return spread_blocks(stream.documents(), width, hp.val_sequences, documents.path)
        try:
            blocks = list(itertools.islice(stream, hp.val_sequences))
        except (
            DataError
        ) as error:  # the packer's words are about training readers; say what this is
            held_out = (
                f" ({hp.holdout_per_mille} per mille held out of data.train)"
                if keep == "held_out"
                else ""
            )
            fix = (
                "set --data.valid FILE, raise data.holdout_per_mille"
                if held_out
                else "give data.valid more text"
            )
            fix += ", set data.val_per_document: true, or lower data.seq_len"
            if held_out and "got no document" in str(
                error
            ):  # none held out: one .txt file is one document
                fix = (
                    "set --data.valid FILE, or give more documents (a .txt file is one, a .jsonl "
                    "line one)"
                )
            raise DataError(
                f"validation: the documents of {documents.path}{held_out} give no block of {width} "
                "tokens "
                f"when packed in {VALIDATION_SHARDS} fixed shards: {fix}"
            ) from error
        if len(blocks) < hp.val_sequences:
            rank_zero_warn(
                f"validation data {documents.path} holds only {len(blocks)} blocks of {width} "
                "tokens; "
                f"asked for {hp.val_sequences}"
            )
        return torch.stack(blocks)  # not empty: a pass without a block is the DataError above
