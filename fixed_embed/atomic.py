"""Atomic writes: a reader, or the next launch after a kill, sees the old file, link or folder
or the new one. Each is written under a temporary name in the target's own folder (so the rename
is never a copy), then replaced."""

from __future__ import annotations

import errno
import glob
import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO

from fixed_embed.errors import ConfigError, writing

# read (at import, before threads): a written file gets what open() gives, 0666 & ~it
os.umask(_UMASK := os.umask(0))


def temporary_name(path: str | os.PathLike, kind: str = "tmp") -> Path:
    """The hidden sibling ``.<name>.<kind>-<pid>`` that :func:`atomic_path` writes before the
    rename."""
    path = Path(path)
    return path.with_name(f".{path.name}.{kind}-{os.getpid()}")


@contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path to write; on success it replaces ``path``, on an exception
    ``path`` is untouched."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = temporary_name(path)
    try:
        # a refused write(), fsync or Rust writer names no file: the error is given path
        with writing(path):
            yield tmp
            with open(tmp, "rb") as file:
                os.fsync(file.fileno())
            # also when written through a temporary file of the writer's (0600)
            os.chmod(tmp, 0o666 & ~_UMASK)
            os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


@contextmanager
def atomic_write(path: str | os.PathLike, mode: str = "w") -> Iterator[IO]:
    """``open(path, mode)`` that is atomic: ``with atomic_write(p, "wb") as f: torch.save(obj,
    f)``."""
    if not mode.startswith("w"):
        raise ValueError(
            f"atomic_write writes a whole file: mode must start with 'w', got {mode!r}"
        )
    with atomic_path(path) as tmp, open(tmp, mode) as file:
        yield file


def atomic_write_text(path: str | os.PathLike, text: str) -> Path:
    with atomic_write(path) as file:
        file.write(text)
    return Path(path)


def atomic_symlink(target: str | os.PathLike, link: str | os.PathLike) -> None:
    """Make ``link`` a symlink to ``target`` by a rename over what was there (a real folder of
    that name is removed)."""
    link = Path(link)
    tmp = temporary_name(link)
    tmp.unlink(missing_ok=True)
    try:
        os.symlink(target, tmp)
        if link.is_dir() and not link.is_symlink():
            shutil.rmtree(link)
        os.replace(tmp, link)
    finally:
        tmp.unlink(missing_ok=True)


@contextmanager
def atomic_folder(path: str | os.PathLike) -> Iterator[Path]:
    """Yield an empty temporary folder; on success it replaces ``path`` whole. The caller holds
    the folder's lock."""
    path = Path(path)
    tmp, old = temporary_name(path), temporary_name(path, "old")
    # before the work: it could be moved aside, never removed
    if path.is_dir() and not os.access(path, os.W_OK):
        raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(path))
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        yield tmp
        for file in (f for f in tmp.rglob("*") if f.is_file() and not f.is_symlink()):
            file.chmod(0o666 & ~_UMASK)  # as atomic_path's
        if path.exists():
            shutil.rmtree(old, ignore_errors=True)
            os.replace(path, old)
        os.replace(tmp, path)
        shutil.rmtree(old, ignore_errors=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def remove_leftovers(target: str | os.PathLike, pid: int, beside: bool) -> None:
    """Remove what writer ``pid``, killed while it held ``target``'s lock, left: its temporary files
    and folders in ``target`` and, for a lock ``beside`` it, its temporary siblings
    (``.<name>.tmp-<pid>``). A previous ``target`` it had moved aside (killed between
    :func:`atomic_folder`'s renames) is put back instead."""
    target = Path(target)
    inside = list(target.rglob(f".*-{pid}")) if target.is_dir() and not target.is_symlink() else []
    for left in (
        list(target.parent.glob(f".{glob.escape(target.name)}.*-{pid}")) if beside else []
    ) + inside:
        if left.name.rpartition("-")[0].endswith((".tmp", ".old")):
            if left.name == f".{target.name}.old-{pid}" and not target.exists():
                os.replace(left, target)
                continue
            shutil.rmtree(left) if left.is_dir() and not left.is_symlink() else left.unlink(
                missing_ok=True
            )


def process_running(pid: int) -> bool:
    """Whether process ``pid`` runs on this host (another user's counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def check_output(path: str | os.PathLike, what: str) -> None:
    """Refuse an output path that cannot be made: a name longer than the file system takes, a
    parent that is a file."""
    path = Path(path)
    for part in path.parts:
        if len(os.fsencode(part)) > 255:
            raise ConfigError(
                f"{what} {path}: the name {part[:40]}... is {len(os.fsencode(part))} bytes; at "
                "most 255"
            )
    for parent in [path, *path.parents]:
        if parent.exists():
            if parent != path and not parent.is_dir():
                raise ConfigError(
                    f"{what} {path}: {parent} is a file, not a folder; choose another path"
                )
            return
