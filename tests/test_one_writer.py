"""One writer per folder: a command started on an output that another live command is writing is
refused in one line naming the holder (pid, host), and leaves nothing behind; the first finishes
as if alone.

Generated: the commands come from ``fixed_embed.cli.COMMANDS`` (and
``benchmarks/gpu_check.py``). Each is a writer (:data:`WRITERS`: how to launch it on an output,
and where that output's lock lies) or says why it is not (:data:`NOT_WRITERS`); a new command
fails :func:`test_every_command_is_a_writer_or_says_why_not` until it is one or the other, and
an argparse command with an output argument cannot be listed as not writing. "At once" is made
deterministic: this process holds the output's run lock (as a first launch still writing would)
and runs the command in-process; one real two-process race (pretokenize) is a slow test.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from unittest import mock

import pytest

from fixed_embed.cli import COMMANDS
from fixed_embed.run import lock as run_lock
from fixed_embed.run.lock import LOCK_NAME, acquire
from tests.cli import run_cli
from tests.test_bad_paths import OUTPUT, arguments
from tests.test_lifecycle import fit_args

ROOT = Path(__file__).resolve().parents[1]
NOT_WRITERS = {
    "validate": "scores a checkpoint: writes no run folder and takes no run lock (its logs are "
    "Lightning's own)",
    "test": "validate's path (fixed_embed/cli/train.py)",
    "params": "prints a report, writes nothing",
    "tokenizer": "one tokenizer file through atomic_path: two trainings of one corpus leave the "
    "same whole file",
    "table": "prints a table; --output is that table as one file (the same inputs give the same "
    "table)",
    "analyze": "one <analysis>.json through atomic_write_text (and its PNG) per analysis: the last "
    "whole file wins",
    "lm-eval": "lm-eval's own CLI (its output is lm-eval's)",
    "prefetch": "fills the hub caches, which datasets and huggingface_hub lock themselves",
    "generate": "prints the continuation, writes nothing",
}


def _pretokenize(tmp, corpus, checkpoint):
    data, tok = corpus
    out = tmp / "shards"
    return [
        "pretokenize",
        "--data",
        data,
        "--tokenizer",
        tok,
        "--out",
        out,
        "--shards",
        "2",
        "--no-progress",
    ], out


def _eval(tmp, corpus, checkpoint):
    out = tmp / "eval"
    return [
        "eval",
        checkpoint,
        "--tasks",
        "fixed_embed_word_order",
        "--limit",
        "2",
        "--device",
        "cpu",
        "--output",
        out,
    ], out


def _export(tmp, corpus, checkpoint):
    return ["export", checkpoint, tmp / "hf"], tmp / "hf"


def _consolidate(tmp, corpus, checkpoint):
    return [
        "consolidate",
        tmp,
        tmp / "one.ckpt",
    ], tmp / "one.ckpt"  # refused before its input is read


def _fit(tmp, corpus, checkpoint):
    return fit_args(
        tmp, corpus, "gf2", "--trainer.max_steps", "1"
    ), tmp / "logs" / "tiny" / "gf2" / "default"


# command -> (its command line and output in a folder, whether the lock lies beside the output
# (else in it))
WRITERS = {
    "pretokenize": (_pretokenize, True),
    "eval": (_eval, True),
    "export": (_export, True),
    "consolidate": (_consolidate, True),
    "fit": (_fit, False),
}
# Writers whose undisturbed run is another test's: here only their refusal.
SUCCESS_ELSEWHERE = {
    "fit": "a whole launch (~10 s): tests/test_run_guard.py and tests/test_lifecycle.py",
    "consolidate": "needs a sharded (FSDP2) checkpoint: tests/test_sharding.py",
}


def gpu_check(*argv: str) -> tuple[int, str]:
    """``benchmarks/gpu_check.py ARGV`` in this process: its exit status and stderr."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import gpu_check

    err = __import__("io").StringIO()
    with (
        mock.patch.object(sys, "argv", ["gpu_check.py", *argv]),
        mock.patch.object(sys, "stderr", err),
    ):
        try:
            code = gpu_check.main()
        except SystemExit as stop:
            code = stop.code
    return code, err.getvalue()


def tree(folder: Path) -> dict[str, int]:
    return {str(p.relative_to(folder)): p.lstat().st_size for p in sorted(folder.rglob("*"))}


def test_every_command_is_a_writer_or_says_why_not():
    assert not set(WRITERS) & set(NOT_WRITERS)
    assert set(COMMANDS) == set(WRITERS) | set(NOT_WRITERS), (
        "classify the new command in WRITERS or NOT_WRITERS"
    )
    for command in set(NOT_WRITERS) - {"validate", "test", "lm-eval"}:  # argparse's own parsers
        outputs = [name for name, *_ in arguments(command) if OUTPUT.search(name)]
        assert not outputs or command in ("tokenizer", "table", "analyze"), (command, outputs)


