"""What a rank's failure says and who hears it: a rank killed by the OS is named, Ctrl-C is
said, a refusal or a bug on a peer reaches rank 0 at once, and the processes a launcher starts
together are found as Lightning sees them."""

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from fixed_embed.distributed import rank_watch
from tests.cli import run_cli

ROOT = Path(__file__).resolve().parents[1]


class FakeProc:
    def __init__(self, code):
        self.code = code

    def poll(self):
        return self.code


def test_a_rank_killed_by_the_os_is_named(monkeypatch, capsys):
    from types import SimpleNamespace

    from callbacks.fail_fast import FailFast

    environment = SimpleNamespace(node_rank=lambda: 0)
    launcher = SimpleNamespace(
        procs=[FakeProc(None), FakeProc(-9)], num_processes=3, cluster_environment=environment
    )
    trainer = SimpleNamespace(strategy=SimpleNamespace(launcher=launcher), is_global_zero=True)
    FailFast().on_exception(trainer, None, RuntimeError("Connection reset by peer"))
    assert (
        "fixed-embed: rank 2 exited with signal 9 (SIGKILL); relaunch with --ckpt_path last"
        in capsys.readouterr().err
    )
    # The fit command's boundary then ends with that line alone (printed already), exit status 1.
    import fixed_embed.cli.train as train

    def lost(*a, **k):
        rank_watch.note_lost_ranks(trainer)
        raise RuntimeError(
            "[../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection reset by peer"
        )

    monkeypatch.setattr(train, "FixedEmbedCLI", lost)
    result = run_cli("fit")
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert (
        result.stderr.strip()
        == "fixed-embed: rank 2 exited with signal 9 (SIGKILL); relaunch with --ckpt_path last"
    )


