"""One launch per run, every refusal before work, unfinished work named, and one error boundary
(issue 23).

One tiny run (two updates, a checkpoint after each, the final benchmark) is trained once for the
module; every refusal below is then a sub-second launch against it, refused before any model or
data is built (no "Checkpoints:" line: the checkpoint policy's ``on_fit_start`` never ran).
"""

import errno
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from fixed_embed.distributed.ranks import is_launching_rank
from fixed_embed.run import lock as run_lock
from fixed_embed.run.lock import LOCK_NAME, RunInUseError, acquire
from tests.cli import run_cli
from tests.test_lifecycle import fit_args, scalars

ROOT = Path(__file__).resolve().parents[1]
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


def dead_pid():
    pid = 4_000_000
    while True:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return pid
        except PermissionError:
            pass
        pid -= 1


def test_the_run_lock_refuses_a_live_holder_and_takes_over_stale_ones(tmp_path, caplog):
    folder = tmp_path / "run"
    held = acquire(folder)
    with pytest.raises(
        RunInUseError,
        match=rf"in use by another launch \(pid {os.getpid()} on {socket.gethostname()}",
    ):
        acquire(folder)
    held.release()
    acquire(folder).release()  # released: free again
    assert not folder.exists()  # and the folder the lock made, left empty, went with it

    folder.mkdir()
    lock = folder / LOCK_NAME
    # this host, a pid that is not running: stale, taken over with a note
    lock.write_text(
        json.dumps({"host": socket.gethostname(), "pid": dead_pid(), "since": time.time()})
    )
    with caplog.at_level("INFO"):
        taken = acquire(folder)
    assert "run lock: taking over" in caplog.text and "is not running" in caplog.text
    taken.release()
    # another host: alive while its heartbeat is fresh, stale once it stopped for STALE_AFTER_S
    lock.write_text(
        json.dumps(
            {"host": "elsewhere", "pid": 1, "since": time.time(), "command": "fixed-embed fit"}
        )
    )
    with pytest.raises(RunInUseError, match="pid 1 on elsewhere"):
        acquire(folder)
    old = time.time() - run_lock.STALE_AFTER_S - 60
    os.utime(lock, (old, old))
    with caplog.at_level("INFO"):
        acquire(folder).release()
    assert "heartbeat stopped" in caplog.text
    # ranks other than the launching process of global rank 0 share the lock: they neither take nor
    # check it
    assert is_launching_rank({}) and is_launching_rank({"LOCAL_RANK": "0", "NODE_RANK": "0"})
    assert not any(
        is_launching_rank({k: "1"}) for k in ("LOCAL_RANK", "NODE_RANK", "RANK", "SLURM_PROCID")
    )


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


