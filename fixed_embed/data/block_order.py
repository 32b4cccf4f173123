"""Token shards' global seeded block order, each rank's slice of a global batch, its state
(docs/data.md, "Reading")."""

from __future__ import annotations

import functools
import itertools
import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from fixed_embed.data.token_shards import TokenShards
from fixed_embed.errors import DataError

# The key of the loader state that makes it world-independent (fixed_embed.data.loader_state looks
# for it).
GLOBAL_POSITION = "global_blocks_consumed"


@functools.lru_cache(maxsize=2)  # a batch spans at most two passes
def _permutation(blocks: int, seed: int, epoch: int) -> np.ndarray:
    perm = np.random.Generator(np.random.PCG64([seed, epoch])).permutation(blocks)
    return perm.astype(np.uint32 if blocks < 2**32 else np.int64)


@dataclass
class GlobalBlockOrder:
    """Global position -> block index: a seeded permutation of all ``blocks`` per pass."""

    blocks: int
    seed: int

    def __call__(self, positions: np.ndarray) -> np.ndarray:
        """The block at each global position."""
        epochs, within = np.divmod(positions, self.blocks)
        out = np.empty(len(positions), dtype=np.int64)
        for epoch in np.unique(epochs).tolist():
            mask = epochs == epoch
            out[mask] = _permutation(self.blocks, self.seed, epoch)[within[mask]]
        return out


@dataclass(eq=False)
class RankBatches(IterableDataset):
    """This rank's endless batches ``[batch_size, seq_len + 1]`` (int64) of the global order,
    from ``start``. ``length`` (batches) is what ``len`` reports, so Lightning does not fetch a
    batch ahead."""

    shards: TokenShards
    seq_len: int
    batch_size: int
    seed: int
    rank: int = 0
    world_size: int = 1
    start: int = 0
    length: int | None = None

    def __post_init__(self) -> None:
        self.block_len = self.seq_len + 1
        if (blocks := self.shards.block_count(self.block_len)) == 0:
            raise DataError(
                f"the {self.shards.split} token shards of {self.shards.folder} hold "
                f"{self.shards.total} tokens, less than one block of {self.block_len}: lower "
                "data.seq_len or pretokenize more text"
            )
        self.order = GlobalBlockOrder(blocks, self.seed)

    @property
    def global_batch(self) -> int:
        return self.batch_size * self.world_size

    def __len__(self) -> int:
        if self.length is None:
            raise TypeError("this RankBatches stream has no length")
        return self.length

    def batch(self, k: int) -> torch.Tensor:
        """This rank's ``k``-th batch after ``start``."""
        first = self.start + k * self.global_batch + self.rank * self.batch_size
        blocks = self.order(np.arange(first, first + self.batch_size, dtype=np.int64))
        return torch.from_numpy(self.shards.blocks(blocks, self.block_len))

    def __iter__(self) -> Iterator[torch.Tensor]:
        info = get_worker_info()
        workers, worker = (info.num_workers, info.id) if info else (1, 0)
        yield from map(self.batch, itertools.count(worker, workers))

    def config_fingerprint(self) -> dict[str, Any]:
        """What a saved position must have been made with (the world size and workers are not in
        it)."""
        return {
            **self.shards.fingerprint(),
            "seq_len": self.seq_len,
            "seed": self.seed,
            "order": "pcg64-per-pass",
        }


class TokenBlockLoader(DataLoader):
    """A ``DataLoader`` of :class:`RankBatches` whose state is the global position, counted as
    batches are handed out (the same on every rank; resumable at any world size and workers).
    Each ``iter()`` goes on from the last."""

    def __init__(self, dataset: RankBatches, num_workers: int = 0, **kwargs: Any) -> None:
        super().__init__(dataset, batch_size=None, num_workers=num_workers, **kwargs)
        self._consumed = dataset.start

    def __iter__(self) -> Iterator[torch.Tensor]:
        self.dataset.start = (
            self._consumed
        )  # workers are started by the iterator below, with this start
        for batch in super().__iter__():
            self._consumed += self.dataset.global_batch
            yield batch

    def state_dict(self) -> dict[str, Any]:
        fingerprint = json.dumps(self.dataset.config_fingerprint(), sort_keys=True)
        # global_batch: of the launch that saved it (for diagnostics)
        return {
            GLOBAL_POSITION: self._consumed,
            "fingerprint": fingerprint,
            "global_batch": self.dataset.global_batch,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        # the data module's resume check has refused another stream's position (TokenShardSource)
        self._consumed = self.dataset.start = state[GLOBAL_POSITION]
