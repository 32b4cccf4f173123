"""The paths a user names, checked before any work: input files readable as what they claim, outputs creatable.

Reading a 100B-token corpus to find its one bad record is the training's job (it stops with a
:class:`~fixed_embed.errors.DataError` naming it); what can be seen at once is checked here, in
milliseconds, by every command that takes such a path: the files exist, are not empty, and their
first :data:`HEAD_BYTES` parse as what their suffix says (``.jsonl`` records with the text field,
``.txt`` UTF-8, ``.parquet`` its magic bytes); an output folder's name fits and no parent is a file.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from fixed_embed.errors import ConfigError, DataError, MissingFileError

HEAD_BYTES = 1 << 20  # what a check reads of each file at most


def check_corpus(spec: str | os.PathLike | None, what: str, text_field: str = "text") -> None:
    """Refuse a local corpus (file, folder or glob; a hub id passes) that cannot be read as documents."""
    if spec is None:
        return
    from fixed_embed.data.sources import DocumentSource, resolve_files
    from fixed_embed.data.token_shards import shard_folder

    if shard_folder(spec) is not None or not DocumentSource(str(spec)).is_local:
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
                raise DataError(f"{what}: {file} is not a Parquet file (no PAR1 magic bytes); point data at documents")
            continue
        try:
            text = head.decode("utf-8")
        except UnicodeDecodeError as error:
            if at_end or error.reason != "unexpected end of data":  # not merely a character cut by the read limit
                raise DataError(
                    f"{what}: {file} is not UTF-8 text (byte {error.start}: {error.reason}); point data at documents"
                ) from None
            text = head[: error.start].decode("utf-8")
        if suffix in (".jsonl", ".json"):
            _check_records(file, text, at_end, what, text_field)
    if empty == len(files):
        raise DataError(f"{what}: {spec}: every file is empty ({len(files)} file(s)); point data at documents")


def _check_records(file: str, text: str, at_end: bool, what: str, text_field: str) -> None:
    lines = text.splitlines()
    if not at_end and lines:
        lines = lines[:-1]  # the last may be cut by the read limit
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError as error:
            raise DataError(f"{what}: {file} line {number} is not a JSON record ({error}); fix or remove it") from None
        if not isinstance(record, dict) or not isinstance(record.get(text_field), str):
            keys = sorted(record) if isinstance(record, dict) else type(record).__name__
            raise DataError(
                f"{what}: {file} line {number} has no text field {text_field!r} (found {keys}); fix it or set the "
                "text field (data.text_field, --text-field)"
            )


def check_output(path: str | os.PathLike, what: str) -> None:
    """Refuse an output path that cannot be made: a name longer than the file system takes, a parent that is a file."""
    path = Path(path)
    for part in path.parts:
        if len(os.fsencode(part)) > 255:
            raise ConfigError(f"{what} {path}: the name {part[:40]}... is {len(os.fsencode(part))} bytes; at most 255")
    for parent in [path, *path.parents]:
        if parent.exists():
            if parent != path and not parent.is_dir():
                raise ConfigError(f"{what} {path}: {parent} is a file, not a folder; choose another path")
            return


def check_task_folders(folders: list[str], what: str = "--include-path") -> None:
    """Refuse lm-eval task folders that do not exist, hold no task YAML or a YAML that does not parse."""
    import yaml

    class TaskLoader(yaml.SafeLoader):
        """lm-eval's task YAMLs use tags (``!function utils.process``): parsed as plain values, never run."""

    TaskLoader.add_multi_constructor("!", lambda loader, suffix, node: None)
    for include in folders:
        folder = Path(include)
        if not folder.is_dir():
            problem = "does not exist" if not folder.exists() else "is not a folder"
            raise ConfigError(f"{what} {include} {problem}: give a folder of lm-eval task YAMLs")
        files = sorted(folder.rglob("*.yaml"))
        if not files:
            raise ConfigError(f"{what} {include} holds no task YAML (*.yaml): give a folder of lm-eval task YAMLs")
        for task_file in files:
            try:
                loader = TaskLoader(task_file.read_text())
                try:
                    loader.get_single_data()
                finally:
                    loader.dispose()
            except (yaml.YAMLError, UnicodeDecodeError) as error:
                first = str(error).splitlines()[0] if str(error) else type(error).__name__
                raise ConfigError(f"{what} {include}: {task_file} is not valid YAML ({first})") from None
