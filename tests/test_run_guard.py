"""One launch per run, every refusal before work, unfinished work named, and one error boundary
(issue 23); the run lock itself is tests/test_run_lock.py.

One tiny run (two updates, a checkpoint after each, the final benchmark) is trained once for the
module; every refusal below is then a sub-second launch against it, refused before any model or
data is built (no "Checkpoints:" line: the checkpoint policy's ``on_fit_start`` never ran).
"""

import errno
import json
import os
import shutil
import socket
import time

import pytest
import torch

from fixed_embed.run.lock import LOCK_NAME, acquire
from tests.cli import run_cli
from tests.test_lifecycle import fit_args, scalars

CALLBACKS = """
trainer:
  callbacks:
    - class_path: callbacks.CheckpointPolicy
      init_args: {every_n_steps: 1, keep_last: 5}
    - class_path: callbacks.FailFast
    - class_path: callbacks.PreemptionCheckpoint
    - class_path: callbacks.BenchmarkCallback
      init_args: {tasks: [fixed_embed_word_order], every_n_steps: 0, limit: 8, batch_size: 4}
"""


def args(tmp, corpus, *extra, bench=True):
    """The tiny run with a checkpoint every update (and, with ``bench``, the final benchmark:
    lm-eval costs seconds)."""
    overlay = tmp / ("callbacks.yaml" if bench else "callbacks-no-bench.yaml")
    if not overlay.exists():
        overlay.write_text(
            CALLBACKS if bench else CALLBACKS.split("    - class_path: callbacks.benchmarks")[0]
        )
    return fit_args(
        tmp, corpus, "gf2", "--config", str(overlay), "--trainer.val_check_interval", "1000", *extra
    )


@pytest.fixture(scope="module")
def trained(tmp_path_factory, corpus):
    """A finished 2-update run: (its tmp root, its run folder)."""
    tmp = tmp_path_factory.mktemp("run")
    result = run_cli(*args(tmp, corpus, "--trainer.max_steps", "2", "--ckpt_path", "last"))
    assert result.returncode == 0, result.stderr[-3000:]
    run = tmp / "logs" / "tiny" / "gf2" / "default"
    assert sorted(p.name for p in (run / "checkpoints").glob("step=*")) == [
        "step=00000001.ckpt",
        "step=00000002.ckpt",
    ]
    assert not (run / LOCK_NAME).exists()  # released on the way out
    scored = json.loads((run / "benchmarks" / "step_00000002" / "results.json").read_text())
    assert (scored["checkpoint"], scored["update"]) == (
        str(run / "checkpoints" / "step=00000002.ckpt"),
        2,
    )
    return tmp, run


def copy_run(trained, tmp_path):
    """A private copy of the trained run (so a test may change it)."""
    tmp, _ = trained
    shutil.copytree(tmp / "logs", tmp_path / "logs", symlinks=True)
    shutil.copy(tmp / "callbacks.yaml", tmp_path / "callbacks.yaml")
    return tmp_path / "logs" / "tiny" / "gf2" / "default"


def refused(result, *needles):
    assert result.returncode == 2, result.stderr[-3000:]
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    assert "Checkpoints:" not in result.stderr  # refused before the trainer started: no work
    for needle in needles:
        assert needle in result.stderr, (needle, result.stderr[-2000:])


# -- 1. one launch per run folder
# ------------------------------------------------------------------------------


def test_a_second_launch_of_a_run_in_use_is_refused_naming_the_holder(
    trained, tmp_path, corpus, monkeypatch
):
    run = copy_run(trained, tmp_path)
    held = acquire(run)  # as a first launch still training would
    try:
        result = run_cli(*args(tmp_path, corpus, "--trainer.max_steps", "4", "--ckpt_path", "last"))
        refused(
            result,
            f"run folder {run} is in use by another launch (pid {os.getpid()} on "
            f"{socket.gethostname()}",
        )
        assert (run / LOCK_NAME).exists()  # the holder's lock is left alone
        # another rank of the same job (Lightning's launcher re-runs the command with LOCAL_RANK=1)
        # is not refused
        monkeypatch.setenv("LOCAL_RANK", "1")
        other = run_cli(*args(tmp_path, corpus, "--trainer.max_steps", "1", "--ckpt_path", "last"))
        assert "in use" not in other.stderr and "beyond the run's length" in other.stderr
    finally:
        held.release()


# -- 2. every refusal before any work
# ---------------------------------------------------------------------------


