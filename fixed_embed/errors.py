"""User errors: bad config, data, paths or checkpoints; the CLI prints their message without a
traceback."""

from __future__ import annotations

import errno
import os
import re
from collections.abc import Iterator
from contextlib import contextmanager


class UserError(Exception):
    """A mistake in what the user gave (config, data, path, checkpoint): message says what and
    how to fix it."""


class ConfigError(UserError, ValueError):
    """A config value or command-line option that cannot work."""


class DataError(UserError, ValueError):
    """Data or a data-derived file (corpus, tokenizer) that is unusable as given."""


class MissingFileError(UserError, FileNotFoundError):
    """A path the user named that does not exist (or lacks the file it must hold)."""


class CheckpointError(UserError, ValueError):
    """A checkpoint that cannot be read or does not fit what it is used for."""


class OutputExistsError(UserError, FileExistsError):
    """An output (results file, export folder) already exists and would be replaced."""


class RunWriteError(UserError):
    """The file system refused a write of the run (no space, file too large, name too long,
    permission)."""


class RunComplete(Exception):
    """The checkpoint to resume is at the run's length: nothing to train (the message says so,
    and what is left)."""


# OSErrors that say the environment refuses a write or a name -- never a bug: the CLI prints one
# line, exit 2.
ENVIRONMENT_ERRNOS = frozenset(
    {
        errno.ENOSPC,
        errno.EDQUOT,
        errno.EFBIG,
        errno.ENAMETOOLONG,
        errno.EACCES,
        errno.EPERM,
        errno.EROFS,
    }
)


def in_one_line(error: BaseException) -> str:
    """``Type: the first line of its message`` (the type alone for none), at most 300 characters."""
    return ": ".join([type(error).__name__, *str(error).splitlines()[:1]])[:300]


def causes(error: BaseException | None) -> Iterator[BaseException]:
    """``error``, then each exception it was raised from or during."""
    seen = set()
    while error is not None and id(error) not in seen:
        yield error
        seen.add(id(error))
        error = error.__cause__ or error.__context__


def environment_error(error: BaseException | None) -> OSError | None:
    """The OSError of :data:`ENVIRONMENT_ERRNOS` that ``error`` was raised from or during, if
    any; a Rust writer's (safetensors, tokenizers) ``... (os error 28)`` made one."""
    for cause in causes(error):
        if (
            rust := None
            if isinstance(cause, OSError)
            else re.search(r"\(os error (\d+)\)", str(cause))
        ):
            # writing()'s
            cause = OSError(
                int(rust[1]), os.strerror(int(rust[1])), getattr(cause, "filename", None)
            )
        if getattr(cause, "errno", None) in ENVIRONMENT_ERRNOS:
            return cause
    return None


@contextmanager
def writing(path: str | os.PathLike) -> Iterator[None]:
    """Name ``path`` in a refused write whose error names no file (``write()``'s, a Rust
    writer's, torch.save's)."""
    try:
        yield
    except Exception as error:
        # in place: an ExitStack goes on
        for cause in causes(error) if environment_error(error) is not None else ():
            cause.filename = getattr(cause, "filename", None) or str(path)
        raise


def write_refused(error: OSError, kept: str, elsewhere: str) -> str:
    """Every command's words for a write the file system refused: the file, the reason, what is
    intact, the fix."""
    first = {
        errno.ENOSPC: "free disk space or ",
        errno.EDQUOT: "free space in your quota or ",
        errno.EFBIG: "raise the file-size limit (ulimit -f) or ",
    }.get(error.errno, "")
    # reads meet these too
    verb = "use" if error.errno in (errno.EACCES, errno.EPERM, errno.ENAMETOOLONG) else "write"
    return (
        f"cannot {verb} {error.filename or 'a file'}: {error.strerror} ([Errno {error.errno}] "
        f"{errno.errorcode.get(error.errno, '')}); {kept}.\n{first}{elsewhere}"
    )
