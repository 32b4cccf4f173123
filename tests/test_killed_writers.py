"""Leftovers of killed writers: a writer killed (``kill -9``) at any of its renames leaves
temporary files and folders (``.NAME.tmp-PID``, ``.NAME.old-PID``: a whole model each at paper
scale); whoever takes over its lock removes them, and a previous output it had moved aside is
put back.

Generated: every writing command of :data:`tests.test_one_writer.WRITERS` runs in a forked child
that dies (``os._exit``, no clean-up: as ``kill -9``) just before its k-th ``os.replace``, for k
spread over all the renames a whole run makes; then the same command runs again here, as a
user's relaunch, and must succeed and leave nothing hidden behind. A new writer joins by being
listed there.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from unittest import mock

import pytest
import torch

from fixed_embed.atomic import remove_leftovers
from tests.cli import run_cli
from tests.test_one_writer import WRITERS

KILL_POINTS = (
    4  # renames tried per command, spread over the run's renames (first and last included)
)
# What a whole run leaves hidden by design (the BPE cache's folder, a run's console log): never a
# killed write's.
HIDDEN_BY_DESIGN = (".cache",)


def _renames(argv: list) -> int:
    """How many ``os.replace`` calls a whole run of ``argv`` makes."""
    real, count = os.replace, [0]

    def counted(*args, **kwargs):
        count[0] += 1
        return real(*args, **kwargs)

    with mock.patch.object(os, "replace", counted):
        result = run_cli(*argv)
    assert result.returncode == 0, result.stderr[-3000:]
    return count[0]


def _killed_at(argv: list, k: int) -> int:
    """Run ``argv`` in a forked child that dies just before its k-th ``os.replace``; return the
    child's pid."""
    pid = os.fork()
    if pid == 0:  # the child: no pytest clean-up, no atexit (a kill -9 runs none)
        # the parent's OpenMP pool is not in the child: a parallel op there would hang
        torch.set_num_threads(1)
        try:
            real, count = os.replace, [0]

            def dying(*args, **kwargs):
                count[0] += 1
                if count[0] == k:
                    os._exit(137)
                return real(*args, **kwargs)

            with mock.patch.object(os, "replace", dying):
                run_cli(*argv)
        finally:
            os._exit(0)
    deadline = time.monotonic() + 120
    while (done := os.waitpid(pid, os.WNOHANG))[0] == 0:
        if time.monotonic() > deadline:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
            pytest.fail(f"the killed child of {argv[0]} hung")
        time.sleep(0.05)
    assert os.waitstatus_to_exitcode(done[1]) == 137, f"{argv[0]} ended before rename {k}"
    return pid


def hidden(folder: Path) -> list[str]:
    return sorted(
        str(p.relative_to(folder))
        for p in folder.rglob(".*")
        if not p.name.startswith(HIDDEN_BY_DESIGN)
        and not any(q.name.startswith(HIDDEN_BY_DESIGN) for q in p.parents)
    )


@pytest.mark.slow
# consolidate: see below
@pytest.mark.parametrize("command", sorted(set(WRITERS) - {"consolidate"}))
def test_a_writer_killed_at_any_rename_leaves_nothing_after_the_relaunch(
    command, tmp_path, corpus, checkpoint
):
    make, _ = WRITERS[command]
    argv, out = make(tmp_path, corpus, checkpoint)
    if command == "fit":  # each kill in a fresh run of its own; the relaunch continues it
        again = lambda k: [*argv, "--run", f"killed-{k}"]  # noqa: E731
        # the first fit also fills the data caches: renames of its own
        assert run_cli(*again(-1)).returncode == 0
        renames = _renames(again(0))
    # over the previous output: an export's kill can fall between moving it aside and the swap
    else:
        again = lambda k: [*argv, "--overwrite"]  # noqa: E731
        assert run_cli(*argv).returncode == 0
        renames = _renames(again(0))
    # a fit's relaunch takes seconds: its first and last renames
    tried = 2 if command == "fit" else KILL_POINTS
    points = sorted({1 + round(i * (renames - 1) / (tried - 1)) for i in range(tried)})
    for k in points:
        pid = _killed_at(again(k), k)
        # it left some
        assert any(name.endswith(f"-{pid}") for name in hidden(tmp_path)), (
            k,
            hidden(tmp_path),
        )
        result = run_cli(*again(k), *(["--ckpt_path", "last"] if command == "fit" else []))
        assert result.returncode == 0, (k, result.stderr[-3000:])
        assert hidden(tmp_path) == [], (k, hidden(tmp_path))
    if command == "export":
        assert (out / "config.json").is_file() and (out / "model.safetensors").is_file()


def test_what_a_dead_writer_left_goes_and_its_moved_aside_output_comes_back(tmp_path):
    """The unit under the generated test, for consolidate too (its write is an atomic file of
    the same kind): the dead pid's files and folders of this target go; a live writer's, another
    target's and other names stay; a moved-aside output returns."""
    dead, live = 4_194_301, os.getpid()
    kept = [
        tmp_path / f".one.ckpt.tmp-{live}",
        tmp_path / f".other.ckpt.tmp-{dead}",
        tmp_path / "other.txt",
    ]
    for path in [tmp_path / f".one.ckpt.tmp-{dead}", *kept]:
        path.write_text("x")
    remove_leftovers(tmp_path / "one.ckpt", dead, beside=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(p.name for p in kept)
    folder = tmp_path / "export"
    (tmp_path / f".export.old-{dead}").mkdir()
    (tmp_path / f".export.old-{dead}" / "config.json").write_text("{}")
    (tmp_path / f".export.tmp-{dead}").mkdir()
    (tmp_path / f".export.tmp-{dead}" / "model.safetensors").write_text("half")
    remove_leftovers(folder, dead, beside=True)
    assert (
        folder / "config.json"
    ).read_text() == "{}"  # killed between the renames: the previous export is back
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["export", *(p.name for p in kept)])