def refused(code: int, stderr: str, target: Path) -> None:
    assert code == 2, stderr[-3000:]
    assert "Traceback" not in stderr, stderr[-3000:]
    lines = [line for line in stderr.splitlines() if "error:" in line]
    assert len(lines) == 1, stderr[-3000:]
    assert (
        f"{target} is in use by another launch (pid {os.getpid()} on {socket.gethostname()}"
        in lines[0]
    ), lines


@pytest.mark.parametrize("command", sorted(WRITERS))
def test_a_second_writer_is_refused_naming_the_first_and_leaves_nothing(
    command, tmp_path, corpus, checkpoint
):
    make, beside = WRITERS[command]
    argv, out = make(tmp_path, corpus, checkpoint)
    before = tree(tmp_path)
    with acquire(out, beside=beside):  # the first writer, still writing
        during = tree(tmp_path)
        result = run_cli(*argv)
        refused(result.returncode, result.stderr, out)
        assert tree(tmp_path) == during  # the refused launch wrote nothing
    # the refused launch made nothing, and the holder's lock went with it
    assert tree(tmp_path) == before
    if command in SUCCESS_ELSEWHERE:
        return
    result = run_cli(*argv)  # now alone: it writes, and leaves only its output
    assert result.returncode == 0, result.stderr[-3000:]
    stray = [
        name
        for name in tree(tmp_path)
        if name not in before and not (tmp_path / name).is_relative_to(out)
    ]
    assert not stray and not [p for p in out.parent.glob(f".{out.name}*")], stray
    if command == "pretokenize":
        assert not list(out.glob("part-*")) and not (out / LOCK_NAME).exists()


def test_a_refused_fit_leaves_no_run_folder(tmp_path, corpus):
    """Refused after its lock (a missing data.train): the run-folder tree the lock made goes
    with it."""
    with mock.patch.object(run_lock, "acquire", wraps=run_lock.acquire) as taken:
        result = run_cli(
            *fit_args(tmp_path, corpus, "gf2", f"--data.train={tmp_path}/missing.jsonl")
        )
    assert result.returncode == 2 and "missing.jsonl" in result.stderr, result.stderr[-3000:]
    assert taken.called, "refused before its lock: this test needs a refusal after it"
    assert not (tmp_path / "logs").exists(), tree(tmp_path)


def test_a_second_gpu_check_is_refused_and_the_first_folder_kept(tmp_path):
    out = tmp_path / "gpu-check"
    out.mkdir()
    (out / "report.md").write_text("the first check's report")
    before = tree(tmp_path)
    with acquire(out, beside=True):
        code, stderr = gpu_check("--device", "cpu", "--out", str(out))
        refused(code, stderr, out)
    assert tree(tmp_path) == before  # not wiped, nothing added, the lock gone


def _holder(lock: Path) -> dict | None:
    try:
        return json.loads(lock.read_text())
    except (OSError, ValueError):
        return None


@pytest.mark.slow
def test_two_pretokenize_processes_at_once_one_writes_one_is_refused(tmp_path, corpus):
    """Two real processes: the first is stopped (SIGSTOP) while it holds its lock, so the second
    always meets it mid-write however slowly either starts; then the first goes on and finishes
    alone."""
    data, tok = corpus
    # seconds of work: time to be stopped in
    (tmp_path / "docs.jsonl").write_text(Path(data).read_text() * 10)
    argv, out = _pretokenize(tmp_path, (tmp_path / "docs.jsonl", tok), None)
    command = [sys.executable, "-m", "fixed_embed", *map(str, argv)]
    first = subprocess.Popen(
        command, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )
    lock = tmp_path / f".{out.name}.lock"
    # its record written: the holder it names is the first
    while not _holder(lock) and first.poll() is None:
        time.sleep(0.01)
    os.kill(first.pid, signal.SIGSTOP)
    try:
        second = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300)
    finally:
        os.kill(first.pid, signal.SIGCONT)
    assert first.wait(300) == 0, first.stderr.read()[-3000:]
    assert second.returncode == 2 and "Traceback" not in second.stderr, second.stderr[-3000:]
    assert (
        f"{out} is in use by another launch (pid {first.pid} on {socket.gethostname()}"
        in second.stderr
    )
    left = sorted(p.name for p in tmp_path.rglob("*") if not p.name.endswith(".bin"))
    assert left == ["docs.jsonl", "shards", "token_shards.json", "tokenizer.json"], left
