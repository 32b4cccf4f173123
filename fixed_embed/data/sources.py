"""Document sources: a hub dataset or local files, always streamed through Hugging Face
``datasets``."""

from __future__ import annotations

import glob
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import datasets

from fixed_embed.errors import DataError

_BUILDERS = {".txt": "text", ".jsonl": "json", ".json": "json", ".parquet": "parquet"}


def resolve_files(pattern: str) -> list[str]:
    """Files for a path, a folder (its supported files) or a glob; errors name what was looked
    for."""
    path = Path(pattern).expanduser()
    if path.is_dir():
        if not (files := sorted(str(p) for p in path.iterdir() if p.suffix in _BUILDERS)):
            raise FileNotFoundError(f"folder {pattern} holds no {'/'.join(_BUILDERS)} files")
        return files
    if any(ch in pattern for ch in "*?["):
        if not (files := sorted(glob.glob(os.path.expanduser(pattern), recursive=True))):
            raise FileNotFoundError(f"glob {pattern!r} matches no file")
        return files
    if not path.is_file():
        raise FileNotFoundError(f"data file not found: {pattern}")
    return [str(path)]


@dataclass(frozen=True)
class DocumentSource:
    """Documents from a local file, folder or glob (``.txt``: one document each,
    ``.jsonl``/``.json``, ``.parquet``), or a hub id (``name``: its config); shards: the sorted
    files or the hub's. Reordering is for local files only."""

    path: str
    split: str = "train"
    name: str | None = None
    text_field: str = "text"
    passage_chars: int | None = None
    shuffle_seed: int | None = None

    def __post_init__(self) -> None:
        if (self.passage_chars is not None or self.shuffle_seed is not None) and not self.is_local:
            raise DataError(
                f"{self.path} is a hub stream: it is read in its shards' order and cannot be cut "
                "into passages or "
                "permuted (data.passage_chars / data.shuffle_documents); use data.shuffle_buffer, "
                "or local files"
            )

    @property
    def is_local(self) -> bool:
        p = self.path
        looks_local = (
            any(ch in p for ch in "*?[")
            or p.startswith((".", "/", "~"))
            or Path(p).suffix in _BUILDERS
        )
        return Path(p).expanduser().exists() or looks_local

    def fingerprint(self) -> dict[str, Any]:
        """What identifies the data, for the resume check (files with their sizes, or the hub
        id)."""
        if self.is_local:
            files = resolve_files(self.path)
            # order keys only when set: a stream without them matches checkpoints that lack them
            order = {
                key: getattr(self, key)
                for key in ("passage_chars", "shuffle_seed")
                if getattr(self, key) is not None
            }
            return {
                "files": [[f, os.path.getsize(f)] for f in files],
                "text_field": self.text_field,
                **order,
            }
        return {
            "hub": self.path,
            "name": self.name,
            "split": self.split,
            "text_field": self.text_field,
        }

    def content_stamp(self) -> dict[str, Any]:
        """``fingerprint`` plus file modification times: the key of caches built from the
        documents."""
        # "txt_sample_by" is a constant (a .txt file is one document), kept so caches on disk keep
        # matching
        stamp = {**self.fingerprint(), "txt_sample_by": "document"}
        if "files" in stamp:
            stamp["mtimes"] = [os.stat(f).st_mtime_ns for f, _ in stamp["files"]]
        return stamp

    def open(self) -> datasets.IterableDataset:
        """A fresh streaming dataset of the documents (resumable with its ``state_dict``)."""
        if self.is_local:
            files = resolve_files(self.path)
            suffixes = {Path(f).suffix for f in files}
            if not suffixes <= _BUILDERS.keys() or len({_BUILDERS[s] for s in suffixes}) != 1:
                raise ValueError(
                    f"{self.path} must match files of one kind among {sorted(_BUILDERS)}, got "
                    f"{sorted(suffixes)}"
                )
            if all(os.path.getsize(f) == 0 for f in files):
                raise DataError(
                    f"{self.path}: every file is empty ({len(files)} file(s)); point data at "
                    "documents"
                )
            builder = _BUILDERS[suffixes.pop()]
            # Undecodable bytes become U+FFFD (counted by the packer); one .txt file is one
            # document, not one per line.
            kwargs = (
                {"sample_by": "document", "encoding_errors": "replace"} if builder == "text" else {}
            )
            if self.passage_chars is None and self.shuffle_seed is None:
                ds = datasets.load_dataset(
                    builder, data_files=files, split="train", streaming=True, **kwargs
                )
            else:
                ds = self._reordered(builder, files, kwargs)
        else:
            try:
                ds = datasets.load_dataset(self.path, self.name, split=self.split, streaming=True)
            except Exception as error:  # network, auth and missing-dataset errors have many types
                raise OSError(
                    f"could not open hub dataset {self.path!r} (name={self.name}, "
                    f"split={self.split}): "
                    f"{type(error).__name__}: {error}. Without network access, point data at local "
                    "files "
                    "(.txt, .jsonl, .parquet), e.g. ../shared/data/gutenberg-prose/train.jsonl"
                ) from error
        if ds.features is not None and self.text_field not in ds.features:
            raise KeyError(
                f"text field {self.text_field!r} not found in {self.path}; fields are "
                f"{list(ds.features)}"
            )
        return ds

    def _reordered(self, builder: str, files: list[str], kwargs: dict) -> datasets.IterableDataset:
        """The files' documents cut into passages and/or permuted, as a stream of as many shards
        as files."""
        quiet = not datasets.utils.are_progress_bars_disabled()
        if quiet:  # cached after the first run; its bars would interleave with training's
            datasets.utils.disable_progress_bars()
        try:
            table = datasets.load_dataset(builder, data_files=files, split="train", **kwargs)
            if self.text_field not in table.column_names:
                raise KeyError(
                    f"text field {self.text_field!r} not found in {self.path}; fields are "
                    f"{table.column_names}"
                )
            if self.passage_chars is not None:
                table = table.map(
                    _passages,
                    batched=True,
                    remove_columns=table.column_names,
                    fn_kwargs={"field": self.text_field, "least": self.passage_chars},
                    desc="cutting passages",
                )
            if self.shuffle_seed is not None:
                table = table.shuffle(seed=self.shuffle_seed).flatten_indices()
            return table.to_iterable_dataset(num_shards=min(len(files), len(table)) or 1)
        finally:
            if quiet:
                datasets.utils.enable_progress_bars()


def _passages(batch: dict[str, list], field: str, least: int) -> dict[str, list[str]]:
    """Each text cut at paragraph breaks into passages of at least ``least`` characters (the
    last may be shorter)."""
    out: list[str] = []
    for text in batch[field]:
        if not isinstance(text, str):
            continue
        passage, size = [], 0
        for paragraph in text.split("\n\n"):
            passage.append(paragraph)
            size += len(paragraph) + 2
            if size >= least:
                out.append("\n\n".join(passage))
                passage, size = [], 0
        if passage and "".join(passage).strip():
            out.append("\n\n".join(passage))
    return {field: out}
