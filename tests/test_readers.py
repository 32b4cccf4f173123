"""A file replaced while another process reads it: readers and writers of one folder agree
through the run lock.

A reader of a folder another command writes (a fit reading token shards) leaves a record beside
the folder's lock (``.<name>.lock.read-<host>-<pid>``, heartbeat and staleness as the lock's); a
writer refuses while a live reader holds one, and a reader while a live writer holds the lock,
each naming the other. A shard replaced anyway (by a tool that takes no lock) is refused by name
when the reader next opens it, never read as another tokenizer's ids.

Generated: every writer of :data:`tests.test_one_writer.WRITERS` is refused while a reader holds
its output; every way of replacing a shard (a new file under its name, bytes changed in place at
the same size, a shorter file, deletion) is tried before and after the reader maps it.
"""

from __future__ import annotations

import os
import shutil
import socket
import time
from pathlib import Path
from unittest import mock

import lightning as L
import numpy as np
import pytest

from callbacks import CheckpointPolicy
from fixed_embed.data.token_shards import TokenShards
from fixed_embed.distributed import checkpoint as checkpoint_files
from fixed_embed.errors import DataError
from fixed_embed.evaluation import loading
from fixed_embed.run.lock import acquire, readers
from tests.cli import run_cli
from tests.helpers import fit_tiny
from tests.test_bad_paths import (
    LIGHTNING,
    arguments,
    baseline,
    commands,
    role,
)
from tests.test_bad_paths import valid as valid_inputs  # noqa: F401 (a fixture)
from tests.test_lifecycle import fit_args
from tests.test_one_writer import (
    WRITERS,
    refused,
    tree,
)


@pytest.mark.parametrize("command", sorted(WRITERS))
def test_a_writer_is_refused_while_a_reader_holds_its_output(command, tmp_path, corpus, checkpoint):
    make, beside = WRITERS[command]
    argv, out = make(tmp_path, corpus, checkpoint)
    (out.parent if beside else out).mkdir(parents=True, exist_ok=True)  # what a reader reads exists
    with acquire(out, beside=beside, shared=True):  # a reader, still reading
        during = tree(tmp_path)
        result = run_cli(
            *argv, *(["--overwrite"] if command in ("pretokenize", "export", "eval") else [])
        )
        refused(result.returncode, result.stderr, out)
        assert tree(tmp_path) == during  # the refused writer changed nothing


def test_pretokenize_overwrite_into_the_shards_a_running_fit_reads_is_refused(
    shards, tmp_path, corpus
):
    """The reported case, end to end: the fit's own reader record refuses the writer, and the
    fit goes on."""
    data, tok = corpus
    folder = tmp_path / "shards"
    shutil.copytree(shards, folder)
    overwrite = [
        "pretokenize",
        "--data",
        data,
        "--tokenizer",
        tok,
        "--out",
        folder,
        "--shards",
        "1",
        "--overwrite",
    ]
    seen, read = [], TokenShards.blocks

    def blocks(self, *args, **kwargs):  # a second command, while the fit reads its first batches
        if not seen:
            seen.append(run_cli(*overwrite))
        return read(self, *args, **kwargs)

    with mock.patch.object(TokenShards, "blocks", blocks):
        fit = run_cli(
            *fit_args(
                tmp_path,
                corpus,
                "gf2",
                f"--data.train={folder}",
                "--data.tokenizer=null",
                "--data.holdout_per_mille=100",
                "--trainer.max_steps",
                "2",
            )
        )
    assert fit.returncode == 0, fit.stderr[-3000:]
    refused(seen[0].returncode, seen[0].stderr, folder)
    # the reader's record
    assert f".shards.lock.read-{socket.gethostname()}-{os.getpid()}" in seen[0].stderr
    assert not list(tmp_path.glob(".shards.lock*"))  # the fit's record went with it
    assert run_cli(*overwrite).returncode == 0  # and now the writer may


def test_a_fit_is_refused_while_pretokenize_writes_its_shards(shards, tmp_path, corpus):
    with acquire(shards, "or choose another --out", beside=True):  # a pretokenize, still writing
        result = run_cli(
            *fit_args(tmp_path, corpus, "gf2", f"--data.train={shards}", "--data.tokenizer=null")
        )
        refused(result.returncode, result.stderr, shards)
    assert not (tmp_path / "logs").exists()  # refused before any work


def _new_file(path: Path) -> None:
    data = np.fromfile(path, dtype=np.uint8)
    path.unlink()
    data[::-1].tofile(path)


