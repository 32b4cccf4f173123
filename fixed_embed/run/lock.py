"""One writer per folder: a ``run.lock`` (``O_EXCL``) naming its holder (docs/faults.md, "One
writer per folder")."""

from __future__ import annotations

import atexit
import contextlib
import errno
import glob
import json
import logging
import os
import socket
import sys
import threading
import time
from pathlib import Path

from fixed_embed.atomic import process_running, remove_leftovers
from fixed_embed.errors import ConfigError, UserError, writing

LOCK_NAME = "run.lock"
HEARTBEAT_S = 60.0  # the holder touches its lock this often
STALE_AFTER_S = (
    600.0  # a lock of another host not touched for this long is stale (10 missed heartbeats)
)

# the lock files this process holds (a second in-process launch is refused too)
_held: set[Path] = set()


class RunInUseError(UserError):
    """The run folder is in use by another live launch."""


def _process_start(pid: int) -> str | None:
    """The process's start time in clock ticks since boot (Linux ``/proc``), to tell a reused
    pid apart."""
    with contextlib.suppress(OSError):  # field 22, counted after the command name
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[19]
    return None


class RunLock(contextlib.AbstractContextManager):
    """A held lock (:func:`acquire`); :meth:`release` (also on leaving ``with``) is idempotent."""

    def __init__(self, path: Path, record: dict, made: list[Path]) -> None:
        self.path, self.record, self.made = path, record, made
        self._stop = threading.Event()
        threading.Thread(target=self._heartbeat, name="fixed-embed-run-lock", daemon=True).start()
        atexit.register(self.release)

    def _heartbeat(self) -> None:
        while not self._stop.wait(HEARTBEAT_S):
            with contextlib.suppress(OSError):
                os.utime(self.path)

    def release(self) -> None:
        if self._stop.is_set():
            return
        self._stop.set()
        _held.discard(self.path)
        # Only our own lock: never a newer holder's that took over a lock we were believed to have
        # left.
        if _read(self.path) == self.record:
            with contextlib.suppress(FileNotFoundError):
                self.path.unlink()
        # those the lock made, deepest first: a launch that wrote nothing leaves none
        for folder in self.made:
            with contextlib.suppress(OSError):
                folder.rmdir()
        atexit.unregister(self.release)

    def __exit__(self, *exc: object) -> None:
        self.release()


