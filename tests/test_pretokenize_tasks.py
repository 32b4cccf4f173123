"""``fixed-embed pretokenize --tasks N --task I`` (docs/data.md, "Writing"): N tasks, at once on
other machines, each write a consecutive run of the shards; the same command without the two
flags then writes the index. Every file is the bytes of a single run, whatever N; a finished
task writes nothing, a failed one reruns alone."""

import subprocess
import sys
from pathlib import Path

import pytest

from tests.cli import run_cli

ROOT = Path(__file__).resolve().parents[1]
SHARDS = 5


def _argv(corpus, out: Path, *more: str) -> list[str]:
    data, tok = corpus
    return [
        "pretokenize",
        "--data",
        str(data),
        "--tokenizer",
        str(tok),
        "--out",
        str(out),
        "--shards",
        str(SHARDS),
        "--holdout-per-mille",
        "100",
        "--no-progress",
        *more,
    ]


def _files(out: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(out.iterdir())}


@pytest.fixture(scope="module")
def single(corpus, tmp_path_factory):
    """The files of a plain run (no --task), to compare every task split with."""
    out = tmp_path_factory.mktemp("single") / "s"
    assert run_cli(*_argv(corpus, out)).returncode == 0
    return _files(out)


def _task(corpus, out: Path, i: int, n: int, *more: str) -> str:
    result = run_cli(*_argv(corpus, out, "--tasks", str(n), "--task", str(i), *more))
    assert result.returncode == 0, result.stderr[-2000:]
    return result.stdout.strip()


def test_one_or_three_tasks_then_the_index_step_write_the_bytes_of_a_single_run(
    corpus, tmp_path, single
):
    for n in (1, 3):
        out = tmp_path / f"n{n}"
        lines = [_task(corpus, out, i, n) for i in range(n)]
        assert not (out / "token_shards.json").exists()  # the index is the step without --task's
        if n == 3:  # shards 0..0, 1..2, 3..4 of 5: consecutive runs by shard number
            assert lines[2].startswith(
                "pretokenize: task 2 of 3 wrote 2 of its shards 3..4 (0 finished before)"
            )
            assert (
                "the same `fixed-embed pretokenize` command without --tasks/--task writes the index"
                in lines[2]
            )
            assert not list(out.glob(".*"))  # the tasks' locks are gone
        index = run_cli(*_argv(corpus, out))
        assert (
            index.returncode == 0 and f"{SHARDS} shards kept from an earlier run" in index.stdout
        ), index.stderr
        assert _files(out) == single, n
    assert (
        _task(corpus, out, 1, 3)
        == f"pretokenize: {out} is already complete (token_shards.json): nothing to do"
    )
    assert _files(out) == single


def test_a_finished_task_writes_nothing_and_a_failed_one_reruns_alone(corpus, tmp_path, single):
    out = tmp_path / "s"
    for i in range(3):
        _task(corpus, out, i, 3)
    before = {p.name: p.stat().st_mtime_ns for p in out.iterdir()}
    assert "wrote 0 of its shards 1..2 (2 finished before)" in _task(corpus, out, 1, 3)
    assert {p.name: p.stat().st_mtime_ns for p in out.iterdir()} == before  # nothing written again
    # task 1 killed mid-write: its shard 2 unfinished (no part, a half-written temporary file of a
    # dead writer)
    (out / "part-00002.json").unlink()
    (out / "train-00002.bin").unlink()
    # a killed writer's leftover, of task 1's share
    (out / ".held_out-00002.bin.tmp-4194301").write_bytes(b"half")
    # of task 2's share: another machine's writer, maybe alive
    other = out / ".train-00004.bin.tmp-4194302"
    other.write_bytes(b"live?")
    assert "wrote 1 of its shards 1..2 (1 finished before)" in _task(corpus, out, 1, 3)
    assert not (out / ".held_out-00002.bin.tmp-4194301").exists()
    # not task 1's to remove: left to its own task (or the index step)
    assert other.read_bytes() == b"live?"
    other.unlink()
    assert run_cli(*_argv(corpus, out)).returncode == 0
    assert _files(out) == single


def test_the_index_step_waits_for_a_running_task_and_a_task_runs_once_at_a_time(corpus, tmp_path):
    from fixed_embed.run.lock import acquire

    out = tmp_path / "s"
    _task(corpus, out, 0, 2)
    # task 1 runs (this process holds its lock)
    with acquire(out / "task-00001-of-00002", beside=True):
        for argv in (_argv(corpus, out), _argv(corpus, out, "--tasks", "2", "--task", "1")):
            refused = run_cli(*argv)
            assert refused.returncode == 2, refused.stderr[-2000:]
            assert f"{out / 'task-00001-of-00002'} is in use by another launch" in refused.stderr
    assert "wrote 3 of its shards 2..4 (0 finished before)" in _task(corpus, out, 1, 2)


@pytest.mark.slow
def test_three_tasks_at_once_in_their_own_processes(corpus, tmp_path, single):
    """Real concurrent processes on one empty --out: the plan and tokenizer written by whichever
    comes first."""
    out = tmp_path / "s"
    tasks = [_argv(corpus, out, "--tasks", "3", "--task", str(i)) for i in range(3)]
    commands = [[sys.executable, "-m", "fixed_embed", *argv] for argv in tasks]
    tasks = [
        subprocess.Popen(c, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for c in commands
    ]
    for task in tasks:
        stdout, stderr = task.communicate(timeout=300)
        assert task.returncode == 0 and "pretokenize: task" in stdout, stderr[-3000:]
    assert run_cli(*_argv(corpus, out)).returncode == 0
    assert _files(out) == single


def bad_pairs():
    yield ["--task", "0"]  # without --tasks
    yield ["--tasks", "3"]  # without --task
    for i, n in (
        ("3", "3"),
        ("4", "3"),
        ("-1", "3"),
        ("0", "0"),
        ("0", "-2"),
        ("x", "3"),
        ("0", "1.5"),
    ):
        yield ["--task", i, "--tasks", n]
    yield ["--task", "0", "--tasks", str(SHARDS + 1)]  # more tasks than shards
    yield ["--task", "0", "--tasks", "2", "--overwrite"]  # would remove the other tasks' shards


@pytest.mark.parametrize("bad", list(bad_pairs()), ids=" ".join)
def test_a_bad_task_or_tasks_is_refused_in_one_line(corpus, tmp_path, bad):
    result = run_cli(*_argv(corpus, tmp_path / "s", *bad))
    errors = [line for line in result.stderr.splitlines() if "error:" in line]
    assert result.returncode == 2 and len(errors) == 1 and "usage:" not in result.stderr, (
        result.stderr[-2000:]
    )
    assert "--task" in errors[0], errors[0]
    assert not (tmp_path / "s").exists()  # before any work
