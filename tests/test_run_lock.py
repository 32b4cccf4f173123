"""The run lock (issue 23): one launch per run folder. A live holder is refused and a stale one
taken over; every rank of an external launch (torchrun, srun) of a run in use prints the same
one-line refusal."""

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fixed_embed.distributed.ranks import is_launching_rank
from fixed_embed.run import lock as run_lock
from fixed_embed.run.lock import LOCK_NAME, RunInUseError, acquire
from tests.test_run_guard import (
    args,
    copy_run,
    trained,  # noqa: F401 (a fixture)
)

ROOT = Path(__file__).resolve().parents[1]


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


def test_the_run_lock_refuses_a_live_holder_and_takes_over_stale_ones(
    tmp_path, caplog, monkeypatch
):
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
    for environ, launching in [
        ({}, True),
        ({"LOCAL_RANK": "0", "NODE_RANK": "0"}, True),
        *(({k: "1"}, False) for k in ("LOCAL_RANK", "NODE_RANK", "RANK", "SLURM_PROCID")),
    ]:
        monkeypatch.setattr(os, "environ", environ)
        assert is_launching_rank() == launching, environ


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


@pytest.mark.slow
@pytest.mark.parametrize("launcher", ["torchrun", "srun"])
def test_every_rank_of_an_external_launch_of_a_run_in_use_prints_its_refusal(
    launcher,
    trained,  # noqa: F811 (the imported fixture)
    tmp_path,
    corpus,
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
    # each agent writes its worker's output to files, apart from the agent's own
    if launcher == "torchrun":
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
    # as a first launch still training would
    held, started, ranks = (
        acquire(run),
        time.monotonic(),
        [],
    )
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
    # torchrun: 1
    assert [rank.returncode for rank in ranks] == ([1, 1] if launcher == "torchrun" else [2, 2])
    assert not any(
        word in out for out in said for word in ("DistNetworkError", "DistStoreError", "timed out")
    )
