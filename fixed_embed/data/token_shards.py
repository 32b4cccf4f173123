"""Token shards on disk (``fixed-embed pretokenize``): the index, its checks, memory-mapped
reads (docs/data.md)."""

from __future__ import annotations

import functools
import hashlib
import json
import os
from pathlib import Path
from typing import Any

import numpy as np
from lightning.pytorch.utilities import rank_zero_warn
from tokenizers import Tokenizer

from fixed_embed.data.tokenizer import load_tokenizer, tokenizer_fingerprint, tokenizer_mismatch
from fixed_embed.distributed.ranks import is_node_leader
from fixed_embed.errors import ConfigError, DataError, MissingFileError

INDEX = "token_shards.json"
TOKENIZER_FILE = "tokenizer.json"
FORMAT = "fixed-embed token shards"
VERSION = 1
SPLITS = ("train", "held_out")
_DTYPES = ("uint16", "uint32")


def token_dtype(vocab_size: int) -> str:
    return "uint16" if vocab_size <= 65_535 else "uint32"


def checksum(path: Path) -> str:  # a shard's, as the index records it (docs/data.md, "Checks")
    return hashlib.sha256(np.memmap(path, dtype=np.uint8, mode="r")).hexdigest()


# once per process: a fit's pre-flight check and its data module read the same shards
@functools.cache
def _matches(path: str, size: int, mtime_ns: int, sha256: str) -> bool:
    """Whether the shard hashes to ``sha256``, on one process per node (the other ranks read the
    same files)."""
    return not is_node_leader() or checksum(Path(path)) == sha256


def _identity(path: Path) -> tuple[int, ...]:
    """The file behind ``path`` and its version: replaced (a new inode) or written in place
    (mtime), it differs; not ctime, which a chmod, chown or hard link of a backup also moves."""
    try:
        stat = path.stat()
    except FileNotFoundError:
        return ()
    return stat.st_dev, stat.st_ino, stat.st_size, stat.st_mtime_ns


def shard_folder(path: str | os.PathLike | None) -> Path | None:
    """``path`` as a token-shard folder (one holding the index), or ``None``; ``.bin`` files
    without it are refused."""
    if path is None or not (folder := Path(path).expanduser()).is_dir():
        return None
    if (folder / INDEX).is_file():
        return folder
    if any(folder.glob("*.bin")):
        raise DataError(
            f"{path} holds token shards (.bin) but no index {INDEX}: an unfinished `fixed-embed "
            "pretokenize`; "
            "run it again with the same arguments to finish it (finished shards are kept)"
        )
    return None


def read_index(folder: Path) -> dict[str, Any]:
    path = folder / INDEX
    if not path.is_file():
        raise MissingFileError(
            f"{folder} has no token-shard index {INDEX}; write one with `fixed-embed pretokenize`"
        )
    try:
        index = json.loads(path.read_text())
    except (OSError, ValueError) as error:
        raise DataError(
            f"{path} is not a readable token-shard index ({error}); run `fixed-embed pretokenize` "
            "again"
        ) from error
    if not isinstance(index, dict) or index.get("format") != FORMAT:
        raise DataError(f"{path} is not a {FORMAT!r} index; run `fixed-embed pretokenize` again")
    if index.get("version") != VERSION:
        raise DataError(
            f"{path} is token-shard format version {index.get('version')}, this version reads "
            f"{VERSION}; "
            "run `fixed-embed pretokenize` again"
        )
    return index