def test_resume_refusals_come_before_any_work(trained, tmp_path, corpus):
    tmp, _ = trained
    last = ("--ckpt_path", "last")
    # another number of loader workers: was "AssertionError: State doesn't contain key '_snapshot'"
    result = run_cli(
        *args(tmp, corpus, "--trainer.max_steps", "4", *last, "--data.num_workers", "2")
    )
    refused(
        result,
        "saved by 0 loader worker(s) per device and data.num_workers is 2",
        "resume with data.num_workers 0",
    )
    assert "_snapshot" not in result.stderr
    # a max_steps below the checkpoint's update: was "exit 0, nothing said"
    result = run_cli(*args(tmp, corpus, "--trainer.max_steps", "1", *last))
    refused(
        result,
        "step=00000002.ckpt is at update 2, beyond the run's length of 1 updates",
        "--trainer.max_steps",
    )
    # another interface, and another data stream, in one message
    result = run_cli(
        *args(
            tmp,
            corpus,
            "--trainer.max_steps",
            "4",
            *last,
            "--data.seq_len",
            "16",
            "--model.interface",
            "fixed_embed.interfaces.BinaryCodeInput",
        )
    )
    refused(result, "model.interface: checkpoint", "seq_len: checkpoint 32, now 16")
    # the plan, printed before any work, for a resume that goes ahead is tested in the curve test
    # below


def test_a_regular_last_ckpt_older_than_the_newest_step_is_refused(trained, tmp_path, corpus):
    run = copy_run(trained, tmp_path)
    checkpoints = run / "checkpoints"
    (checkpoints / "last.ckpt").unlink()
    # restored from a backup
    shutil.copy(checkpoints / "step=00000001.ckpt", checkpoints / "last.ckpt")
    result = run_cli(*args(tmp_path, corpus, "--trainer.max_steps", "4", "--ckpt_path", "last"))
    refused(
        result,
        f"{checkpoints / 'last.ckpt'} is a regular file at update 1, but "
        f"{checkpoints / 'step=00000002.ckpt'} (update 2) is newer",
        "roll the run back",
    )
    # a link left behind by a save that ended before the link moved gives way to the newest step
    (checkpoints / "last.ckpt").unlink()
    os.symlink("step=00000001.ckpt", checkpoints / "last.ckpt")
    result = run_cli(*args(tmp_path, corpus, "--trainer.max_steps", "2", "--ckpt_path", "last"))
    assert result.returncode == 0, result.stderr[-2000:]
    assert "step=00000002.ckpt is newer" in result.stderr and "run complete" in result.stderr


