"""A full disk, a file-size limit, a read-only folder: every command that writes a file refuses
in one line that names the file, the reason and its errno, what is intact and the fix (exit 2,
no traceback), leaves no temporary file and keeps what it wrote before; ``eval`` refuses before
it evaluates when its folder cannot take a results file, and prints its scores before writing them.

Generated: the commands are test_one_writer's WRITERS and the NOT_WRITERS whose arguments name
an output; each runs once undisturbed (what it writes, file by file), then in-process under
refusals made real, each at several points (the first, one in the middle, the last):
``RLIMIT_FSIZE`` just under each written file's size (a write past it fails with EFBIG; SIGXFSZ
ignored: real, from every writer), a full disk at a file (ENOSPC from the file object Python's
open() gives: torch.save's, json's, matplotlib's writes; safetensors' own error), and a
read-only output folder (EACCES; not as root, whom permissions do not stop).
"""

from __future__ import annotations

import errno
import hashlib
import io
import json
import os
import resource
import signal
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from unittest import mock

import pytest
import torch
from safetensors import SafetensorError
from safetensors.torch import save_file as real_save_file

import fixed_embed.cli.eval as eval_cli
from fixed_embed.atomic import temporary_name
from fixed_embed.cli import COMMANDS
from fixed_embed.evaluation import export
from fixed_embed.evaluation.suite import run_suite
from fixed_embed.run.lock import LOCK_NAME
from tests.cli import run_cli
from tests.test_bad_paths import OUTPUT, arguments
from tests.test_one_writer import NOT_WRITERS, WRITERS
from tests.test_safety import dcp_folder


def _tokenizer(tmp, corpus, checkpoint):
    return [
        "tokenizer",
        "--data",
        corpus[0],
        "--vocab-size",
        "280",
        "--out",
        tmp / "tok",
    ], tmp / "tok"


def _table(tmp, corpus, checkpoint):
    results = tmp / "results.json"
    column = {"task": "t", "metric": "acc", "fewshot": 0, "label": "T", "percent": True}
    results.write_text(
        json.dumps({"model": "m", "columns": [column], "scores": {"t|acc|0": {"value": 0.5}}})
    )
    return ["table", results, "--output", tmp / "table.md"], tmp / "table.md"


def _analyze(tmp, corpus, checkpoint):
    return [
        "analyze",
        "ablate",
        checkpoint,
        "--data",
        corpus[0],
        "--blocks",
        "4",
        "--out",
        tmp / "ab",
    ], tmp / "ab"


def _consolidate(tmp, corpus, checkpoint):
    saved = torch.load(checkpoint, weights_only=True)
    meta = {"global_step": saved["global_step"], "hyper_parameters": saved["hyper_parameters"]}
    folder = dcp_folder(tmp / "sharded", {"state_dict": saved["state_dict"]}, meta)
    return ["consolidate", folder, tmp / "one.ckpt"], tmp / "one.ckpt"


# command -> its command line and output in a folder; the writers of test_one_writer, and these
LAUNCH = {name: make for name, (make, _) in WRITERS.items()} | {
    "tokenizer": _tokenizer,
    "table": _table,
    "analyze": _analyze,
    "consolidate": _consolidate,
}
AGAIN = {  # what makes a second run write its output again, over the first's
    "eval": ["--overwrite"],
    "export": ["--overwrite"],
    "tokenizer": ["--overwrite", "--vocab-size", "290"],
}
# what a rerun of the first command line needs to finish the work a refused run left (and rewrite
# it)
RERUN = {
    "eval": ["--overwrite"],
    "export": ["--overwrite"],
    "tokenizer": ["--overwrite"],
    "fit": ["--ckpt_path", "last"],
}


def test_every_command_that_names_an_output_is_tried():
    named = {
        c
        for c in NOT_WRITERS
        if c not in ("validate", "test", "lm-eval")
        and any(OUTPUT.search(name) for name, *_ in arguments(c))
    }
    assert set(LAUNCH) == set(WRITERS) | named and set(LAUNCH) <= set(COMMANDS), named


# Where a rerun over the first run's output is not a rewrite of it: each point starts from a new
# folder instead.
FRESH_ONLY = {
    "pretokenize": "--overwrite removes the old shards first; a refused run continues with the "
    "same command",
    "fit": "a rerun is a resume; fit's refusals are also tests/test_run_guard.py's",
}
KINDS = {  # how a refusal is made -> its errno and the words of the fix
    "file size limit": ("EFBIG", "raise the file-size limit (ulimit -f)"),
    "disk full": ("ENOSPC", "free disk space"),
    "read-only folder": ("EACCES", "choose another output path"),
}
WHOLE_LAUNCH = {"fit"}  # seconds a case: in `make test`, not the inner loop
POINTS = {"fit": 1}  # points tried (default 3): a whole launch takes seconds
# Known gaps, each a refusal that is not yet one line naming the file: strict, so that the fix
# shows.
GAPS = {  # command or (command, kind) -> what fails
    "fit": "config.yaml (jsonargparse's save through Lightning's SaveConfigCallback) and "
    "hparams.yaml are written in "
    "place, not atomically, and a refused write of them names no file (fixed_embed/cli/train.py)",
}
# a column of eval's table of scores (its task: tests/test_one_writer.py), on stdout
SCORES = "word order"


