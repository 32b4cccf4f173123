"""A corpus a user names, checked in milliseconds before any work: its files exist, are not
empty, and their first
:data:`HEAD_BYTES` parse as their suffix says (a bad record further in is the training's
DataError to name)."""

from __future__ import annotations

import codecs
import json
import os
from pathlib import Path

from fixed_embed.data.sources import DocumentSource, resolve_files
from fixed_embed.data.token_shards import shard_folder
from fixed_embed.errors import DataError, MissingFileError

HEAD_BYTES = 1 << 20  # what a check reads of each file at most


def check_corpus(spec: str | os.PathLike | None, what: str, text_field: str = "text") -> None:
    """Refuse a local corpus (file, folder or glob; a hub id passes) that cannot be read as
    documents."""
    if spec is None or shard_folder(spec) is not None or not DocumentSource(str(spec)).is_local:
        return  # token shards: their index is read (and checked) when the data module opens them
    try:
        files = resolve_files(str(spec))
    except FileNotFoundError as error:
        raise MissingFileError(f"{what}: {error}") from error
    except OSError as error:
        raise DataError(f"{what}: cannot read {spec}: {error.strerror}") from error
    empty = 0
    for file in files:
        try:
            with open(file, "rb") as handle:
                head = handle.read(HEAD_BYTES)
                at_end = not handle.read(1)
        except OSError as error:
            raise DataError(f"{what}: cannot read {file}: {error.strerror}") from error
        if not head.strip():
            empty += 1
            continue
        suffix = Path(file).suffix
        if suffix == ".parquet":
            if not head.startswith(b"PAR1"):
                raise DataError(
                    f"{what}: {file} is not a Parquet file (no PAR1 magic bytes); point data at "
                    "documents"
                )
            continue
        try:  # not final before the end: a character cut by the read limit waits for more
            text = codecs.getincrementaldecoder("utf-8")().decode(head, final=at_end)
        except UnicodeDecodeError as error:
            raise DataError(
                f"{what}: {file} is not UTF-8 text (byte {error.start}: {error.reason}); point "
                "data at documents"
            ) from None
        if suffix in (".jsonl", ".json"):
            _check_records(file, text, at_end, what, text_field)
    if empty == len(files):
        raise DataError(
            f"{what}: {spec}: every file is empty ({len(files)} file(s)); point data at documents"
        )


def _check_records(file: str, text: str, at_end: bool, what: str, text_field: str) -> None:
    lines = text.splitlines()
    for number, line in enumerate(
        lines if at_end else lines[:-1], start=1
    ):  # the last may be cut by the read limit
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError as error:
            raise DataError(
                f"{what}: {file} line {number} is not a JSON record ({error}); fix or remove it"
            ) from None
        if not isinstance(record, dict) or not isinstance(record.get(text_field), str):
            keys = sorted(record) if isinstance(record, dict) else type(record).__name__
            raise DataError(
                f"{what}: {file} line {number} has no text field {text_field!r} (found {keys}); "
                "fix it or set the "
                "text field (data.text_field, --text-field)"
            )
