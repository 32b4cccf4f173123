"""TextDataModule: training data and a fixed validation set, exactly resumable, from a source
(:func:`source_for`; a source's methods are those called on ``train_source`` below)."""

from __future__ import annotations

import functools
import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import lightning as L
import torch
from lightning.pytorch.utilities import rank_zero_info
from tokenizers import Tokenizer
from torch.utils.data import DataLoader, IterableDataset

from fixed_embed.config import NonNegativeInt, PerMille, PositiveInt
from fixed_embed.data.shard_source import TokenShardSource
from fixed_embed.data.text_stream import TextStreamSource
from fixed_embed.data.token_shards import shard_folder
from fixed_embed.data.tokenizer import kept_copy, load_tokenizer, tokenizer_mismatch
from fixed_embed.data.validation import bytes_per_target
from fixed_embed.errors import CheckpointError, ConfigError


def source_for(data: TextDataModule, role: str) -> TokenShardSource | TextStreamSource:
    """``data.<role>``'s source: a token-shard folder's, else the text stream's."""
    kind = TokenShardSource if shard_folder(data.hparams[role]) else TextStreamSource
    return kind(data, role)


@dataclass(eq=False)
class _RankSlice(IterableDataset):
    """This rank's share of the validation blocks: iterable, so Lightning adds no sampler."""

    blocks: torch.Tensor

    def __len__(self) -> int:
        return len(self.blocks)

    def __iter__(self) -> Iterator[torch.Tensor]:
        return iter(self.blocks)