@contextmanager
def file_size_limit(limit: int):
    """``ulimit -f``: a write past ``limit`` bytes of a file fails with EFBIG (SIGXFSZ ignored,
    as Python starts)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, handler)


class FullDisk:
    """An open file whose writes fail as on a full disk (no fileno: its writers cannot go around
    ``write``)."""

    def __init__(self, file) -> None:
        self.file = file

    def write(self, data) -> int:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    def fileno(self) -> int:
        raise io.UnsupportedOperation("fileno")

    def __getattr__(self, name: str):
        return getattr(self.file, name)

    def __enter__(self) -> FullDisk:
        return self

    def __exit__(self, *exc) -> None:
        self.file.close()


def _target(path: str | os.PathLike) -> Path:
    """The path a file written under temporary names (``.NAME.tmp-PID``, a file's or its
    folder's) is written to."""
    suffix = f".tmp-{os.getpid()}"
    return Path(
        *(
            p[1 : -len(suffix)] if p.startswith(".") and p.endswith(suffix) else p
            for p in Path(path).parts
        )
    )


@contextmanager
def disk_full_at(full: Path | None, written: set[Path] | None = None):
    """The writes of ``full`` fail with ENOSPC at the lowest call a test can reach: the file
    object Python's open() gives (torch.save, json, matplotlib, transformers write through it),
    safetensors' Rust ``save_file`` (its own error). ``written``: gets every path opened to
    write there."""
    real_open = io.open

    def opened(file, mode="r", *args, **kwargs):
        handle = real_open(file, mode, *args, **kwargs)
        if isinstance(file, (str, os.PathLike)) and set(mode) & set("wax"):
            (written if written is not None else set()).add(_target(file))
            return FullDisk(handle) if _target(file) == full else handle
        return handle

    def save_file(tensors, filename, **kwargs):
        (written if written is not None else set()).add(_target(filename))
        if _target(filename) == full:
            raise SafetensorError(
                "Error while serializing: I/O error: No space left on device (os error 28)"
            )
        return real_save_file(tensors, filename, **kwargs)

    with (
        mock.patch.object(io, "open", opened),
        mock.patch("builtins.open", opened),
        mock.patch.object(export, "save_file", save_file),
    ):
        yield


@contextmanager
def read_only(folder: Path):
    folder.mkdir(parents=True, exist_ok=True)
    mode = folder.stat().st_mode
    folder.chmod(0o555)
    try:
        yield
    finally:
        folder.chmod(mode)


def refusals(
    kind: str, written: list[tuple[Path, int, bool]], tmp: Path, most: int = 3
) -> list[tuple]:
    """``(what, context, the file refused if known)`` per point to refuse at in ``tmp``: a limit
    just under each written file's size, no space for each file whose writer
    :func:`disk_full_at` reaches, each written file's folder read-only (``written``: relative
    paths in the order written, sizes, reached); of these the first, one in the middle, the last."""
    points: dict[Path | int, tuple] = {}
    for path, size, reached in written:
        # under its size: the first file to grow as large fails (eval: also its trial);
        if kind == "file size limit":
            # 10 % under: a file whose size varies from run to run (eval's times) still does
            limit = size * 9 // 10
            points.setdefault(
                size, (f"ulimit {limit} bytes", partial(file_size_limit, limit), None)
            )
        elif kind == "disk full" and reached:
            points.setdefault(
                path, (f"no space for {path}", partial(disk_full_at, tmp / path), tmp / path)
            )
        elif kind == "read-only folder":
            points.setdefault(
                path.parent,
                (f"read-only {path.parent}", partial(read_only, tmp / path.parent), None),
            )
    found = list(points.values())
    return (
        found
        if len(found) <= most
        else [found[i * (len(found) - 1) // max(most - 1, 1)] for i in range(most)]
    )


def snapshot(folder: Path) -> dict[str, str]:
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        if p.is_file()
        else "folder"
        for p in sorted(folder.rglob("*"))
    }


def leftovers(folder: Path) -> list[str]:
    """Temporary files and folders (``.NAME.tmp-PID``, ``.NAME.old-PID``) and locks."""
    return [
        str(p)
        for p in folder.rglob("*")
        if ".tmp-" in p.name or ".old-" in p.name or ".lock" in p.name or p.name == LOCK_NAME
    ]


def written_files(tmp: Path, argv: list) -> list[tuple[Path, int, bool]]:
    """Run ``argv`` undisturbed: the files it wrote in ``tmp`` (relative), in the order written,
    with their sizes and whether :func:`disk_full_at` can reach their writer (a Rust writer of a
    path, but safetensors', it cannot)."""
    before, reached = {p: p.stat().st_mtime_ns for p in tmp.rglob("*")}, set()
    with disk_full_at(None, reached):
        result = run_cli(*argv)
    assert result.returncode == 0, result.stderr[-3000:]
    files = sorted(
        (p for p in tmp.rglob("*") if p.is_file() and before.get(p) != p.stat().st_mtime_ns),
        key=lambda p: p.stat().st_mtime_ns,
    )
    return [(p.relative_to(tmp), p.stat().st_size, p in reached) for p in files]


def assert_refused(result, out: Path, kind: str) -> Path:
    """One line naming a file of ``out`` (or its temporary, or its lock), the errno, and the
    fix; exit 2."""
    code, fix = KINDS[kind]
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr[-3000:]
    lines = result.stderr.splitlines()
    errors = [i for i, line in enumerate(lines) if "error:" in line]
    assert len(errors) == 1, result.stderr[-3000:]
    line = lines[errors[0]]
    assert f"] {code})" in line and fix in lines[errors[0] + 1], line
    named = Path(line.split(": error: cannot ", 1)[1].split(" ", 1)[1].split(": ", 1)[0])
    assert named == out or named.is_relative_to(out) or named.name.startswith(f".{out.name}."), (
        named,
        out,
    )
    return named


def trial_write(path: Path, size: int) -> bool:
    """Whether ``size`` bytes can be written to ``path``'s temporary name now: what eval tries
    before it evaluates (fixed_embed/evaluation/suite.py's check_results_folder)."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(temporary_name(path), "wb") as file:
            file.write(bytes(size))
        return True
    except OSError:
        return False
    finally:
        temporary_name(path).unlink(missing_ok=True)


@pytest.mark.parametrize("kind", sorted(KINDS))
@pytest.mark.parametrize(
    "command",
    [pytest.param(c, marks=[pytest.mark.slow] * (c in WHOLE_LAUNCH)) for c in sorted(LAUNCH)],
)
def test_a_refused_write_is_one_line_naming_the_file_and_keeps_what_was_there(
    command, kind, tmp_path, corpus, checkpoint, request
):
    if kind == "read-only folder" and os.geteuid() == 0:
        pytest.skip("root writes into read-only folders")
    if gap := GAPS.get(command) or GAPS.get((command, kind)):
        request.applymarker(pytest.mark.xfail(reason=gap, strict=True))
    argv, out = LAUNCH[command](tmp_path, corpus, checkpoint)
    written = written_files(tmp_path, argv)
    again = AGAIN.get(command, [])
    for i, (what, *_) in enumerate(refusals(kind, written, tmp_path, POINTS.get(command, 3))):
        tmp = tmp_path
        if command in FRESH_ONLY:  # the same point, in a new folder
            (tmp := tmp_path / f"fresh-{i}").mkdir()
            argv, out = LAUNCH[command](tmp, corpus, checkpoint)
        refusal, refused = next(
            point[1:] for point in refusals(kind, written, tmp) if point[0] == what
        )
        before = snapshot(tmp)
        with mock.patch.object(eval_cli, "run_suite", wraps=run_suite) as evaluated, refusal():
            probe_refused = command == "eval" and not trial_write(out / "results.json", 4096)
            result = run_cli(*argv, *again)
        named = assert_refused(result, out, kind)
        # a folder written whole
        whole = named == out and refused is not None and refused.is_relative_to(out)
        assert refused in (None, named) or whole, (what, named)
        assert not leftovers(tmp), (what, leftovers(tmp))
        after = snapshot(tmp)
        for file in (k for k in set(before) | set(after) if (tmp / k).is_relative_to(named)):
            # its previous bytes or none, never a part
            assert after.get(file) in (before.get(file), None), (
                what,
                file,
            )
        # refused before the evaluation when a write would be; else the scores are printed
        if command == "eval":
            assert (
                evaluated.called != probe_refused and (SCORES in result.stdout) == evaluated.called
            ), what
        rerun = run_cli(*argv, *RERUN.get(command, []))  # undisturbed, it finishes the work
        assert rerun.returncode == 0, (what, rerun.stderr[-3000:])


@pytest.mark.parametrize("command", sorted(WRITERS))
def test_a_refused_lock_is_named_and_removed(command, tmp_path, corpus, checkpoint):
    """The lock is each writer's first write: under any lock record's size, the refusal is the
    lock's."""
    argv, out = LAUNCH[command](tmp_path, corpus, checkpoint)
    with file_size_limit(16):
        result = run_cli(*argv)
    assert_refused(result, out, "file size limit")
    assert not leftovers(tmp_path), leftovers(tmp_path)