def test_a_truncated_newest_checkpoint_names_the_readable_one_and_how_to_resume_it(
    trained, tmp_path, corpus
):
    run = copy_run(trained, tmp_path)
    newest, intact = (
        run / "checkpoints" / "step=00000002.ckpt",
        run / "checkpoints" / "step=00000001.ckpt",
    )
    # in place, as a full disk or a lost node leaves it
    os.truncate(newest, newest.stat().st_size // 2)
    result = run_cli(
        *args(tmp_path, corpus, "--trainer.max_steps", "2", "--ckpt_path", "last", bench=False)
    )
    fix = (
        f"relaunch with --ckpt_path {intact} to resume the newest readable one beside it (update 1)"
    )
    refused(
        result,
        f"cannot read checkpoint {newest}: it is not a checkpoint written by fixed-embed fit, or "
        "is cut",
    )
    message = result.stderr[result.stderr.index("fixed-embed fit: error:") :].splitlines()
    # two lines, the broken link unsaid
    assert message[1] == fix and "last.ckpt" not in "".join(message[:2]), message
    # torch's first sentence, whole
    assert message[0].endswith("failed finding central directory);"), message
    result = run_cli(
        *args(tmp_path, corpus, "--trainer.max_steps", "2", "--ckpt_path", str(intact), bench=False)
    )
    assert result.returncode == 0, result.stderr[-2000:]  # the advice works: update 2 trained again
    assert torch.load(newest, mmap=True, weights_only=False)["global_step"] == 2


def test_a_finished_run_says_so_and_names_the_final_benchmark_it_lacks(trained, tmp_path, corpus):
    run = copy_run(trained, tmp_path)
    result = run_cli(*args(tmp_path, corpus, "--trainer.max_steps", "2", "--ckpt_path", "last"))
    assert result.returncode == 0 and "Checkpoints:" not in result.stderr, result.stderr[-2000:]
    assert "run complete:" in result.stderr and "nothing to train" in result.stderr
    assert "final benchmark" not in result.stderr  # it ran: benchmarks/step_00000002/results.json
    # as a SIGTERM during the final benchmark leaves it
    shutil.rmtree(run / "benchmarks" / "step_00000002")
    result = run_cli(*args(tmp_path, corpus, "--trainer.max_steps", "2", "--ckpt_path", "last"))
    assert result.returncode == 0, result.stderr[-2000:]
    line = next(
        line
        for line in result.stderr.splitlines()
        if "final benchmark at update 2 did not run" in line
    )
    command = line.split("get it with: ", 1)[1]
    assert command.startswith(
        f"fixed-embed eval {run / 'checkpoints' / 'step=00000002.ckpt'} --tasks "
    )
    assert f"--limit 8 --output {run / 'benchmarks' / 'step_00000002'}" in command


def test_a_run_name_longer_than_a_folder_name_may_be_is_refused(tmp_path, corpus):
    result = run_cli(*fit_args(tmp_path, corpus, "gf2", "--run", "r" * 300))
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "--run is 300 bytes long; a folder name may have at most 255" in result.stderr


# -- 3. unfinished work: the curve after a crash
# -----------------------------------------------------------------


def test_after_a_crash_the_resumed_curve_has_each_step_once(trained, tmp_path, corpus):
    from torch.utils.tensorboard import SummaryWriter

    run = copy_run(trained, tmp_path)
    # A launch that crashed after its checkpoint at update 2 had logged updates 3 and 4 (steps 2,
    # 3).
    crashed = SummaryWriter(log_dir=str(run))
    for step in (2, 3):
        crashed.add_scalar("train/loss", 99.0, step)
    crashed.close()
    time.sleep(1.05)  # the next event file is named by a later second
    result = run_cli(
        *args(
            tmp_path,
            corpus,
            "--trainer.max_steps",
            "4",
            "--ckpt_path",
            "last",
            "--model.optimizer.lr",
            "5e-4",
            bench=False,
        )
    )
    assert result.returncode == 0, result.stderr[-3000:]
    plan = result.stderr.index(
        f"resuming {run / 'checkpoints' / 'step=00000002.ckpt'} at update 2 of 4"
    )
    change = result.stderr.index(
        "resume: model.optimizer.lr: 0.001 in the checkpoint -> 0.0005 now"
    )
    assert plan < change < result.stderr.index("Checkpoints:")  # the plan, then the work
    assert result.stderr.count("model.optimizer.lr: 0.001 in the checkpoint") == 1
    losses = scalars(run, "train/loss")
    assert [step for step, _ in losses] == [0, 1, 2, 3], losses
    assert 99.0 not in [value for _, value in losses]


# -- 4. one error boundary
# ---------------------------------------------------------------------------------------


def test_a_refused_checkpoint_write_is_one_line_naming_the_intact_checkpoint(
    tmp_path, corpus, monkeypatch
):
    import fixed_embed.distributed.checkpoint as checkpoint_io

    saves, real = [], torch.save

    def save(obj, f, *a, **k):
        saves.append(f)
        if len(saves) == 2:
            raise OSError(errno.EFBIG, "File too large", str(getattr(f, "name", f)))
        return real(obj, f, *a, **k)

    monkeypatch.setattr(checkpoint_io.torch, "save", save)
    result = run_cli(*args(tmp_path, corpus, "--trainer.max_steps", "3", bench=False))
    assert result.returncode == 2, result.stderr[-3000:]
    assert "Traceback" not in result.stderr
    checkpoints = tmp_path / "logs" / "tiny" / "gf2" / "default" / "checkpoints"
    error = result.stderr[result.stderr.index("fixed-embed fit: error:") :]
    assert "File too large ([Errno 27] EFBIG)" in error and "ulimit -f" in error
    assert f"the run's previous checkpoint {checkpoints / 'step=00000001.ckpt'} is intact" in error
    assert not (checkpoints.parent / LOCK_NAME).exists()  # released on an error too


def test_eval_refuses_unknown_tasks_and_bad_limits_in_one_line(tmp_path):
    missing = tmp_path / "none.ckpt"
    for flags, message in (
        (["--tasks", "no_such_task"], "lm-eval knows no task ['no_such_task']"),
        (["--suite", "offline", "--limit", "0"], "--limit must be a finite float > 0, got '0'"),
        (["--suite", "offline", "--limit", "-3"], "--limit must be a finite float > 0, got '-3'"),
    ):
        result = run_cli("eval", missing, *flags)
        assert result.returncode == 2 and message in result.stderr, (flags, result.stderr[-1500:])
        # the error, not the usage
        assert "Traceback" not in result.stderr and "usage:" not in result.stderr
        assert len(result.stderr.strip().splitlines()) <= 2