@pytest.mark.multi_rank
def test_a_rank_killed_with_sigkill_is_named_by_rank_0(tmp_path):
    result = subprocess.run(
        [
            sys.executable,
            str(ROOT / "tests" / "distributed_fit.py"),
            str(tmp_path / "out.json"),
            "--devices",
            "2",
            "--steps",
            "50",
            "--kill-on-rank",
            "1",
            "--fail-at",
            "2",
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=300,
    )
    assert result.returncode != 0
    assert (
        "fixed-embed: rank 1 exited with signal 9 (SIGKILL); relaunch with --ckpt_path last"
        in result.stderr
    ), result.stderr[-3000:]


def test_ctrl_c_is_said_on_the_console(monkeypatch):
    import fixed_embed.cli.train as train

    def interrupted(*a, **k):
        try:
            raise KeyboardInterrupt
        except KeyboardInterrupt:
            sys.exit(1)  # what Lightning's handler does

    monkeypatch.setattr(train, "FixedEmbedCLI", interrupted)
    result = run_cli("fit")
    assert result.returncode == 1 and "fixed-embed fit: interrupted (Ctrl-C)" in result.stderr
    assert "relaunch with --ckpt_path last" in result.stderr
    import fixed_embed.cli.params as params

    monkeypatch.setattr(params, "run", lambda argv: (_ for _ in ()).throw(KeyboardInterrupt()))
    result = run_cli("params", "x.yaml")
    assert result.returncode == 130 and "fixed-embed params: interrupted (Ctrl-C)" in result.stderr


PEER = """
import sys
from fixed_embed.errors import ConfigError
from fixed_embed.distributed.launch_agreement import in_turn
rank, what = int(sys.argv[1]), sys.argv[2]
def plan():
    if rank == 1 and what == "refuse":
        raise ConfigError("rank 1 refuses")
    if rank == 1 and what == "bug":
        raise RuntimeError("a bug on rank 1")
    # the CLI may print this one as a line of its own: rank 0 names it too
    if rank == 1 and what == "oserror":
        open("gone.bin")
    return "planned"
print(in_turn(plan, 1))
"""


@pytest.mark.slow
@pytest.mark.parametrize(
    ("what", "rank_0", "rank_1"),
    [
        ("go", "planned", "planned"),
        ("refuse", "RefusedOnAnotherRank: rank 1 refuses", "ConfigError: rank 1 refuses"),
        (
            "bug",
            "RefusedOnAnotherRank: global rank 1 failed: RuntimeError: a bug on rank 1",
            "RuntimeError: a bug on rank 1",
        ),
        (
            "oserror",
            "global rank 1 failed: FileNotFoundError: [Errno 2] No such file or directory: "
            "'gone.bin'",
            "FileNotFoundError: [Errno 2] No such file or directory: 'gone.bin'",
        ),
    ],
)
def test_a_refusal_or_a_bug_on_a_peer_reaches_rank_0_which_hosts_the_store(what, rank_0, rank_1):
    """srun's tasks (rank 0 hosts the store): a peer's refusal is rank 0's too, a peer's bug or
    OSError stops rank 0 at once (it does not wait for the process group's timeout) naming that
    error, and each exits within seconds."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    slurm = {
        "SLURM_NTASKS": "2",
        "SLURM_NTASKS_PER_NODE": "2",
        "SLURM_JOB_ID": "4242",
        "SLURM_NODEID": "0",
        "SLURM_NODELIST": "localhost",
        "SLURM_JOB_NAME": "fit",
        "MASTER_PORT": str(port),
    }
    envs = [
        {**os.environ, **slurm, "SLURM_PROCID": str(n), "SLURM_LOCALID": str(n)} for n in range(2)
    ]
    pipes = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE, "text": True, "cwd": ROOT}
    ranks = [
        subprocess.Popen([sys.executable, "-c", PEER, str(n), what], env=e, **pipes)
        for n, e in enumerate(envs)
    ]
    try:
        said = [rank.communicate(timeout=120) for rank in ranks]
    finally:
        for rank in ranks:
            rank.kill()
    last = [(out.strip() or err.strip()).splitlines()[-1] for out, err in said]
    assert last[0].endswith(rank_0) and last[1].endswith(rank_1), said


def test_the_processes_started_at_once_are_found_as_lightning_will_see_them(monkeypatch):
    from fixed_embed.distributed.launch_agreement import peers

    ranks = {
        "RANK",
        "LOCAL_RANK",
        "WORLD_SIZE",
        "GROUP_RANK",
        "NODE_RANK",
        "LOCAL_WORLD_SIZE",
        "MASTER_ADDR",
        "MASTER_PORT",
    }
    for name in [n for n in os.environ if n.startswith(("SLURM_", "TORCHELASTIC_")) or n in ranks]:
        monkeypatch.delenv(name)
    # a lone launcher (Lightning starts its ranks after it)
    assert peers(1) is None and peers(2) is None
    slurm = {
        "SLURM_NTASKS": "4",
        "SLURM_NTASKS_PER_NODE": "4",
        "SLURM_PROCID": "2",
        "SLURM_LOCALID": "2",
        "SLURM_NODELIST": "localhost",
        "SLURM_JOB_ID": "4242",
        "MASTER_PORT": "29511",
    }
    for name, value in slurm.items():
        monkeypatch.setenv(name, value)
    # an allocation Lightning launches in itself: no agreement
    monkeypatch.setenv("SLURM_JOB_NAME", "interactive")
    assert peers(1) is None
    monkeypatch.setenv("SLURM_JOB_NAME", "fit")  # srun's tasks
    assert peers(1) == (2, 4, "localhost", 29511)
    for name in slurm:
        monkeypatch.delenv(name)
    # node 1 of a two-node Lightning launch (NODE_RANK unset: GROUP_RANK)
    monkeypatch.setenv("GROUP_RANK", "1")
    assert peers(2) is None  # without MASTER_PORT Lightning cannot join the nodes either
    monkeypatch.setenv("MASTER_PORT", "29511")
    assert peers(2)[:2] == (1, 2) and peers(2)[3] == 29511 and peers(1) is None
    torchrun = {
        "RANK": "3",
        "WORLD_SIZE": "8",
        "LOCAL_RANK": "1",
        "GROUP_RANK": "1",
        "LOCAL_WORLD_SIZE": "2",
        "MASTER_ADDR": "10.0.0.1",
        "MASTER_PORT": "29500",
        "TORCHELASTIC_RUN_ID": "x",
    }
    for name, value in torchrun.items():
        monkeypatch.setenv(name, value)
    assert peers(1) == (3, 8, "10.0.0.1", 29500)
