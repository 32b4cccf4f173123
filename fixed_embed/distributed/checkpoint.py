"""Checkpoint files: written atomically (folders: link-swapped), read weights-only, CRC-checked
(docs/security.md)."""

from __future__ import annotations

import functools
import glob
import io
import os
import pickle
import re
import warnings
import zipfile
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch.plugins.io import TorchCheckpointIO

from fixed_embed.atomic import atomic_write
from fixed_embed.distributed.ranks import is_node_leader
from fixed_embed.errors import CheckpointError

_META = "meta.pt"  # Lightning's metadata file inside a distributed checkpoint


class AtomicCheckpointIO(TorchCheckpointIO):
    """Lightning's checkpoints written atomically; a save killed mid-write leaves a temporary
    the next one removes."""

    def save_checkpoint(
        self, checkpoint: dict[str, Any], path: str | os.PathLike, storage_options: Any = None
    ) -> None:
        if storage_options is not None:
            raise TypeError(f"AtomicCheckpointIO takes no storage_options, got {storage_options!r}")
        for killed in Path(path).parent.glob(
            f".{glob.escape(Path(path).name)}.tmp-*"
        ):  # its name is this run's alone
            killed.unlink(missing_ok=True)
        with atomic_write(path, "wb") as file:
            torch.save(checkpoint, file)


class UnsafeCheckpointError(CheckpointError):
    """A checkpoint holding pickled objects other than tensors and plain data: refused, nothing
    in it ran."""

    def __init__(self, path: str | os.PathLike, detail: str = "") -> None:
        super().__init__(
            f"{path} holds pickled objects other than tensors and plain "
            f"data{f' ({detail})' if detail else ''}; "
            "it is refused for safety and nothing in it was run. fixed-embed reads checkpoints "
            "weights-only: "
            "use a checkpoint written by fixed-embed, or re-save the weights from a copy of the "
            "model you trust"
        )


def load_weights_only(
    source: str | os.PathLike | io.BytesIO, path: str | os.PathLike, **kwargs: Any
) -> Any:
    """``torch.load(source, weights_only=True)`` of a file whose every record matches the CRC-32
    torch.save wrote; a pickled callable or class is an :class:`UnsafeCheckpointError`, anything
    else unreadable a CheckpointError."""
    try:
        if not isinstance(source, io.BytesIO) and (bad := _changed_record(_version(source))):
            raise CheckpointError(
                f"cannot read checkpoint {path}: its record {bad} does not match the CRC-32 "
                "written with it "
                "(its bytes changed after the save)"
            )
        return torch.load(source, map_location="cpu", weights_only=True, **kwargs)
    except pickle.UnpicklingError as error:  # torch's weights-only refusal
        found = re.search(r"GLOBAL ([\w.]+)", str(error))
        raise UnsafeCheckpointError(path, f"found {found.group(1)}" if found else "") from None
    except CheckpointError:
        raise
    except Exception as error:  # torch raises several types for a file that is not a checkpoint
        first = (
            str(error).splitlines()[0].split(". ")[0] if str(error) else ""
        )  # its first sentence, whole
        raise CheckpointError(
            f"cannot read checkpoint {path}: it is not a checkpoint written by fixed-embed fit, or "
            "is cut short "
            f"({type(error).__name__}: {first[:200]})"
        ) from error


def _version(path: str | os.PathLike) -> tuple[str, int, int, int, int]:
    """One key per file version, whatever path (link, relative) names it."""
    stat = os.stat(path)
    return os.path.realpath(path), stat.st_dev, stat.st_ino, stat.st_size, stat.st_mtime_ns


# once per process and file version: the resume plan and the load read the same checkpoint
@functools.cache
def _changed_record(version: tuple[str, int, int, int, int]) -> str | None:
    """The first record of a torch.save zip whose CRC-32 fails (node leaders only: ~35 s for the
    paper's 22 GB); ``None`` when all match, for a non-zip, or when saved with CRC-32s off (all
    0)."""
    if not is_node_leader() or not zipfile.is_zipfile(path := version[0]):
        return None
    with zipfile.ZipFile(path) as archive:
        return (
            archive.testzip()
            if any(info.CRC for info in archive.infolist() if info.file_size)
            else None
        )


