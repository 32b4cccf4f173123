"""Document sources: a hub dataset or local files, always streamed through Hugging Face ``datasets``."""

from __future__ import annotations

import glob
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import datasets

from fixed_embed.errors import DataError

__all__ = ["DocumentSource", "resolve_files"]

_BUILDERS = {".txt": "text", ".jsonl": "json", ".json": "json", ".parquet": "parquet"}


def resolve_files(pattern: str) -> list[str]:
    """Files for a path, a folder (its supported files) or a glob; errors name what was looked for."""
    path = Path(pattern).expanduser()
    if path.is_dir():
        files = sorted(str(p) for p in path.iterdir() if p.suffix in _BUILDERS)
        if not files:
            raise FileNotFoundError(f"folder {pattern} holds no {'/'.join(_BUILDERS)} files")
        return files
    if any(ch in pattern for ch in "*?["):
        files = sorted(glob.glob(os.path.expanduser(pattern), recursive=True))
        if not files:
            raise FileNotFoundError(f"glob {pattern!r} matches no file")
        return files
    if not path.is_file():
        raise FileNotFoundError(f"data file not found: {pattern}")
    return [str(path)]


@dataclass(frozen=True)
class DocumentSource:
    """Where documents come from.

    ``path`` is a local file, folder or glob (``.txt``, ``.jsonl``/``.json``, ``.parquet``) or a
    hub dataset id (``HuggingFaceFW/fineweb-edu``, with ``name`` for the config and ``split``).
    ``.txt`` files are split into documents by ``txt_sample_by`` (``document``: one file, one
    document; ``paragraph``: blank-line separated; ``line``).

    The stream's shards (``open().num_shards``) are its files, in sorted order, for local data
    and the hub dataset's own shards for a hub id; ``PackedBlocks`` gives each reader whole shards
    where it can, so a reader opens only its share of them.
    """

    path: str
    split: str = "train"
    name: str | None = None
    text_field: str = "text"
    txt_sample_by: str = "document"

    @property
    def is_local(self) -> bool:
        p = self.path
        return (
            Path(p).expanduser().exists()
            or any(ch in p for ch in "*?[")
            or p.startswith((".", "/", "~"))
            or Path(p).suffix in _BUILDERS
        )

    def fingerprint(self) -> dict[str, Any]:
        """What identifies the data, for the resume check (files with their sizes, or the hub id)."""
        if self.is_local:
            files = resolve_files(self.path)
            return {"files": [[f, os.path.getsize(f)] for f in files], "text_field": self.text_field}
        return {"hub": self.path, "name": self.name, "split": self.split, "text_field": self.text_field}

    def content_stamp(self) -> dict[str, Any]:
        """``fingerprint`` plus what else changes the documents (file modification times, how .txt
        splits): the key of caches built from them. A hub source is its id, config and split."""
        stamp = {**self.fingerprint(), "txt_sample_by": self.txt_sample_by}
        if "files" in stamp:
            stamp["mtimes"] = [os.stat(f).st_mtime_ns for f, _ in stamp["files"]]
        return stamp

    def open(self) -> datasets.IterableDataset:
        """A fresh streaming dataset of the documents (resumable with its ``state_dict``)."""
        if self.is_local:
            files = resolve_files(self.path)
            suffixes = {Path(f).suffix for f in files}
            unknown = suffixes - set(_BUILDERS)
            if unknown or len({_BUILDERS[s] for s in suffixes - unknown}) != 1:
                raise ValueError(
                    f"{self.path} must match files of one kind among {sorted(_BUILDERS)}, got {sorted(suffixes)}"
                )
            if all(os.path.getsize(f) == 0 for f in files):
                raise DataError(f"{self.path}: every file is empty ({len(files)} file(s)); point data at documents")
            builder = _BUILDERS[suffixes.pop()]
            # Undecodable bytes in text files become U+FFFD (counted by the packer), never a crash.
            kwargs = {"sample_by": self.txt_sample_by, "encoding_errors": "replace"} if builder == "text" else {}
            ds = datasets.load_dataset(builder, data_files=files, split="train", streaming=True, **kwargs)
        else:
            try:
                ds = datasets.load_dataset(self.path, self.name, split=self.split, streaming=True)
            except Exception as error:  # network, auth and missing-dataset errors have many types
                raise OSError(
                    f"could not open hub dataset {self.path!r} (name={self.name}, split={self.split}): "
                    f"{type(error).__name__}: {error}. Without network access, point data at local files "
                    "(.txt, .jsonl, .parquet), e.g. ../shared/data/gutenberg-prose/train.jsonl"
                ) from error
        fields = list(ds.features or {})
        if ds.features is not None and self.text_field not in fields:
            raise KeyError(f"text field {self.text_field!r} not found in {self.path}; fields are {fields}")
        return ds
