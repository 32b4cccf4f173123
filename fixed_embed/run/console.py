"""The console of ``fixed-embed`` commands: this project's records (INFO+) and anyone's errors
(README, "Watch a run"). The rest (warnings, tqdm bars' final states) goes to ``<run
folder>/console.log``, buffered until
:func:`attach_run_folder` (``logs/<command>.log`` without one). Warnings are dropped by exact
text, not category."""

from __future__ import annotations

import atexit
import functools
import io
import logging
import os
import re
import sys
import threading
import time
import warnings
from pathlib import Path
from typing import Any, TextIO

from fixed_embed.lightning_internals import route_tqdm, take_over_logger

# (module that raises it, category, exact message as a regex): each dropped, nothing else.
HARMLESS_WARNINGS: tuple[tuple[str, type[Warning], str], ...] = (
    # torchdata's StatefulDataLoader calls torch.set_vital, deprecated in torch (a no-op).
    (
        "torchdata.stateful_dataloader.stateful_dataloader",
        UserWarning,
        re.escape("'set_vital' is deprecated, please do not call"),
    ),
    # Lightning's copy of tree_flatten builds a LeafSpec, deprecated in torch's pytree.
    (
        "lightning.pytorch.utilities._pytree",
        FutureWarning,
        re.escape(
            "`isinstance(treespec, LeafSpec)` is deprecated, use `isinstance(treespec, TreeSpec) "
            "and "
            "treespec.is_leaf()` instead."
        ),
    ),
    # The data module's stream has a length (the run's blocks); every reader owns distinct shards.
    (
        "lightning.pytorch.utilities.data",
        UserWarning,
        re.escape(
            "Your `IterableDataset` has `__len__` defined. In combination with multi-process data "
            "loading "
            "(when num_workers > 1), `__len__` could be inaccurate if each worker is not "
            "configured "
            "independently to avoid having duplicate data."
        ),
    ),
    # fixed-embed fit hands LightningCLI its own command line (sys.argv[1:]) as args.
    (
        "lightning.pytorch.cli",
        UserWarning,
        re.escape(
            "LightningCLI's args parameter is intended to run from within Python like if it were "
            "from the "
            "command line. To prevent mistakes it is not recommended to provide both args and "
            "command line "
            "arguments, got: sys.argv[1:]="
        )
        + r"\[.*\], args=\[.*\]\.",
    ),
)

# Libraries that attach their own stderr handler (or stop propagation) when imported.
_LIBRARY_LOGGERS = (
    "lightning",
    "lightning.pytorch",
    "lightning.fabric",
    "pytorch_lightning",
    "lightning_fabric",
    "lm_eval",
    "datasets",
    "huggingface_hub",
    "transformers",
    "torchmetrics",
)
_ROOT = Path(__file__).resolve().parents[2]  # the repository: fixed_embed/run/console.py
# this project's code
_PROJECT_DIRS = tuple(f"{_ROOT / name}{os.sep}" for name in ("fixed_embed", "callbacks"))
_BUFFER_LIMIT = 20_000  # records kept before a run folder is known
_PROGRESS_EVERY_S = 30.0  # a long progress bar's state is logged at least this often


