"""TextDataModule: streamed, packed, sharded, exactly resumable training data and a fixed validation set."""

from __future__ import annotations

import dataclasses
import itertools
import os
from collections.abc import Iterator
from typing import Any

import lightning as L
import numpy as np
import torch
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn
from tokenizers import Tokenizer
from torch.utils.data import DataLoader, IterableDataset
from torchdata.stateful_dataloader import StatefulDataLoader

from fixed_embed.data.block_cache import BlockCache
from fixed_embed.data.block_order import RankBatches, TokenBlockLoader
from fixed_embed.data.corpus import default_corpus
from fixed_embed.data.packing import PackedBlocks
from fixed_embed.data.sharding import virtual_shard_count
from fixed_embed.data.sources import DocumentSource
from fixed_embed.data.token_shards import TokenShards, shard_folder
from fixed_embed.data.tokenizer import EOS, load_tokenizer, resolve_tokenizer, special_token_id, tokenizer_fingerprint
from fixed_embed.data.validation import bytes_per_target, spread_blocks, spread_document_blocks
from fixed_embed.errors import ConfigError, DataError

__all__ = ["TextDataModule"]

# The validation stream's virtual shards: a constant, so the validation set never depends on
# data.num_shards or the world; changing it changes the blocks, and val/loss stops comparing across runs.
_VALIDATION_SHARDS = 64
# Bump when packing changes the blocks it makes from the same data: cached validation sets are then rebuilt.
_VALIDATION_LAYOUT = 3  # 3: val_per_document (spread_blocks)


class _RankSlice(IterableDataset):
    """This rank's equal share of the materialised validation blocks (no sampler needed or added)."""

    def __init__(self, blocks: torch.Tensor) -> None:
        self.blocks = blocks

    def __len__(self) -> int:
        return len(self.blocks)

    def __iter__(self) -> Iterator[torch.Tensor]:
        return iter(self.blocks)


