"""TextDataModule: streamed, packed, sharded, exactly resumable training data and a fixed validation set."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from typing import Any

import lightning as L
import torch
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn
from tokenizers import Tokenizer
from torch.utils.data import DataLoader, IterableDataset
from torchdata.stateful_dataloader import StatefulDataLoader

from fixed_embed.data.corpus import cache_root, default_corpus
from fixed_embed.data.packing import PackedBlocks
from fixed_embed.data.sources import DocumentSource
from fixed_embed.data.tokenizer import EOS, load_tokenizer, special_token_id, train_bpe

__all__ = ["TextDataModule"]


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

    Args:
        train: local file / folder / glob, or a hub dataset id. ``None``: the offline default
            corpus (Python's own documentation text, built and cached on first use).
        valid: where validation documents come from; ``None``: the default corpus's
            ``valid.jsonl``, or a hash-based hold-out of ``holdout_per_mille`` of ``train``.
        hub_name, train_split, valid_split: config name and splits of a hub dataset.
        text_field: the field holding each document's text.
        tokenizer: a hub id, ``tokenizer.json`` or a folder; ``None``: a byte-level BPE of
            ``tokenizer_vocab_size`` trained on ``train`` (cached).
        seq_len: prediction targets per sequence (blocks are ``seq_len + 1`` tokens).
        batch_size: sequences per device per micro-batch.
        num_workers: loader worker processes per device.
        num_shards: virtual shards; ranks x workers must not exceed it.
        shuffle_buffer: blocks held for a seeded shuffle (0: stream order).
        seed: shuffle seed.
        val_sequences: validation blocks in total (split equally over ranks).
        bos_token: prepended to each document when set; EOS (``eos_token``) always ends one.
        allow_larger_model_vocab: accept a model vocabulary larger than the tokenizer's.
        txt_sample_by: how ``.txt`` files split into documents (document / paragraph / line).
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
        tokenizer_vocab_size: int = 8192,
        seq_len: int = 2048,
        batch_size: int = 8,
        num_workers: int = 0,
        num_shards: int = 64,
        shuffle_buffer: int = 256,
        seed: int = 0,
        val_sequences: int = 64,
        holdout_per_mille: int = 10,
        bos_token: str | None = None,
        eos_token: str = EOS,
        allow_larger_model_vocab: bool = False,
        txt_sample_by: str = "document",
        tokenize_batch: int = 64,
    ) -> None:
        super().__init__()
        if seq_len < 1 or batch_size < 1 or num_workers < 0 or val_sequences < 0:
            raise ValueError(
                f"need seq_len >= 1, batch_size >= 1, num_workers >= 0, val_sequences >= 0; got {seq_len}, "
                f"{batch_size}, {num_workers}, {val_sequences}"
            )
        self.save_hyperparameters()
        self.seq_len, self.batch_size, self.num_workers = seq_len, batch_size, num_workers
        self._val_blocks: torch.Tensor | None = None
        self._tokenizer_path: str | None = None
        self._loaded_tokenizer = None

    # -- sources and tokenizer ----------------------------------------------------------------

    def _train_source(self) -> DocumentSource:
        hp = self.hparams
        path = hp.train if hp.train is not None else str(default_corpus() / "train.jsonl")
        return DocumentSource(path, hp.train_split, hp.hub_name, hp.text_field, hp.txt_sample_by)

    def _valid_source(self) -> tuple[DocumentSource, str]:
        """The validation documents and whether they are a hold-out of ``train`` ("held_out") or not."""
        hp = self.hparams
        if hp.valid is not None:
            return DocumentSource(hp.valid, hp.valid_split, hp.hub_name, hp.text_field, hp.txt_sample_by), "train"
        if hp.train is None:
            return DocumentSource(str(default_corpus() / "valid.jsonl"), text_field="text"), "train"
        return self._train_source(), "held_out"

    def tokenizer_path(self) -> str:
        """The tokenizer to use, training (once, cached) the default BPE when none is configured."""
        if self._tokenizer_path is None:
            self._tokenizer_path = self._resolve_tokenizer_path()
        return self._tokenizer_path

    def tokenizer(self) -> Tokenizer:
        """The tokenizer (loaded once)."""
        if self._loaded_tokenizer is None:
            self._loaded_tokenizer = load_tokenizer(self.tokenizer_path())
        return self._loaded_tokenizer

    def _resolve_tokenizer_path(self) -> str:
        hp = self.hparams
        if hp.tokenizer is not None:
            return hp.tokenizer
        source = self._train_source()
        fingerprint = repr(source.fingerprint())
        digest = hashlib.sha256(fingerprint.encode()).hexdigest()[:16]
        out = cache_root() / "tokenizers" / f"bpe-{hp.tokenizer_vocab_size}-{digest}"
        texts = (row[hp.text_field] for row in source.open())
        return str(train_bpe(texts, hp.tokenizer_vocab_size, out, fingerprint))

    def vocab_size(self) -> int:
        return self.tokenizer().get_vocab_size()

    def _check_vocab(self) -> None:
        module = self.trainer.lightning_module if self.trainer else None
        model_vocab = getattr(getattr(module, "config", None), "vocab_size", None)
        if model_vocab is None:
            return
        tokenizer_vocab = self.vocab_size()
        if model_vocab < tokenizer_vocab or (
            model_vocab > tokenizer_vocab and not self.hparams.allow_larger_model_vocab
        ):
            raise ValueError(
                f"model vocab_size {model_vocab} does not match the tokenizer's {tokenizer_vocab} "
                f"({self.tokenizer_path()}); set model.decoder.vocab_size: {tokenizer_vocab}"
                + ("" if model_vocab < tokenizer_vocab else " or data.allow_larger_model_vocab: true")
            )

    def _stream(self, source: DocumentSource, **kwargs) -> PackedBlocks:
        hp = self.hparams
        tokenizer = self.tokenizer()
        return PackedBlocks(
            source,
            self.tokenizer_path(),
            self.seq_len,
            eos_id=special_token_id(tokenizer, hp.eos_token),
            bos_id=special_token_id(tokenizer, hp.bos_token) if hp.bos_token else None,
            num_shards=hp.num_shards,
            seed=hp.seed,
            holdout_per_mille=hp.holdout_per_mille,
            tokenize_batch=hp.tokenize_batch,
            **kwargs,
        )

    # -- Lightning hooks ------------------------------------------------------------------------

    def _rank_world(self) -> tuple[int, int]:
        trainer = self.trainer
        return (trainer.global_rank, trainer.world_size) if trainer is not None else (0, 1)

    def setup(self, stage: str) -> None:
        self._check_vocab()

    def train_dataloader(self) -> StatefulDataLoader:
        rank, world = self._rank_world()
        trainer = self.trainer
        length = None
        if trainer is not None and trainer.max_steps and trainer.max_steps > 0:
            length = trainer.max_steps * trainer.accumulate_grad_batches * self.batch_size
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
        )

    def validation_blocks(self) -> torch.Tensor:
        """All ``val_sequences`` validation blocks (identical for every variant, run and rank)."""
        if self._val_blocks is None:
            source, keep = self._valid_source()
            stream = self._stream(source, shuffle_buffer=0, epochs=1, keep=keep)
            blocks = []
            for block in stream:
                if len(blocks) == self.hparams.val_sequences:
                    break
                blocks.append(block)
            if len(blocks) < self.hparams.val_sequences:
                rank_zero_warn(
                    f"validation data {source.path} holds only {len(blocks)} blocks of {self.seq_len + 1} tokens; "
                    f"asked for {self.hparams.val_sequences}"
                )
            if not blocks:
                raise ValueError(f"no validation block of {self.seq_len + 1} tokens could be made from {source.path}")
            self._val_blocks = torch.stack(blocks)
        return self._val_blocks

    def val_dataloader(self) -> DataLoader:
        rank, world = self._rank_world()
        blocks = self.validation_blocks()
        per_rank = len(blocks) // world
        if per_rank == 0:
            raise ValueError(f"{len(blocks)} validation blocks cannot be shared by {world} ranks")
        if per_rank * world != len(blocks):
            rank_zero_info(f"validation uses {per_rank * world} of {len(blocks)} blocks (equal share per rank)")
        mine = blocks[rank * per_rank : (rank + 1) * per_rank]
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