@pytest.mark.slow
def test_a_lock_held_by_another_process_is_refused_until_it_is_killed(tmp_path, caplog):
    code = (
        "import sys, time; from fixed_embed.run.lock import acquire; acquire(sys.argv[1]); "
        "print('held', flush=True); time.sleep(60)"
    )
    holder = subprocess.Popen(
        [sys.executable, "-c", code, str(tmp_path)], stdout=subprocess.PIPE, text=True, cwd=ROOT
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(RunInUseError, match=f"pid {holder.pid} on {socket.gethostname()}"):
            acquire(tmp_path)
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    with caplog.at_level("INFO"):  # killed: its lock is stale, taken over with a note
        acquire(tmp_path).release()
    assert f"taking over {tmp_path / LOCK_NAME} from pid {holder.pid}" in caplog.text


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
    shutil.copy(
        checkpoints / "step=00000001.ckpt", checkpoints / "last.ckpt"
    )  # restored from a backup
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
    os.truncate(
        newest, newest.stat().st_size // 2
    )  # in place, as a full disk or a lost node leaves it
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
    assert message[1] == fix and "last.ckpt" not in "".join(message[:2]), (
        message
    )  # two lines, the broken link unsaid
    assert message[0].endswith("failed finding central directory);"), (
        message
    )  # torch's first sentence, whole
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
    shutil.rmtree(
        run / "benchmarks" / "step_00000002"
    )  # as a SIGTERM during the final benchmark leaves it
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
        assert (
            "Traceback" not in result.stderr and "usage:" not in result.stderr
        )  # the error, not the usage
        assert len(result.stderr.strip().splitlines()) <= 2


@pytest.mark.slow
@pytest.mark.parametrize("launcher", ["torchrun", "srun"])
def test_every_rank_of_an_external_launch_of_a_run_in_use_prints_its_refusal(
    launcher, trained, tmp_path, corpus
):
    """Ranks started at once: two torchrun agents (two "nodes" on 127.0.0.1, torchrun's store),
    or two srun tasks (SLURM's variables; rank 0 hosts the store). Rank 1 reads nothing of the
    run until rank 0 holds the lock and learns its refusal from it: each prints the same one
    line and exits, none waits for a timeout."""
    run = copy_run(trained, tmp_path)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    fit = args(
        tmp_path,
        corpus,
        "--trainer.max_steps",
        "4",
        "--ckpt_path",
        "last",
        "--trainer.strategy",
        "ddp",
        "--trainer.accelerator",
        "cpu",
    )
    if (
        launcher == "torchrun"
    ):  # each agent writes its worker's output to files, apart from the agent's own
        tasks = [
            (
                {},
                [
                    sys.executable,
                    "-m",
                    "torch.distributed.run",
                    "--nnodes",
                    "2",
                    "--nproc-per-node",
                    "1",
                    "--rdzv-backend",
                    "c10d",
                    "--rdzv-endpoint",
                    f"127.0.0.1:{port}",
                    "--rdzv-id",
                    "guard",
                    "--log-dir",
                    str(tmp_path / f"agent{n}"),
                    "--redirects",
                    "3",
                    "-m",
                    "fixed_embed",
                    *fit,
                    "--trainer.num_nodes",
                    "2",
                ],
            )
            for n in range(2)
        ]
    else:
        slurm = {
            "SLURM_NTASKS": "2",
            "SLURM_NTASKS_PER_NODE": "2",
            "SLURM_JOB_ID": "4242",
            "SLURM_NODEID": "0",
            "SLURM_NODELIST": "localhost",
            "SLURM_JOB_NAME": "fit",
            "MASTER_PORT": str(port),
        }
        command = [sys.executable, "-m", "fixed_embed", *fit, "--trainer.devices", "2"]
        tasks = [
            ({**slurm, "SLURM_PROCID": str(n), "SLURM_LOCALID": str(n)}, command) for n in range(2)
        ]
    held, started, ranks = (
        acquire(run),
        time.monotonic(),
        [],
    )  # as a first launch still training would
    try:
        ranks = [
            subprocess.Popen(
                argv, stderr=subprocess.PIPE, text=True, cwd=ROOT, env={**os.environ, **env}
            )
            for env, argv in tasks
        ]
        said = [rank.communicate(timeout=300)[1] for rank in ranks]
    finally:
        held.release()
        for rank in ranks:
            rank.kill()
    if launcher == "torchrun":
        # torchrun's agents may race at their own teardown (the one hosting the rendezvous exits
        # first and the other's shutdown call finds its socket closed): their words, not
        # fixed-embed's; none may be a timeout
        assert not any("timed out" in out for out in said), said
        said = [
            "".join(p.read_text() for p in (tmp_path / f"agent{n}").rglob("stderr.log"))
            for n in range(2)
        ]
    print(f"{launcher}: both refused in {time.monotonic() - started:.1f} s:\n" + "\n".join(said))
    errors = [
        [line for line in out.splitlines() if line.startswith("fixed-embed fit: error:")]
        for out in said
    ]
    assert [len(lines) for lines in errors] == [1, 1] and errors[0] == errors[1], said
    assert f"run folder {run} is in use by another launch (pid {os.getpid()}" in errors[0][0]
    assert [rank.returncode for rank in ranks] == (
        [1, 1] if launcher == "torchrun" else [2, 2]
    )  # torchrun: 1
    assert not any(
        word in out for out in said for word in ("DistNetworkError", "DistStoreError", "timed out")
    )