class TextDataModule(L.LightningDataModule):
    """Packed ``seq_len + 1`` token blocks streamed from a hub dataset or local files.

    Every document is ``tokens + <|endoftext|>``: the tokenizer must have that token, as evaluation
    and export use it as the document boundary too. The options come in three groups, in this
    order: the source (``train`` to ``tokenizer_vocab_size``: what is read and how it becomes
    tokens), packing (``seq_len`` to ``tokenize_batch``: the training stream and its loader) and
    validation (``val_sequences`` to ``holdout_per_mille``: the fixed set every run is measured on).

    Args:
        train: local file / folder / glob, or a hub dataset id. ``None``: the offline default
            corpus (Python's own documentation text, built and cached on first use). A folder of
            token shards (``fixed-embed pretokenize``; it holds ``token_shards.json``): memory-mapped
            blocks in a global seeded order, resumable at any world size; the stream options
            (``hub_name`` to ``tokenizer_vocab_size``, ``num_shards``, ``shuffle_buffer``,
            ``shuffle_documents``, ``passage_chars``, ``tokenize_batch``) do not apply to it.
        valid: where validation documents come from; ``None``: the default corpus's
            ``valid.jsonl``, or a hash-based hold-out of ``holdout_per_mille`` of ``train`` (the
            held-out shards of a token-shard ``train``). Also a token-shard folder.
        hub_name: the config name of a hub dataset.
        train_split: the split a hub ``train`` is read from (local files ignore it).
        valid_split: the split a hub ``valid`` is read from (local files ignore it); a hub dataset
            without one (fineweb-edu) validates on a hold-out of ``train`` or on another dataset.
        text_field: the field holding each document's text.
        tokenizer: a hub id, ``tokenizer.json`` or a folder; ``None``: a byte-level BPE of
            ``tokenizer_vocab_size`` trained on ``train`` (cached), or a token-shard ``train``'s
            own tokenizer. Token shards refuse any other tokenizer than theirs.
        tokenizer_vocab_size: the size of that BPE (``tokenizer: null`` only).
        seq_len: prediction targets per sequence (blocks are ``seq_len + 1`` tokens).
        batch_size: sequences per device per micro-batch.
        num_workers: loader worker processes per device.
        num_shards: virtual shards of the training stream (``null``: one per reader). Readers
            (ranks x workers) read only their share of the source's files / hub shards. With
            more readers than ``num_shards`` it is raised to the number of readers; up to it,
            the training blocks do not depend on the world size (equal shares when the readers
            divide it).
        shuffle_buffer: blocks held for a seeded shuffle (0: stream order).
        seed: the data-order seed (shuffle buffer, document permutation); ``None``: the training
            seed (``seed_everything``), so training seeds vary the data order as well as the
            initialisation (the study does this). The default, 0, holds the data order fixed
            across training seeds, so runs that differ only in their seed see the same batches.
        shuffle_documents: read local training files as one seeded permutation of all their
            documents (passages with ``passage_chars``), not file by file: a run shorter than an
            epoch then sees a uniform sample of the corpus, not its first files. Local files only.
        passage_chars: cut each document at paragraph breaks into passages of at least this many
            characters first (``None``: whole documents), so a permutation mixes within books too.
        tokenize_batch: documents tokenized together; the saved stream position points at one
            such batch, so it is part of the resume check.
        val_sequences: validation blocks in total (split equally over ranks); built once on
            global rank 0, cached under ``$FIXED_EMBED_CACHE/validation`` and sent to the others.
        val_per_document: draw the ``val_sequences`` blocks equally from every validation
            document (each packed alone, its blocks spread evenly through it) instead of taking
            the first ``val_sequences`` blocks of the stream; reads the whole validation source once.
        holdout_per_mille: the documents (per mille, chosen by hash) training skips; without
            ``valid``, they are the validation documents.
    """

    def __init__(
        self,
        # source
        train: str | None = None,
        valid: str | None = None,
        hub_name: str | None = None,
        train_split: str = "train",
        valid_split: str = "validation",
        text_field: str = "text",
        tokenizer: str | None = None,
        tokenizer_vocab_size: int = 8192,
        # packing
        seq_len: int = 2048,
        batch_size: int = 8,
        num_workers: int = 0,
        num_shards: int | None = 64,
        shuffle_buffer: int = 256,
        seed: int | None = 0,
        shuffle_documents: bool = False,
        passage_chars: int | None = None,
        tokenize_batch: int = 64,
        # validation
        val_sequences: int = 64,
        val_per_document: bool = False,
        holdout_per_mille: int = 10,
    ) -> None:
        super().__init__()
        for key, value, least in (("seq_len", seq_len, 1), ("batch_size", batch_size, 1),
                                  ("num_workers", num_workers, 0), ("val_sequences", val_sequences, 1)):  # fmt: skip
            if not isinstance(value, int) or value < least:
                raise ConfigError(f"data.{key} must be an integer >= {least}, got {value!r}")
        if passage_chars is not None and train is not None and valid is None:
            raise ConfigError(
                "data.passage_chars needs a separate validation source (data.valid): with a hash hold-out of "
                f"data.train ({train}), passages of one document would fall on both sides; set data.valid, or "
                "data.passage_chars: null"
            )
        if num_shards is not None and num_shards < 1:
            raise ValueError(f"num_shards must be >= 1 or null (one per reader), got {num_shards}")
        self.save_hyperparameters()
        self.seq_len, self.batch_size, self.num_workers = seq_len, batch_size, num_workers
        self._val_blocks: torch.Tensor | None = None
        self._val_shared = False  # every rank holds the blocks rank 0 loaded or built
        self.val_bytes_per_target: float | None = None  # of the blocks validation uses, for bits per byte
        self._tokenizer_path: str | None = None
        self._loaded_tokenizer = None
        self._shards: dict[tuple[str, str], TokenShards] = {}

    # -- sources and tokenizer ----------------------------------------------------------------

    @property
    def seed(self) -> int:
        """The data-order seed: ``data.seed``, else the training seed ``seed_everything`` set (else 0)."""
        if self.hparams.seed is not None:
            return self.hparams.seed
        return int(os.environ.get("PL_GLOBAL_SEED", 0))

    def _train_source(self, reordered: bool = True) -> DocumentSource:
        """The training documents; ``reordered``: as training reads them (passages, seeded order),
        else as the files hold them (for the tokenizer and the hash hold-out)."""
        hp = self.hparams
        path = hp.train if hp.train is not None else str(default_corpus() / "train.jsonl")
        source = DocumentSource(path, hp.train_split, hp.hub_name, hp.text_field)
        if not reordered:
            return source
        order = self.seed if hp.shuffle_documents else None
        return dataclasses.replace(source, passage_chars=hp.passage_chars, shuffle_seed=order)

    def _valid_source(self) -> tuple[DocumentSource, str]:
        """The validation documents and whether they are a hold-out of ``train`` ("held_out") or not."""
        hp = self.hparams
        if hp.valid is not None:
            return DocumentSource(hp.valid, hp.valid_split, hp.hub_name, hp.text_field), "train"
        if hp.train is None:
            return DocumentSource(str(default_corpus() / "valid.jsonl"), text_field="text"), "train"
        return self._train_source(reordered=False), "held_out"

    def _token_shards(self, path: str | None, split: str) -> TokenShards | None:
        """``path``'s ``split`` when it is a token-shard folder (checked against the index), else ``None``."""
        folder = shard_folder(path)
        if folder is None:
            return None
        if (str(folder), split) not in self._shards:
            self._shards[str(folder), split] = TokenShards(folder, split)
        return self._shards[str(folder), split]

    def train_shards(self) -> TokenShards | None:
        """The training token shards when ``data.train`` is a token-shard folder."""
        return self._token_shards(self.hparams.train, "train")

    def _valid_shards(self) -> TokenShards | None:
        """Validation from token shards: a token-shard ``valid`` (its training split), or the held-out shards
        of a token-shard ``train`` when ``valid`` is unset."""
        hp = self.hparams
        if hp.valid is not None:
            return self._token_shards(hp.valid, "train")
        return self._token_shards(hp.train, "held_out")

    def _check_shards(self) -> None:
        """Token shards must have been written with this tokenizer and hold-out (refused in one line otherwise)."""
        fingerprint = None
        for shards in (self.train_shards(), self._valid_shards()):
            if shards is None:
                continue
            fingerprint = fingerprint or tokenizer_fingerprint(self.tokenizer())
            shards.check_tokenizer(fingerprint, self.tokenizer_path(), self._eos_id())
            if shards is self.train_shards():
                shards.check_holdout(self.hparams.holdout_per_mille)

    def tokenizer_path(self) -> str:
        """The tokenizer to use, training (once, cached) the default BPE when none is configured."""
        if self._tokenizer_path is None and self.hparams.tokenizer is None and (shards := self.train_shards()):
            self._tokenizer_path = str(shards.tokenizer_file)  # the shards carry the tokenizer they were made with
        if self._tokenizer_path is None:
            hp = self.hparams
            self._tokenizer_path = resolve_tokenizer(
                hp.tokenizer, lambda: self._train_source(reordered=False), hp.tokenizer_vocab_size
            )
        return self._tokenizer_path

    def tokenizer(self) -> Tokenizer:
        """The tokenizer (loaded once)."""
        if self._loaded_tokenizer is None:
            self._loaded_tokenizer = load_tokenizer(self.tokenizer_path())
        return self._loaded_tokenizer

    def vocab_size(self) -> int:
        return self.tokenizer().get_vocab_size()

    def _check_vocab(self) -> None:
        module = self.trainer.lightning_module if self.trainer else None
        model_vocab = getattr(getattr(module, "config", None), "vocab_size", None)
        if model_vocab is None:
            return
        tokenizer_vocab = self.vocab_size()
        # Equal, not merely large enough: extra ids would never occur in the data, yet would change
        # the fixed codes' width K = ceil(log2 V) and the parameter counts the study compares.
        if model_vocab != tokenizer_vocab:
            raise ConfigError(
                f"model vocab_size {model_vocab} does not match the tokenizer's {tokenizer_vocab} "
                f"({self.tokenizer_path()}); set model.decoder.vocab_size: {tokenizer_vocab}"
            )

    def _eos_id(self) -> int:
        return special_token_id(self.tokenizer(), EOS)

    def _stream(self, source: DocumentSource, **kwargs) -> PackedBlocks:
        hp = self.hparams
        options = {"num_shards": hp.num_shards, "seed": self.seed, "tokenize_batch": hp.tokenize_batch, **kwargs}
        return PackedBlocks(
            source,
            self.tokenizer_path(),
            self.seq_len,
            eos_id=self._eos_id(),
            holdout_per_mille=hp.holdout_per_mille,
            **options,
        )

    # -- Lightning hooks ------------------------------------------------------------------------

    def _rank_world(self) -> tuple[int, int]:
        trainer = self.trainer
        return (trainer.global_rank, trainer.world_size) if trainer is not None else (0, 1)

    def _pin_memory(self) -> bool:
        """Page-locked batches on CUDA: the host-to-device copy then runs asynchronously, off the step's path."""
        trainer = self.trainer
        return trainer is not None and trainer.strategy.root_device.type == "cuda"

    def setup(self, stage: str) -> None:
        self._check_vocab()
        self._check_shards()

    def train_dataloader(self) -> StatefulDataLoader | TokenBlockLoader:
        rank, world = self._rank_world()
        trainer = self.trainer
        length = None
        if trainer is not None and trainer.max_steps and trainer.max_steps > 0:
            length = trainer.max_steps * trainer.accumulate_grad_batches * self.batch_size
        if (token_shards := self.train_shards()) is not None:
            return self._shard_loader(token_shards, rank, world, length)
        readers, shards = world * max(1, self.num_workers), self.hparams.num_shards
        virtual = virtual_shard_count(shards, readers)
        if virtual != shards:
            rank_zero_info(
                f"data: {readers} readers ({world} ranks x {max(1, self.num_workers)} workers), one virtual shard "
                f"each{'' if shards is None else f' (more readers than num_shards {shards})'}: the training "
                "blocks depend on the number of readers"
            )
        elif virtual % readers:
            rank_zero_info(
                f"data: {virtual} virtual shards over {readers} readers: readers own {virtual // readers} or "
                f"{virtual // readers + 1} of them (a num_shards that {readers} divides gives equal shares)"
            )
        dataset = self._stream(
            self._train_source(),
            shuffle_buffer=self.hparams.shuffle_buffer,
            rank=rank,
            world_size=world,
            length=length or 2**62,
        )
        return StatefulDataLoader(
            dataset,
            batch_size=self.batch_size,
            num_workers=self.num_workers,
            persistent_workers=self.num_workers > 0,
            drop_last=True,
            pin_memory=self._pin_memory(),
        )

    def _shard_loader(self, shards: TokenShards, rank: int, world: int, length: int | None) -> TokenBlockLoader:
        self._check_shards()
        batches = None if length is None else -(-length // self.batch_size)
        dataset = RankBatches(shards, self.seq_len, self.batch_size, self.seed, rank, world, length=batches or 2**62)
        rank_zero_info(
            f"data: token shards {shards.folder}: {dataset.order.blocks:,} blocks of {self.seq_len + 1} tokens "
            f"({shards.total:,} tokens, {shards.documents:,} documents) in a global order (seed {self.seed}), "
            f"{world} ranks x {self.batch_size} per global batch; resumable at any world size"
        )
        return TokenBlockLoader(dataset, num_workers=self.num_workers, pin_memory=self._pin_memory())

    def validation_blocks(self) -> torch.Tensor:
        """All ``val_sequences`` validation blocks (identical for every variant, run and rank).

        Built once and cached on disk (``$FIXED_EMBED_CACHE/validation``), keyed by everything they
        depend on: the source (files, sizes, modification times; or the hub id, config and split),
        the tokenizer's content, seq_len, val_sequences, the hold-out, the special ids. Every later
        call and start loads the file; an unreadable one is rebuilt. No collective: under a trainer
        ``val_dataloader`` calls this on global rank 0 only and broadcasts the result.
        """
        if self._val_blocks is None and (shards := self._valid_shards()) is not None:
            self._val_blocks = self._shard_validation_blocks(shards)  # memory-mapped: no cache needed
        if self._val_blocks is None:
            source, keep = self._valid_source()
            cache = self._validation_cache(source, keep)
            blocks, seconds = cache.get(lambda: self._build_validation_blocks(source, keep), width=self.seq_len + 1)
            if seconds is None:
                rank_zero_info(f"validation: {len(blocks)} blocks from cache {cache.path}")
            else:
                rank_zero_info(f"validation: built {len(blocks)} blocks in {seconds:.1f} s, cached at {cache.path}")
            self._val_blocks = blocks
        return self._val_blocks

    def _validation_cache(self, source: DocumentSource, keep: str) -> BlockCache:
        hp = self.hparams
        key = {
            "layout": _VALIDATION_LAYOUT,
            "source": source.content_stamp(),
            "keep": keep,
            "tokenizer": self.tokenizer().to_str(),  # hashed with the rest: its content, not its name
            "seq_len": self.seq_len,
            "val_sequences": hp.val_sequences,
            "val_per_document": hp.val_per_document,
            "holdout_per_mille": hp.holdout_per_mille,
            "eos_id": self._eos_id(),
            "bos_id": None,  # documents have no BOS; kept in the key so the caches on disk keep matching
            "num_shards": _VALIDATION_SHARDS,
        }
        return BlockCache(key, "validation")  # under cache_root()

    def _build_validation_blocks(self, source: DocumentSource, keep: str) -> torch.Tensor:
        if self.hparams.val_per_document:  # spread_blocks warns of short documents and names what it refuses
            return spread_blocks(
                source, self.tokenizer(), self.seq_len, self.hparams.val_sequences, self._eos_id(),
                holdout=(self.hparams.holdout_per_mille, keep),
            )  # fmt: skip
        stream = self._stream(source, shuffle_buffer=0, epochs=1, keep=keep, num_shards=_VALIDATION_SHARDS)
        try:
            blocks = list(itertools.islice(stream, self.hparams.val_sequences))
        except DataError as error:  # the packer's words are about training readers; say what this is
            per_mille = self.hparams.holdout_per_mille
            held_out = f" ({per_mille} per mille held out of data.train)" if keep == "held_out" else ""
            raise DataError(
                f"validation: the documents of {source.path}{held_out} give no block of {self.seq_len + 1} tokens "
                f"when packed in {_VALIDATION_SHARDS} fixed shards: set data.valid to more text, raise "
                f"data.holdout_per_mille, set data.val_per_document: true, or lower data.seq_len ({error})"
            ) from error
        if len(blocks) < self.hparams.val_sequences:
            rank_zero_warn(
                f"validation data {source.path} holds only {len(blocks)} blocks of {self.seq_len + 1} tokens; "
                f"asked for {self.hparams.val_sequences}"
            )
        if not blocks:
            raise ValueError(f"no validation block of {self.seq_len + 1} tokens could be made from {source.path}")
        return torch.stack(blocks)

    def _shard_validation_blocks(self, shards: TokenShards) -> torch.Tensor:
        """The first ``val_sequences`` blocks of the shards' stream, or (``val_per_document``) an equal share
        from every document, each packed alone -- the blocks the text path makes from the same documents."""
        total, width = self.hparams.val_sequences, self.seq_len + 1
        where = f"{shards.folder} ({shards.split})"
        if self.hparams.val_per_document:
            documents = (shards.tokens(a, b) for a, b in shards.document_spans().tolist())
            return spread_document_blocks(documents, width, total, where)
        n = min(total, shards.block_count(width))
        if n == 0:
            raise DataError(
                f"no validation block of {width} tokens could be made from {where} ({shards.total} tokens, "
                f"{shards.documents} documents): set data.valid, or pretokenize with a larger --holdout-per-mille"
            )
        if n < total:
            rank_zero_warn(f"validation data {where} holds only {n} blocks of {width} tokens; asked for {total}")
        return torch.from_numpy(shards.blocks(np.arange(n), width))

    def _shared_validation_blocks(self) -> torch.Tensor:
        """The validation blocks on every rank: global rank 0 loads (or builds) them, the others receive them.

        Every rank calls this together (``val_dataloader``). Only rank 0 reads the data and the cache,
        so the cache folder need not be shared between nodes.
        """
        trainer = self.trainer
        if trainer is None or trainer.world_size == 1:
            return self.validation_blocks()
        if not self._val_shared:
            blocks = self.validation_blocks() if trainer.global_rank == 0 else None
            self._val_blocks = trainer.strategy.broadcast(blocks, src=0)
            self._val_shared = True
        return self._val_blocks

    def val_dataloader(self) -> DataLoader:
        rank, world = self._rank_world()
        blocks = self._shared_validation_blocks()
        per_rank = len(blocks) // world
        if per_rank == 0:
            raise ValueError(f"{len(blocks)} validation blocks cannot be shared by {world} ranks")
        if per_rank * world != len(blocks):
            rank_zero_info(f"validation uses {per_rank * world} of {len(blocks)} blocks (equal share per rank)")
        mine = blocks[rank * per_rank : (rank + 1) * per_rank]
        self.val_bytes_per_target = bytes_per_target(blocks[: per_rank * world], self.tokenizer())
        return DataLoader(_RankSlice(mine), batch_size=self.batch_size)

    def test_dataloader(self) -> DataLoader:
        return self.val_dataloader()

    # -- checkpoint state ---------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        # The tokenizer travels inside every checkpoint (~2 MB for SmolLM2's), so evaluation and
        # export need nothing but the checkpoint -- not the hub, nor a cache on the training machine.
        return {"tokenizer": self.tokenizer_path(), "tokenizer_json": self.tokenizer().to_str()}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        saved = state_dict.get("tokenizer_json")
        if saved is None:
            return
        if Tokenizer.from_str(saved).get_vocab() != self.tokenizer().get_vocab():
            raise ValueError(
                f"the checkpoint was trained with tokenizer {state_dict.get('tokenizer')!r}, whose vocabulary "
                f"differs from data.tokenizer {self.tokenizer_path()!r}: resuming would feed the model other ids"
            )