class TextDataModule(L.LightningDataModule):
    """Packed ``seq_len + 1`` token blocks from a hub dataset, local files or token shards
    (docs/data.md).

    Args:
        train: local file / folder / glob, a hub dataset id, or a token-shard folder
        (``fixed-embed pretokenize``:
            resumable at any world size; text-stream options do not apply); ``None``: the
            offline default corpus.
        valid: where validation documents come from; ``None``: the default corpus's ``valid.jsonl``,
            or a hash hold-out of ``holdout_per_mille`` of ``train`` (a token-shard ``train``'s
            held-out shards).
        hub_name: the config name of a hub dataset.
        train_split: the split a hub ``train`` is read from.
        valid_split: the split a hub ``valid`` is read from.
        text_field: the field holding each document's text.
        tokenizer: a hub id, ``tokenizer.json`` or folder; ``None``: a cached BPE trained on
        ``train``, or the shards'. tokenizer_vocab_size: the size of that BPE.
        seq_len: prediction targets per sequence (blocks are ``seq_len + 1`` tokens).
        batch_size: sequences per device per micro-batch.
        num_workers: loader worker processes per device.
        num_shards: virtual shards of the training stream (``null``: one per reader; raised to
        ranks x workers);
            up to that many readers, the blocks do not depend on the world size.
        shuffle_buffer: blocks held for a seeded shuffle (0: stream order).
        seed: the data-order seed; ``None``: the training seed (the default, 0, keeps batches
        across training seeds). shuffle_documents: read local files as one seeded permutation of
        all their documents. passage_chars: first cut documents at paragraph breaks into
        passages of at least this many characters. tokenize_batch: documents tokenized together
        (part of the resume check). val_sequences: validation blocks in total, split equally
        over ranks; cached. val_per_document: draw blocks equally from every validation
        document, not the stream's first ``val_sequences``. holdout_per_mille: documents (per
        mille, by hash) training skips; without ``valid``, the validation set.
    """

    def __init__(
        self,
        train: str | None = None,
        valid: str | None = None,
        hub_name: str | None = None,
        train_split: str = "train",
        valid_split: str = "validation",
        text_field: str = "text",
        tokenizer: str | None = None,
        tokenizer_vocab_size: PositiveInt = 8192,
        seq_len: PositiveInt = 2048,
        batch_size: PositiveInt = 8,
        num_workers: NonNegativeInt = 0,
        num_shards: PositiveInt | None = 64,
        shuffle_buffer: NonNegativeInt = 256,
        seed: NonNegativeInt | None = 0,
        shuffle_documents: bool = False,
        passage_chars: PositiveInt | None = None,
        tokenize_batch: PositiveInt = 64,
        val_sequences: PositiveInt = 64,
        val_per_document: bool = False,
        holdout_per_mille: PerMille = 10,
    ) -> None:
        super().__init__()
        self.save_hyperparameters()
        if passage_chars is not None and train is not None and valid is None:
            raise ConfigError(
                "data.passage_chars needs a separate validation source (data.valid): with a hash "
                "hold-out of "
                f"data.train ({train}), passages of one document would fall on both sides; set "
                "data.valid, or "
                "data.passage_chars: null"
            )
        self.seq_len, self.batch_size, self.num_workers = seq_len, batch_size, num_workers
        self._val_blocks: torch.Tensor | None = None
        self._val_shared = False  # every rank holds the blocks rank 0 loaded or built
        self.val_bytes_per_target: float | None = (
            None  # of the blocks validation uses, for bits per byte
        )
        self.train_source = source_for(self, "train")
        self.valid_source = None if valid is None else source_for(self, "valid")
        self._sources = [s for s in (self.train_source, self.valid_source) if s is not None]

    @property
    def seed(self) -> int:
        """``data.seed``, else the training seed ``seed_everything`` set (else 0)."""
        return (
            self.hparams.seed
            if self.hparams.seed is not None
            else int(os.environ.get("PL_GLOBAL_SEED", 0))
        )

    @functools.cached_property
    def tokenizer_path(self) -> str:
        """``data.tokenizer``, else the training source's own (a BPE trained once and cached, or
        the shards')."""
        return self.hparams.tokenizer or self.train_source.default_tokenizer()

    @functools.cached_property
    def tokenizer(self) -> Tokenizer:
        return load_tokenizer(self.tokenizer_path)

    def check_inputs(self) -> None:
        """The configured files, shards and tokenizer exist and read, before any work (the CLI's
        preflight)."""
        for source in self._sources:
            source.check_inputs()
        if self.hparams.tokenizer is not None:
            load_tokenizer(self.hparams.tokenizer)

    def setup(self, stage: str) -> None:
        module = self.trainer.lightning_module if self.trainer else None
        model_vocab = getattr(getattr(module, "config", None), "vocab_size", None)
        vocab = self.tokenizer.get_vocab_size()
        # larger is harmless: the extra ids never occur
        if model_vocab is not None and model_vocab < vocab:
            raise ConfigError(
                f"model vocab_size {model_vocab} is smaller than the tokenizer's {vocab} "
                f"({self.tokenizer_path}); "
                f"set --model.decoder.vocab_size {vocab}"
            )
        if model_vocab is not None and model_vocab > vocab:
            rank_zero_info(
                f"model vocab_size {model_vocab} > the tokenizer's {vocab}: ids "
                f"{vocab}..{model_vocab - 1} "
                f"never occur (--model.decoder.vocab_size {vocab} builds the exact model)"
            )
        for source in self._sources:
            source.check()

    def _rank_world(self) -> tuple[int, int]:
        trainer = self.trainer
        return (trainer.global_rank, trainer.world_size) if trainer is not None else (0, 1)

    def train_dataloader(self) -> DataLoader:
        rank, world = self._rank_world()
        trainer = self.trainer
        length = None
        if trainer is not None and trainer.max_steps > 0:
            length = trainer.max_steps * trainer.accumulate_grad_batches * self.batch_size
        # Page-locked batches on CUDA: the host-to-device copy then runs asynchronously, off the
        # step's path.
        pin_memory = trainer is not None and trainer.strategy.root_device.type == "cuda"
        return self.train_source.train_loader(rank, world, length, pin_memory)

    def validation_blocks(self) -> torch.Tensor:
        """All ``val_sequences`` validation blocks: ``data.valid``'s, else ``data.train``'s
        hold-out. No collective."""
        if self._val_blocks is None:
            source = self.valid_source or self.train_source
            self._val_blocks = source.validation_blocks(held_out=self.valid_source is None)
        return self._val_blocks

    def val_dataloader(self) -> DataLoader:
        rank, world = self._rank_world()
        if (
            world > 1 and not self._val_shared
        ):  # only rank 0 reads the data and the cache: no shared folder needed
            blocks = self.validation_blocks() if rank == 0 else None
            self._val_blocks, self._val_shared = (
                self.trainer.strategy.broadcast(blocks, src=0),
                True,
            )
        blocks = self.validation_blocks()
        per_rank = len(blocks) // world
        if per_rank == 0:
            raise ValueError(f"{len(blocks)} validation blocks cannot be shared by {world} ranks")
        if per_rank * world != len(blocks):
            rank_zero_info(
                f"validation uses {per_rank * world} of {len(blocks)} blocks (equal share per rank)"
            )
        self.val_bytes_per_target = bytes_per_target(blocks[: per_rank * world], self.tokenizer)
        return DataLoader(
            _RankSlice(blocks[rank * per_rank : (rank + 1) * per_rank]), batch_size=self.batch_size
        )

    test_dataloader = val_dataloader

    def state_dict(self) -> dict[str, Any]:
        # The tokenizer travels in every checkpoint (~2 MB), so evaluation and export need only the
        # checkpoint.
        return {"tokenizer": self.tokenizer_path, "tokenizer_json": self.tokenizer.to_str()}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        # validate and test take no data position: this is their check (a fit's: resume_refusals)
        if why := self._tokenizer_refusal(state_dict):
            raise CheckpointError(why)

    def _tokenizer_refusal(self, saved: dict[str, Any]) -> str | None:
        if "tokenizer_json" not in saved:
            return None
        then = Tokenizer.from_str(saved["tokenizer_json"])
        why = tokenizer_mismatch(
            then,
            f"the checkpoint's tokenizer {saved.get('tokenizer')!r}",
            self.tokenizer,
            f"data.tokenizer {self.tokenizer_path!r}",
        )
        return why and (  # the run's own tokenizer kept in the cache only for a refusal
            f"refusing to resume: {why}: resuming would feed the model other ids. Resume with the "
            "checkpoint's own "
            f"(set data.tokenizer: {kept_copy(then)}), or start a new run (--run NAME)"
        )

    def resume_refusals(self, checkpoint: dict[str, Any], world_size: int | None) -> list[str]:
        """Every reason this data cannot resume ``checkpoint`` on ``world_size`` ranks
        (``None``: not known yet)."""
        why = self._tokenizer_refusal(checkpoint.get(type(self).__qualname__) or {})
        return ([why] if why else []) + self.train_source.position_refusals(checkpoint, world_size)