def _in_place(path: Path) -> None:
    with open(path, "r+b") as file:
        file.write(bytes(reversed(file.read(8))))
    # a write within the file system's mtime tick
    os.utime(path, ns=(time.time_ns(), path.stat().st_mtime_ns + 1))


REPLACEMENTS = {
    "a new file under its name": _new_file,
    "bytes changed in place, same size": _in_place,
    "a shorter file under its name": lambda path: (
        path.with_suffix(".new").write_bytes(b"x" * 10),
        os.replace(path.with_suffix(".new"), path),
    ),
    "truncated in place": lambda path: path.write_bytes(path.read_bytes()[:10]),
    "deleted": lambda path: path.unlink(),
}


@pytest.mark.parametrize(
    "mapped", [False, True], ids=["before the first read", "after the first read"]
)
@pytest.mark.parametrize("how", sorted(REPLACEMENTS))
def test_a_shard_replaced_under_a_reader_is_refused_by_name_or_read_as_checked(
    how, mapped, shards, tmp_path
):
    # no writer here writes in place: they write a new file and rename it
    if "in place" in how and mapped:
        pytest.skip(
            "a mapped file written in place shows the new bytes, cut short it faults (SIGBUS): "
            "docs/faults.md"
        )
    folder = tmp_path / "shards"
    shutil.copytree(shards, folder)
    reader = TokenShards(folder)
    blocks = np.arange(reader.block_count(8))
    before = reader.blocks(blocks, 8) if mapped else TokenShards(shards).blocks(blocks, 8)
    REPLACEMENTS[how](reader.files[-1])
    try:
        after = reader.blocks(blocks, 8)
    except DataError as error:
        assert not mapped and f"token shard {reader.files[-1]} was replaced" in str(error)
        return
    assert mapped and np.array_equal(after, before)  # a mapped shard is the file that was checked


def _reads_a_checkpoint(command: str) -> bool:
    return command not in LIGHTNING and any(
        role(f, command) in ("checkpoint", "sharded") for f, *_ in arguments(command)
    )


@pytest.mark.parametrize("command", [c for c in commands() if _reads_a_checkpoint(c)])
def test_every_reader_of_a_checkpoint_leaves_its_record_while_it_reads(
    command,
    valid_inputs,  # noqa: F811
    checkpoint,
    tmp_path,
):
    """Generated over the commands with a checkpoint argument: a fit's retention sees them
    (below)."""
    # one eval's task fits
    lead, parts = baseline(command, {**valid_inputs, "checkpoint": checkpoint}, tmp_path)
    positionals = [t for f, p, _ in arguments(command) if p and f in parts for t in parts[f]]
    options = [t for f, p, _ in arguments(command) if not p and f in parts for t in parts[f]]
    read = [
        p
        for f, *_ in arguments(command)
        if role(f, command) in ("checkpoint", "sharded")
        for p in parts[f][-1:]
    ]
    seen = []

    def spy(real):
        def reading(*args, **kwargs):
            seen.append(" ".join(what for path in read for what in readers(Path(path).resolve())))
            return real(*args, **kwargs)

        return reading

    with (
        mock.patch.object(loading, "load_weights_only", spy(loading.load_weights_only)),
        mock.patch.object(loading, "consolidate", spy(loading.consolidate)),
        mock.patch.object(checkpoint_files, "consolidate", spy(checkpoint_files.consolidate)),
    ):
        result = run_cli(*lead, *positionals, *options)
    assert result.returncode == 0, result.stderr[-3000:]
    assert seen and all(f"pid {os.getpid()} on {socket.gethostname()}" in s for s in seen), seen
    assert not list(Path(read[0]).parent.glob(".*.lock*"))  # released


def test_retention_keeps_a_checkpoint_while_it_is_read_and_prunes_it_at_a_later_save(
    tmp_path, corpus
):
    folder, kept = tmp_path / "policy", []

    class Reader(L.Callback):  # an eval reading update 2's checkpoint during updates 3 and 4
        lock = None

        def on_train_batch_end(self, trainer, *args):
            if trainer.global_step == 2:
                self.lock = acquire(folder / "step=00000002.ckpt", beside=True, shared=True)
            kept.append(sorted(int(p.stem.split("=")[1]) for p in folder.glob("step=*.ckpt")))
            if trainer.global_step == 4:
                self.lock.release()

    policy = CheckpointPolicy(every_n_steps=1, keep_last=1, dirpath=str(folder))
    # each update's save comes after
    fit_tiny(tmp_path, corpus, 6, max_steps=6, callbacks=[policy, Reader()])
    # update 2's kept by the save of 3, pruned by the save of 4
    assert kept == [
        [],
        [1],
        [2],
        [2, 3],
        [4],
        [5],
    ]
