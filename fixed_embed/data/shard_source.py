"""The token-shard source: a ``fixed-embed pretokenize`` folder, memory-mapped in a global order
(any-world resume)."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn

from fixed_embed.data.block_order import GLOBAL_POSITION, RankBatches, TokenBlockLoader
from fixed_embed.data.loader_state import find_states, fingerprint_refusal, saved_loader_state
from fixed_embed.data.source_settings import SourceSettings
from fixed_embed.data.token_shards import TokenShards, shard_folder
from fixed_embed.data.validation import spread_blocks
from fixed_embed.errors import DataError


class TokenShardSource:
    """``data.train`` (``role`` "train") or ``data.valid`` ("valid") as a token-shard folder."""

    def __init__(self, data: SourceSettings, role: str) -> None:
        self.data, self.role = data, role
        self.folder = shard_folder(data.hparams[role])
        self._splits: dict[str, TokenShards] = {}

    def shards(self, split: str = "train") -> TokenShards:
        if split not in self._splits:  # checked against the index on first use
            self._splits[split] = TokenShards(self.folder, split)
        return self._splits[split]

    def default_tokenizer(self) -> str:
        # the shards carry the tokenizer they were made with
        return str(self.shards().tokenizer_file)

    def check_inputs(self) -> None:
        self.shards()

    def check(self) -> None:
        """The shards must have been written with this tokenizer (and, for training, this
        hold-out)."""
        data = self.data
        self.shards().check_tokenizer(data.tokenizer, data.tokenizer_path)
        if self.role == "train":
            self.shards().check_holdout(data.hparams.holdout_per_mille)

    def order(self, rank: int = 0, world: int = 1, batches: int | None = None) -> RankBatches:
        data = self.data
        return RankBatches(
            self.shards(), data.seq_len, data.batch_size, data.seed, rank, world, length=batches
        )

    def train_loader(
        self, rank: int, world: int, length: int | None, pin_memory: bool
    ) -> TokenBlockLoader:
        dataset = self.order(rank, world, -(-length // self.data.batch_size) if length else 2**62)
        shards = self.shards()
        rank_zero_info(
            f"data: token shards {shards.folder}: {dataset.order.blocks:,} blocks of "
            f"{self.data.seq_len + 1} tokens ({shards.total:,} tokens, {shards.documents:,} "
            f"documents) in a global order (seed {self.data.seed}), {world} ranks x "
            f"{self.data.batch_size} per global batch; resumable at any world size"
        )
        return TokenBlockLoader(dataset, num_workers=self.data.num_workers, pin_memory=pin_memory)

    def position_refusals(self, checkpoint: dict[str, Any], world_size: int | None) -> list[str]:
        """A token-shard position resumes at any world size, but only over the same shards,
        blocks and order."""
        state = saved_loader_state(checkpoint)
        if not (positions := find_states(state, GLOBAL_POSITION)):
            if not find_states(state, "reader"):
                return []
            return [
                "refusing to resume: the checkpoint's data position is a text stream's (data.train "
                "was text files or "
                f"a hub id), and data.train is now the token shards {self.folder}; resume with the "
                "run's own "
                "data.train, or start a new run (--run NAME)"
            ]
        if len(consumed := sorted({position[GLOBAL_POSITION] for position in positions})) > 1:
            return [
                "refusing to resume: the ranks' token-shard positions in the checkpoint differ "
                f"({consumed})"
            ]
        why = fingerprint_refusal(
            positions[0].get("fingerprint") or "{}", self.order().config_fingerprint()
        )
        return [why] if why else []

    def validation_blocks(self, held_out: bool) -> torch.Tensor:
        """The blocks the text source makes from the same documents (memory-mapped: no cache
        needed)."""
        shards = self.shards("held_out" if held_out else "train")
        total, width = self.data.hparams.val_sequences, self.data.seq_len + 1
        where = f"{shards.folder} ({shards.split})"
        if self.data.hparams.val_per_document:
            documents = (shards.tokens(a, b) for a, b in shards.document_spans().tolist())
            return spread_blocks(documents, width, total, where)
        n = min(total, shards.block_count(width))
        if n == 0:
            raise DataError(
                f"no validation block of {width} tokens could be made from {where} ({shards.total} "
                "tokens, "
                f"{shards.documents} documents): set data.valid, or pretokenize with a larger "
                "--holdout-per-mille"
            )
        if n < total:
            rank_zero_warn(
                f"validation data {where} holds only {n} blocks of {width} tokens; asked for "
                f"{total}"
            )
        return torch.from_numpy(shards.blocks(np.arange(n), width))