class TokenShards:
    """One split (``train`` or ``held_out``) of a token-shard folder: its shards memory-mapped
    end to end, checked against the index at construction (sizes and SHA-256: a shard written
    over in place is refused)."""

    def __init__(self, folder: str | os.PathLike, split: str = "train") -> None:
        self.folder, self.split = Path(folder).expanduser(), split
        self.tokenizer_file = self.folder / TOKENIZER_FILE
        self.index = read_index(self.folder)
        entries = self.index.get("shards", {}).get(split, [])
        self.dtype = np.dtype(self._check_dtype(entries))
        if any("sha256" not in entry for entry in entries):  # an index written before checksums
            rank_zero_warn(
                f"{self.folder / INDEX} has no shard checksums: only sizes are checked; "
                "pretokenize --overwrite adds them"
            )
        self.files = [self.folder / entry["file"] for entry in entries]
        self._identities = [
            self._check_shard(e, p) for e, p in zip(entries, self.files, strict=True)
        ]
        self.documents = sum(entry.get("documents", 0) for entry in entries)
        counts = [entry["tokens"] for entry in entries]
        # token offset of each shard
        self.starts = np.concatenate([[0], np.cumsum(counts, dtype=np.int64)])
        self.total = int(self.starts[-1])
        self._maps: list[np.memmap | None] = [None] * len(self.files)

    def _check_dtype(self, entries: list[dict[str, Any]]) -> str:
        """The one dtype of the index and its ``entries`` (pretokenize's choice for the
        vocabulary)."""
        where, dtype = self.folder / INDEX, self.index.get("dtype")
        if dtype not in _DTYPES:
            raise DataError(f"{where}: dtype {dtype!r} is not one of {sorted(_DTYPES)}")
        if (
            len(kinds := sorted({str(entry.get("dtype", dtype)) for entry in entries} | {dtype}))
            > 1
        ):
            raise DataError(
                f"{where} mixes dtypes {kinds} across its shards (shards of two pretokenize "
                "runs?): one folder holds one dtype; run `fixed-embed pretokenize --overwrite` "
                "into it, or use separate folders"
            )
        return dtype

    def _check_shard(self, entry: dict[str, Any], path: Path) -> tuple[int, ...]:
        """The shard ``path`` of index ``entry`` as the index says (size, SHA-256); its
        identity."""
        tokens, where = entry["tokens"], self.folder / INDEX
        if not path.is_file():
            raise MissingFileError(
                f"token shard {path} listed in {where} is missing; copy the whole folder"
            )
        size, expected = path.stat().st_size, tokens * self.dtype.itemsize
        if tokens == 0 or size == 0:
            raise DataError(
                f"token shard {path} is empty; the index lists only shards with tokens: rewrite it"
            )
        if size != expected:
            state = "truncated" if size < expected else "longer than its index entry"
            raise DataError(
                f"token shard {path} is {state}: {size:,} bytes, the index says {tokens:,} "
                f"{self.dtype.name} tokens ({expected:,} bytes); copy it again or rerun "
                "pretokenize with --overwrite"
            )
        if "sha256" in entry and not _matches(
            str(path), size, path.stat().st_mtime_ns, entry["sha256"]
        ):
            raise DataError(
                f"token shard {path} does not match its SHA-256 in {where} (changed since "
                "pretokenize wrote it): copy it again or rerun pretokenize with --overwrite"
            )
        return _identity(path)

    @property
    def holdout_per_mille(self) -> int:
        return self.index["holdout"]["per_mille"]

    def check_tokenizer(self, tokenizer: Tokenizer, spec: str) -> None:
        """Refuse a tokenizer (data.tokenizer ``spec``) other than the one these ids were made with
        (its fingerprint: its EOS id with it)."""
        written = self.index["tokenizer"]
        if written["fingerprint"] != (fingerprint := tokenizer_fingerprint(tokenizer)):
            own, made = load_tokenizer(self.tokenizer_file), f"tokenizer {written.get('spec')}"
            why = tokenizer_mismatch(own, made, tokenizer, f"data.tokenizer {spec}")
            fix = f"set data.tokenizer: {self.tokenizer_file} (or null)"
            if tokenizer_fingerprint(own) != written["fingerprint"]:  # their own copy changed too
                why = (
                    f"{made} ({written['fingerprint'][:12]}), not data.tokenizer {spec} "
                    f"({fingerprint[:12]})"
                )
                fix = f"restore {self.tokenizer_file} (changed since pretokenize wrote it)"
            raise DataError(
                f"the token shards {self.folder} were written with another tokenizer: {why}: their "
                "ids would mean "
                f"other tokens; {fix}, or pretokenize again with data.tokenizer"
            )

    def check_holdout(self, per_mille: int) -> None:
        if per_mille != self.holdout_per_mille:
            raise ConfigError(
                f"the token shards {self.folder} hold out {self.holdout_per_mille} per mille of "
                "the documents "
                f"(pretokenize --holdout-per-mille), data.holdout_per_mille is {per_mille}: set "
                f"data.holdout_per_mille: {self.holdout_per_mille}, or pretokenize again"
            )

    def fingerprint(self) -> dict[str, Any]:
        """What identifies this split's stream for the resume check (not the folder's path: a
        moved copy resumes)."""
        digest = hashlib.sha256(json.dumps(self.index, sort_keys=True).encode()).hexdigest()
        return {"token_shards_index_sha256": digest, "split": self.split, "tokens": self.total}

    def _map(self, i: int) -> np.memmap:
        # mapped, the checked file stays readable whatever replaces its name later
        if self._maps[i] is None:
            if _identity(self.files[i]) != self._identities[i]:  # replaced since the check
                raise DataError(
                    f"token shard {self.files[i]} was replaced after this run checked it (another "
                    "pretokenize into "
                    f"{self.folder}?); its ids may be another tokenizer's: relaunch once the "
                    "folder is final"
                )
            self._maps[i] = np.memmap(self.files[i], dtype=self.dtype, mode="r")
        return self._maps[i]

    def __getstate__(self) -> dict[str, Any]:  # to a loader worker: the maps are reopened there
        return {**self.__dict__, "_maps": [None] * len(self.files)}

    def tokens(self, start: int, stop: int) -> np.ndarray:
        """Tokens ``[start, stop)`` of the split's stream (a copy)."""
        parts, i = [], np.searchsorted(self.starts, start, side="right") - 1
        while start < stop or not parts:
            end = min(stop, self.starts[i + 1])
            parts.append(self._map(i)[start - self.starts[i] : end - self.starts[i]])
            start, i = end, i + 1
        return np.concatenate(parts)

    def block_count(self, block_len: int) -> int:
        """Blocks of ``block_len`` tokens the stream packs into (the remainder, < one block, is
        never read)."""
        return self.total // block_len

    def blocks(self, indices: np.ndarray, block_len: int) -> np.ndarray:
        """Blocks ``indices`` (in stream order) as an ``int64`` array ``[len(indices),
        block_len]``."""
        blocks = [self.tokens(b * block_len, (b + 1) * block_len) for b in indices.tolist()]
        out = np.stack(blocks).astype(np.int64)
        # named here, not by the model
        if out.max() >= (vocab := self.index["vocab_size"]):
            row, col = np.argwhere(out >= vocab)[0].tolist()
            shard = self.files[
                np.searchsorted(self.starts, indices[row] * block_len + col, "right") - 1
            ]
            raise DataError(
                f"token shard {shard}: block {indices[row]} holds id {out[row, col]}, outside the "
                "vocabulary of "
                f"{vocab}; rerun pretokenize with --overwrite"
            )
        return out

    def document_spans(self) -> np.ndarray:
        """``[start, stop)`` of every document (its tokens and EOS) in the stream, as an array
        ``[D, 2]``."""
        ends = (
            np.flatnonzero(self._map(i) == self.index["eos_id"]) + self.starts[i] + 1
            for i in range(len(self.files))
        )
        stops = np.concatenate([np.zeros(0, np.int64), *ends])
        return np.stack([np.concatenate([[0], stops])[:-1], stops], axis=1)