def _read(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        return {}  # unreadable or half-written: a holder that died while writing it


def _describe(record: dict) -> str:
    since = record.get("since")
    when = (
        time.strftime("%Y-%m-%d %H:%M:%S %Z", time.localtime(since))
        if isinstance(since, (int, float))
        else "?"
    )
    return f"pid {record.get('pid', '?')} on {record.get('host', '?')}, since {when}"


def _stale_reason(record: dict, path: Path) -> str | None:
    """Why the lock ``record`` no longer holds (None: its holder is alive)."""
    try:
        age = time.time() - path.stat().st_mtime
    except FileNotFoundError:
        return "it was just released"
    # a holder that died writing it, or one writing it now (O_EXCL made it empty): a grace period
    if not record:
        return "its lock file is unreadable" if age > 2.0 else None
    host, pid = record.get("host"), record.get("pid")
    if host == socket.gethostname() and isinstance(pid, int):
        if pid == os.getpid():
            return None if path in _held else "it was left by this process"
        if not process_running(pid):
            return f"pid {pid} is not running"
        start = record.get("start")
        if start is not None and _process_start(pid) not in (None, start):
            return f"pid {pid} is another process now"
        return None
    if age > STALE_AFTER_S:
        return f"its heartbeat stopped {age / 60:.0f} minutes ago (another host: {host})"
    return None


def acquire(
    target: str | os.PathLike,
    fix: str = "or use --run NEW_NAME",
    beside: bool = False,
    shared: bool = False,
) -> RunLock:
    """Take ``target/run.lock`` (making the folder), or with ``beside`` (a file, or a folder
    swapped in whole) ``.<name>.lock`` next to it; refuse with :class:`RunInUseError` naming a
    live holder and ``fix``. ``shared``: a reader's record ``<lock>.read-<host>-<pid>`` instead;
    a writer refuses while a live reader holds one, and a reader while a live writer holds the
    lock (each writes its own record, then looks for the other's)."""
    target = Path(target)
    folder, path = (
        (target.parent, target.parent / f".{target.name}.lock")
        if beside
        else (target, target / LOCK_NAME)
    )
    made = [] if shared else [p for p in (folder, *folder.parents) if not p.exists()]
    record = {
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "start": _process_start(os.getpid()),
        "since": time.time(),
        "command": " ".join(
            [Path(sys.argv[0]).name.replace("__main__.py", "fixed-embed"), *sys.argv[1:]]
        ),
    }
    if shared:
        others, path = [path], path.with_name(f"{path.name}.read-{record['host']}-{record['pid']}")
        # a read-only or missing folder: there is nothing to replace there
        with contextlib.suppress(OSError):
            path.write_text(json.dumps(record))
    else:
        _create(path, target, beside, fix, record)
        others = sorted(folder.glob(f"{glob.escape(path.name)}.read-*"))
    _held.add(path)
    lock = RunLock(path, record, made)
    try:
        for other in others:
            _refuse_if_live(other, target, beside, fix, shared)
    except RunInUseError:
        lock.release()
        raise
    return lock


def _create(path: Path, target: Path, beside: bool, fix: str, record: dict) -> None:
    """Make the writer's lock ``path`` (and its folder) holding ``record``, unless a live launch
    holds it."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        code = errno.errorcode.get(error.errno or 0, "")
        raise ConfigError(
            f"cannot make the folder {path.parent}: {error.strerror} ({code})"
        ) from error
    for _ in range(3):
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            break
        except FileExistsError:
            # a live holder is refused; else it was released meanwhile, or taken over: try again
            _refuse_if_live(path, target, beside, fix)
    else:
        raise RunInUseError(
            f"{target}: another launch is taking its lock ({path}) at the same time"
        )
    try:
        with writing(path), os.fdopen(fd, "w") as file:
            json.dump(record, file)
    except BaseException:  # a full disk: no half-written lock left to refuse the next launch
        path.unlink(missing_ok=True)
        raise


def readers(target: str | os.PathLike) -> list[str]:
    """The live readers of ``target`` (whose lock lies beside it), described."""
    target = Path(target)
    live = []
    for path in target.parent.glob(f".{glob.escape(target.name)}.lock.read-*"):
        if (record := _read(path)) is not None and _stale_reason(record, path) is None:
            live.append(_describe(record))
        elif record is not None:
            _take_over(path, record)  # a killed reader's record: nobody else would remove it
    return live


def _refuse_if_live(path: Path, target: Path, beside: bool, fix: str, shared: bool = False) -> None:
    """Refuse if ``path`` (``target``'s lock, or a reader's record) names a live holder. A stale
    one a writer takes over (a dead writer's lock with what it left, a dead reader's record); a
    reader leaves it to the next writer."""
    if (holder := _read(path)) is None:
        return
    if (reason := _stale_reason(holder, path)) is None:
        raise RunInUseError(
            f"{'' if beside else 'run folder '}{target} is in use by another launch "
            f"({_describe(holder)}: "
            f"{holder.get('command', '?')}); wait for it to end or stop it, {fix}. If it is gone, "
            f"delete {path}"
        )
    if not shared and _take_over(path, holder) and ".read-" not in path.name:
        logging.getLogger(__name__).info(
            f"run lock: taking over {path} from {_describe(holder)}: {reason}"
        )
        if isinstance(pid := holder.get("pid"), int):
            remove_leftovers(target, pid, beside)


def _take_over(path: Path, holder: dict) -> bool:
    """Move a stale lock aside, unless another launch replaced it meanwhile (then it is put
    back)."""
    aside = path.with_name(f"{path.name}.stale-{os.getpid()}")
    try:
        os.replace(path, aside)
    except FileNotFoundError:
        return False
    stale = _read(aside) == holder
    if not stale:  # someone else's fresh lock: put it back (the O_EXCL retry then sees it)
        with contextlib.suppress(OSError):
            os.link(aside, path)
    with contextlib.suppress(OSError):
        aside.unlink()
    return stale