class _RunLog(logging.Handler):
    """Every record, one line each: buffered until :meth:`open`, then appended to the file."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.setFormatter(logging.Formatter("%(asctime)s %(levelname)-7s %(name)s: %(message)s"))
        self.path: Path | None = None
        self._file: TextIO | None = None
        self.forget()

    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        return (
            f"{text} ({record.pathname}:{record.lineno})" if record.name == "py.warnings" else text
        )

    def emit(self, record: logging.LogRecord) -> None:
        try:
            if self._file is not None:
                self._file.write(self.format(record) + "\n")
                self._file.flush()
            elif len(self._buffer) < _BUFFER_LIMIT:
                self._buffer.append(self.format(record))
            else:
                self._dropped += 1
        except Exception:
            self.handleError(record)

    def forget(self) -> None:
        """Drop what was recorded but not yet written."""
        self._buffer: list[str] = []
        self._dropped = 0

    def open(self, path: Path) -> None:
        with self.lock:
            if self.path == path:
                return
            if self._file is not None:
                self._file.close()
            path.parent.mkdir(parents=True, exist_ok=True)
            self._file, self.path = path.open("a", encoding="utf-8"), path
            stamp = time.strftime("%Y-%m-%d %H:%M:%S")
            self._file.write(
                f"==== {stamp} fixed-embed {' '.join(sys.argv[1:])} (pid {os.getpid()})\n"
            )
            self._file.writelines(line + "\n" for line in self._buffer)
            if self._dropped:
                self._file.write(
                    f"({self._dropped} more records before the run folder was known were dropped)\n"
                )
            self._file.flush()
            self.forget()

    def close_at_exit(self, fallback: Path) -> None:
        if self._file is None and self._buffer:
            self.open(fallback)
        if self._file is not None:
            self._file.close()
            self._file = None


@functools.cache
def _is_ours(pathname: str) -> bool:
    return os.path.abspath(pathname).startswith(_PROJECT_DIRS)


def _console_filter(record: logging.LogRecord) -> bool:
    """This project's records at INFO and above, and anyone's errors."""
    return record.levelno >= logging.ERROR or (
        record.levelno >= logging.INFO and _is_ours(record.pathname)
    )


class _ConsoleHandler(logging.StreamHandler):
    """Writes to the current ``sys.stderr`` (a live rich progress bar redirects it to print
    above the bar)."""

    stream = property(lambda self: sys.stderr, lambda self, value: None)

    def format(self, record: logging.LogRecord) -> str:
        text = record.getMessage()
        if record.levelno >= logging.WARNING and record.name != "py.warnings":
            text = f"{record.levelname.lower()}: {text}"
        return (
            f"{text}\n{logging.Formatter().formatException(record.exc_info)}"
            if record.exc_info
            else text
        )


class _ProgressStream(io.TextIOBase):
    """A file for tqdm: keeps each bar's latest state and logs it when the bar ends (or every 30
    s)."""

    encoding = "utf-8"

    def __init__(self, handler: logging.Handler) -> None:
        self._handler = handler
        self._partial = self._last = ""
        self._logged_at = time.monotonic()
        self._lock = threading.Lock()

    def write(self, text: str) -> int:
        with self._lock:
            pieces = re.split(r"([\r\n])", self._partial + text)
            self._partial = pieces.pop()
            for segment, separator in zip(pieces[::2], pieces[1::2], strict=True):
                segment = segment.strip()
                if segment:
                    if not self._last:  # a new bar, or a new stretch of one
                        self._logged_at = time.monotonic()
                    self._last = segment
                # the bar ended, or was cleared
                if self._last and (separator == "\n" or not segment):
                    self._log()
            if self._last and time.monotonic() - self._logged_at > _PROGRESS_EVERY_S:
                self._log()
        return len(text)

    def _log(self) -> None:
        self._handler.handle(
            logging.LogRecord("progress", logging.INFO, "", 0, self._last, None, None)
        )
        self._last, self._logged_at = "", time.monotonic()


_run_log: _RunLog | None = None


def setup(command: str) -> None:
    """Configure this process's console for ``fixed-embed COMMAND`` (idempotent; see the
    module's doc)."""
    global _run_log
    if _run_log is not None or command == "lm-eval":
        return
    verbose = os.environ.get("FIXED_EMBED_DEBUG", "") not in ("", "0")
    for module, category, message in HARMLESS_WARNINGS:
        warnings.filterwarnings(
            "ignore", message=message + r"\Z", category=category, module=re.escape(module) + r"\Z"
        )
    _run_log = _RunLog()
    console = _ConsoleHandler()
    console.setLevel(logging.INFO)
    if not verbose:
        console.addFilter(_console_filter)
    root = logging.getLogger()
    root.setLevel(logging.INFO)
    root.addHandler(console)
    root.addHandler(_run_log)
    # Libraries add stderr handlers (or stop propagation) on import, mostly after this:
    # _LibraryLogger refuses.
    for name in _LIBRARY_LOGGERS:
        logger = logging.getLogger(name)
        take_over_logger(logger, _LibraryLogger)
        logger.handlers = [
            handler for handler in logger.handlers if not _prints_to_console(handler)
        ]
    warnings.showwarning = _showwarning
    if not verbose:
        route_tqdm(_ProgressStream(_run_log))
    # the command's own process, not a host calling main()
    if Path(sys.argv[0]).name in (
        "fixed-embed",
        "__main__.py",
    ):
        atexit.register(_run_log.close_at_exit, Path("logs").absolute() / f"{command}.log")


def forget_unwritten() -> None:
    """Drop unwritten records: a command refused for a user error leaves no
    ``logs/<command>.log`` (nor ``logs/``)."""
    if _run_log is not None and _run_log._file is None:
        _run_log.forget()


def attach_run_folder(folder: str | os.PathLike, rank: int = 0) -> None:
    """From now on (and what was recorded so far) into ``folder/console.log`` (after
    :func:`setup` only)."""
    if _run_log is not None:
        _run_log.open(Path(folder) / ("console.log" if rank == 0 else f"console.rank{rank}.log"))


def _prints_to_console(handler: logging.Handler) -> bool:
    streams = (sys.stderr, sys.stdout, sys.__stderr__, sys.__stdout__)
    return type(handler) is logging.StreamHandler and handler.stream in streams


class _LibraryLogger(logging.Logger):
    """A library's logger: its records propagate to the root's handlers; it takes no console
    handler of its own."""

    @property  # type: ignore[override]
    def propagate(self) -> bool:
        return True

    @propagate.setter
    def propagate(self, value: bool) -> None:
        pass

    def addHandler(self, handler: logging.Handler) -> None:
        if not _prints_to_console(handler):
            super().addHandler(handler)


def _showwarning(
    message: Any,
    category: type[Warning],
    filename: str,
    lineno: int,
    file: Any = None,
    line: str | None = None,
) -> None:
    if file is not None:  # an explicit destination
        file.write(warnings.formatwarning(message, category, filename, lineno, line))
        return
    record = logging.LogRecord(
        "py.warnings",
        logging.WARNING,
        filename,
        lineno,
        f"{category.__name__}: {message}",
        None,
        None,
    )
    logging.getLogger("py.warnings").handle(record)