class _MetadataUnpickler(pickle.Unpickler):
    """Reads a sharded checkpoint's ``.metadata`` (a pickle), admitting only the data types
    torch writes there."""

    _METADATA = "torch.distributed.checkpoint.metadata"  # dataclasses and enums only
    _GLOBALS = (
        ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
        ("torch.serialization", "_get_layout"),
    )
    _PATHS = ("Path", "PosixPath", "PurePosixPath", "WindowsPath", "PureWindowsPath")

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in self._GLOBALS or (module == "pathlib" and name in self._PATHS):
            return super().find_class(module, name)
        if module == self._METADATA:
            found = super().find_class(module, name)
            if not (isinstance(found, type) and found.__module__ == module):
                raise pickle.UnpicklingError(f"found {module}.{name}, not a metadata class")
            return found
        if module == "torch" and (
            name == "Size" or isinstance(getattr(torch, name, None), torch.dtype)
        ):
            return getattr(torch, name)
        raise pickle.UnpicklingError(f"found {module}.{name}")


def _read_metadata(path: Path) -> Any:
    """A sharded checkpoint's ``.metadata``, read (and refused) here, before DCP would pickle.load
    it."""
    from torch.distributed.checkpoint.metadata import Metadata

    with open(path, "rb") as f:
        try:
            metadata = _MetadataUnpickler(f).load()
        except pickle.UnpicklingError as error:
            raise UnsafeCheckpointError(path, str(error)) from None
    if not isinstance(metadata, Metadata):
        raise UnsafeCheckpointError(path, f"a {type(metadata).__name__}, not DCP metadata")
    return metadata


def _read_shards(folder: Path) -> dict[str, Any]:
    """The weights in a torch.distributed.checkpoint folder, like ``dcp_to_torch_save`` but
    running none of its code."""
    from torch.distributed.checkpoint import (
        CheckpointException,
        DefaultLoadPlanner,
        FileSystemReader,
        load,
    )
    from torch.distributed.checkpoint.metadata import StorageMeta, TensorStorageMetadata

    metadata = _read_metadata(folder / ".metadata")
    refused: list[UnsafeCheckpointError] = []  # DCP wraps these: re-raised plain below

    class Reader(FileSystemReader):
        def read_metadata(self, *args: Any, **kwargs: Any) -> Any:
            if getattr(metadata, "storage_meta", None) is None:
                metadata.storage_meta = StorageMeta()
            metadata.storage_meta.load_id = self.load_id
            return metadata

    class Planner(DefaultLoadPlanner):
        def load_bytes(self, read_item: Any, value: io.BytesIO) -> None:
            # torch's planner torch.load()s it unrestricted: read it weights-only
            fqn = read_item.dest_index.fqn
            try:
                self.state_dict[fqn] = load_weights_only(value, f"{folder} (item {fqn})")
            except UnsafeCheckpointError as error:
                refused.append(error)
                raise

    # Every item (each one read weights-only), flat under DCP's own keys; tensors are read into
    # these.
    flat = {
        key: torch.empty(item.size, dtype=item.properties.dtype)
        if isinstance(item, TensorStorageMetadata)
        else None
        for key, item in metadata.state_dict_metadata.items()
    }
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "assuming the intent is to load in a single process"
            load(
                flat,
                storage_reader=Reader(folder),
                planner=Planner(flatten_state_dict=False),
                no_dist=True,
            )
    except (Exception, CheckpointException):  # the latter is a BaseException
        if refused:
            raise refused[0] from None
        raise
    paths = metadata.planner_data or {}  # each flat key's path in the saved nested dict
    return {
        paths[key][1]: value
        for key, value in flat.items()
        if paths.get(key, ())[:1] == ("state_dict",)
    }


def is_sharded_checkpoint(path: str | os.PathLike) -> bool:
    path = Path(path)
    return path.is_dir() and (path / _META).is_file() and (path / ".metadata").is_file()


def consolidate(folder: str | os.PathLike, out: str | os.PathLike | None = None) -> dict[str, Any]:
    """One checkpoint dict (weights + Lightning metadata) from a sharded folder, written to
    ``out`` if given; without the optimizer states (FSDP2 keys them by parameter name: resume
    sharded runs from the folder)."""
    folder = Path(folder)
    if not is_sharded_checkpoint(folder):
        raise CheckpointError(
            f"{folder} is not a sharded checkpoint folder (no {_META} and .metadata); pass a .ckpt "
            "file written "
            "by fixed-embed fit, or a sharded checkpoint folder"
        )
    checkpoint = {
        **load_weights_only(folder / _META, folder / _META),
        "state_dict": _read_shards(folder),
    }
    if out is not None:
        with atomic_write(out, "wb") as file:
            torch.save(checkpoint, file)
    return checkpoint
