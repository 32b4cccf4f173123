"""The run lifecycle as a user meets it: relaunch, resume, refusals, intervals, checkpoint
retention, preemption."""

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import lightning as L
import pytest
import torch
import yaml
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from callbacks.checkpointing import CheckpointPolicy
from callbacks.preemption import PreemptionCheckpoint
from fixed_embed.interfaces import BinaryCodeInput
from tests.cli import run_cli
from tests.helpers import fit_tiny

ROOT = Path(__file__).resolve().parents[1]


def fit_args(tmp_path, corpus, variant="gf2", *extra):
    """``fixed-embed fit`` arguments of a tiny run of the experiment's tiny config, logging
    under tmp_path."""
    data, tok = corpus
    return [
        "fit",
        "--config",
        str(ROOT / f"experiments/tiny/{variant}.yaml"),
        f"--trainer.logger.init_args.save_dir={tmp_path}/logs",
        "--model.decoder.vocab_size",
        "300",
        "--model.decoder.d_model",
        "32",
        "--model.decoder.n_heads",
        "4",
        "--model.decoder.ffn_dim",
        "64",
        "--model.decoder.n_layers",
        "2",
        "--model.decoder.max_seq_len",
        "256",
        "--data.seq_len",
        "32",
        f"--data.train={data}",
        f"--data.tokenizer={tok}",
        "--data.val_sequences",
        "4",
        "--trainer.log_every_n_steps",
        "1",
        *extra,
    ]


def launch(args):
    """``fixed-embed ARGS`` in this process (the command's parser, checks and exit status; no
    interpreter start)."""
    return run_cli(*args)


def scalars(folder, tag):
    events = EventAccumulator(str(folder), size_guidance={"scalars": 0})
    events.Reload()
    return (
        [(e.step, e.value) for e in events.Scalars(tag)] if tag in events.Tags()["scalars"] else []
    )


@pytest.mark.slow
def test_relaunching_the_same_command_continues_the_same_run(tmp_path, corpus):
    args = fit_args(tmp_path, corpus, "gf2", "--ckpt_path", "last", "--trainer.max_steps", "100000")
    env = {**os.environ, "HF_DATASETS_CACHE": str(tmp_path / "hf")}
    proc = subprocess.Popen(
        [sys.executable, "-m", "fixed_embed", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=tmp_path,
        env=env,
    )
    output = []
    for line in proc.stdout:
        output.append(line)
        if "PreemptionCheckpoint: on SIGTERM" in line:
            proc.send_signal(signal.SIGTERM)
            break
    output.extend(proc.stdout)
    text = "".join(output)
    assert proc.wait(timeout=120) == 0, text[-3000:]
    run = tmp_path / "logs" / "tiny" / "gf2" / "default"
    assert f"no checkpoint in {run / 'checkpoints'}: starting at update 0" in text
    stopped = torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)["global_step"]
    # One write per preemption: the step checkpoint and the `last` link to it, no second copy.
    names = sorted(p.name for p in (run / "checkpoints").iterdir())
    assert names == ["last.ckpt", f"step={stopped:08d}.ckpt"], names
    assert os.readlink(run / "checkpoints" / "last.ckpt") == f"step={stopped:08d}.ckpt"

    # The very same command again (a requeue): it resumes and trains on into the same folder.
    again = launch([*args[:-1], str(stopped + 3)])
    assert again.returncode == 0, again.stderr[-3000:]
    assert (
        f"resuming {run / 'checkpoints' / f'step={stopped:08d}.ckpt'} at update {stopped}"
        in again.stderr
    )
    assert sorted(p.name for p in (tmp_path / "logs" / "tiny" / "gf2").iterdir()) == ["default"]
    assert yaml.safe_load((run / "config.yaml").read_text())["ckpt_path"] == "last"
    steps = [step for step, _ in scalars(run, "train/loss")]
    assert steps == list(range(stopped + 3)), steps  # one curve: every update once, in order


@pytest.mark.slow
def test_fresh_start_over_a_run_and_incompatible_resumes_are_refused(tmp_path, corpus):
    first = launch(fit_args(tmp_path, corpus, "binary16", "--trainer.max_steps", "2"))
    assert first.returncode == 0, first.stderr[-3000:]
    again = launch(fit_args(tmp_path, corpus, "binary16", "--trainer.max_steps", "2"))
    assert again.returncode == 2
    assert "already holds checkpoints" in again.stderr and "--ckpt_path last" in again.stderr
    assert "Traceback" not in again.stderr and len(again.stderr.strip().splitlines()) <= 4

    # The binary16 run's checkpoint under the gf2 config: refused, naming both interfaces.
    checkpoint = tmp_path / "logs" / "tiny" / "binary16" / "default" / "checkpoints" / "last.ckpt"
    other = launch(
        fit_args(tmp_path, corpus, "gf2", "--trainer.max_steps", "3", "--ckpt_path", checkpoint)
    )
    assert other.returncode == 2, other.stderr[-3000:]
    assert "refusing to resume" in other.stderr and "BinaryCodeInput" in other.stderr
    assert "GF2CodeInput" in other.stderr and "Traceback" not in other.stderr

    # A changed LR is applied, and said.
    resumed = launch(
        fit_args(
            tmp_path,
            corpus,
            "binary16",
            "--trainer.max_steps",
            "4",
            "--ckpt_path",
            "last",
            "--model.optimizer.lr",
            "5e-4",
        )
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "model.optimizer.lr: 0.001 in the checkpoint -> 0.0005 now" in resumed.stderr
    lrs = dict(scalars(tmp_path / "logs" / "tiny" / "binary16" / "default", "train/lr"))
    # warm-up over 30 updates: lr = peak (step + 1) / 30, with the old peak before the resume, the
    # new one after
    assert lrs[1] == pytest.approx(1e-3 * 2 / 30) and lrs[2] == pytest.approx(5e-4 * 3 / 30)


@pytest.mark.slow
def test_val_check_interval_counts_updates_with_accumulation(tmp_path, corpus):
    result = launch(
        fit_args(
            tmp_path,
            corpus,
            "gf2",
            "--trainer.max_steps",
            "4",
            "--trainer.val_check_interval",
            "2",
            "--trainer.accumulate_grad_batches",
            "3",
        )
    )
    assert result.returncode == 0, result.stderr[-3000:]
    run = tmp_path / "logs" / "tiny" / "gf2" / "default"
    # validation after updates 2 and 4 (logged at the index of the update, 1 and 3), not after
    # micro-batch 2
    assert [step for step, _ in scalars(run, "val/loss")] == [1, 3]
    assert len(scalars(run, "train/loss")) == 4
    # the run folder's config.yaml keeps what the user wrote: relaunching from it means the same
    saved = yaml.safe_load((run / "config.yaml").read_text())
    assert saved["trainer"]["val_check_interval"] == 2 and saved["ckpt_path"] is None


def test_seq_len_above_max_seq_len_is_refused_before_any_work(tmp_path, corpus):
    result = launch(fit_args(tmp_path, corpus, "gf2", "--data.seq_len", "512"))
    assert result.returncode == 2
    assert "data.seq_len 512 exceeds model.decoder.max_seq_len 256" in result.stderr
    assert not (tmp_path / "logs").exists()


def test_checkpoint_policy_keeps_recent_and_permanent_and_links_last(tmp_path, corpus):
    policy = CheckpointPolicy(
        every_n_steps=1, keep_last=2, keep_every=3, dirpath=str(tmp_path / "ckpt")
    )
    fit_tiny(tmp_path, corpus, 7, max_steps=7, callbacks=[policy])
    folder = tmp_path / "ckpt"
    steps = sorted(int(p.stem.split("=")[1]) for p in folder.glob("step=*.ckpt"))
    assert steps == [3, 6, 7]  # permanent 3 and 6, rolling 6 and 7; 1, 2, 4, 5 deleted
    assert os.readlink(folder / "last.ckpt") == "step=00000007.ckpt"
    assert torch.load(folder / "last.ckpt", weights_only=True)["global_step"] == 7


def test_checkpoint_policy_validates_its_arguments():
    with pytest.raises(ValueError, match="keep_every"):
        CheckpointPolicy(every_n_steps=1000, keep_every=2500)


class SigtermInEvaluation(PreemptionCheckpoint):
    """Sends itself SIGTERM from inside the end-of-run evaluation's first forward pass."""

    def on_train_end(self, trainer, module):
        from fixed_embed.evaluation.lm_eval_model import FixedEmbedLM

        original = FixedEmbedLM._logits

        def logits(lm, inputs):
            os.kill(os.getpid(), signal.SIGTERM)
            return original(lm, inputs)

        FixedEmbedLM._logits = logits
        self._restore = lambda: setattr(FixedEmbedLM, "_logits", original)

    def teardown(self, trainer, module, stage):
        getattr(self, "_restore", lambda: None)()
        super().teardown(trainer, module, stage)


class CheckpointOnDisk(L.Callback):
    def __init__(self, folder):
        self.folder, self.seen = folder, None

    def on_train_end(self, trainer, module):
        self.seen = sorted(p.name for p in self.folder.glob("step=*.ckpt"))


def test_final_checkpoint_precedes_the_final_evaluation_and_sigterm_stops_it(tmp_path, corpus):
    from callbacks.benchmarks import BenchmarkCallback

    folder = tmp_path / "ckpt"
    probe = CheckpointOnDisk(folder)
    preemption = SigtermInEvaluation()
    bench = BenchmarkCallback(
        tasks=["fixed_embed_word_order"], every_n_steps=0, limit=40, batch_size=4
    )
    fit_tiny(
        tmp_path,
        corpus,
        5,
        max_steps=5,
        interface=BinaryCodeInput,
        decoder={"max_seq_len": 256},
        callbacks=[
            probe,
            preemption,
            bench,
            CheckpointPolicy(every_n_steps=2, dirpath=str(folder)),
        ],
    )
    # on disk before any on_train_end
    assert probe.seen == [
        "step=00000004.ckpt",
        "step=00000005.ckpt",
    ]
    assert preemption.received == signal.SIGTERM and bench.interrupted and bench.last_metrics == {}


def test_skipping_nonfinite_updates_gives_up_after_the_limit(tmp_path, corpus):
    class PoisonLoss(L.Callback):
        def on_after_backward(self, trainer, module):
            next(module.parameters()).grad.view(-1)[0] = float("nan")

    with pytest.raises(FloatingPointError, match="3 consecutive and 3 skipped updates"):
        fit_tiny(
            tmp_path,
            corpus,
            9,
            max_steps=9,
            on_nonfinite="skip",
            max_skipped_updates=3,
            callbacks=[PoisonLoss()],
        )


@pytest.mark.multi_rank
@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_a_failure_on_one_rank_ends_every_rank(tmp_path, strategy):
    import time

    result = subprocess.run(
        [
            sys.executable,
            str(ROOT / "tests" / "distributed_fit.py"),
            str(tmp_path / "out.json"),
            "--devices",
            "2",
            "--strategy",
            strategy,
            "--steps",
            "50",
            "--fail-on-rank",
            "1",
            "--fail-at",
            "2",
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=300,
    )
    ended = time.monotonic()
    # Rank 1 lingers 30 s after raising: rank 0 ends well before, told by the rank watch, not by a
    # closed connection (on NCCL nothing would close: it would wait for the 30-minute timeout).
    # Timed from the failure, not from the launch: start-up on busy cores is no part of it.
    assert result.returncode != 0
    assert (
        "rank 0: stopping because rank 1: RuntimeError: injected failure on rank 1 at step 2"
        in result.stderr
    )
    failed = float(re.search(r"failing at monotonic ([\d.]+)", result.stderr).group(1))
    assert ended - failed < 25, f"rank 0 ended {ended - failed:.0f} s after rank 1 failed"


@pytest.mark.slow
def test_refused_data_resume_is_the_last_word_and_bad_inputs_are_one_line(tmp_path, corpus):
    first = launch(
        fit_args(tmp_path, corpus, "gf2", "--trainer.max_steps", "2", "--ckpt_path", "last")
    )
    assert first.returncode == 0, first.stderr[-3000:]
    other = launch(
        fit_args(
            tmp_path,
            corpus,
            "gf2",
            "--trainer.max_steps",
            "4",
            "--ckpt_path",
            "last",
            "--data.seq_len",
            "16",
        )
    )
    assert other.returncode == 2, other.stderr[-3000:]
    last = other.stderr.strip().splitlines()[-2]
    assert "refusing to resume" in last and "seq_len: checkpoint 32, now 16" in last
    assert "iter(combined_loader)" not in other.stderr and "Traceback" not in other.stderr

    garbage = tmp_path / "garbage.ckpt"
    garbage.write_bytes(os.urandom(4096))
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    cases = {
        (
            "--ckpt_path",
            str(garbage),
            "--run",
            "g",
        ): f"cannot read checkpoint {garbage}: it is not a checkpoint",
        (
            "--data.val_sequences",
            "0",
            "--run",
            "v",
        ): "data.val_sequences: must be an integer >= 1, got 0",
        (f"--data.train={empty}", "--run", "e"): f"{empty}: every file is empty",
        (
            "--model.decoder.vocab_size",
            "17",
            "--run",
            "vv",
        ): "model vocab_size 17 is smaller than the tokenizer's",
    }
    for flags, message in cases.items():
        result = launch(fit_args(tmp_path, corpus, "gf2", "--trainer.max_steps", "2", *flags))
        assert result.returncode == 2 and message in result.stderr, (flags, result.stderr[-2000:])
        assert "Traceback" not in result.stderr and "weights_only=False" not in result.stderr


def test_a_reader_without_documents_says_so_and_the_cli_prints_one_line(tmp_path, corpus, capsys):
    from fixed_embed.cli import _message
    from fixed_embed.data.packing import PackedBlocks
    from fixed_embed.data.sources import DocumentSource
    from fixed_embed.errors import DataError

    one = tmp_path / "one.jsonl"
    one.write_text('{"text": "a single short document"}\n')
    stream = PackedBlocks(
        DocumentSource(str(one)), str(corpus[1]), 8, eos_id=0, rank=1, world_size=2, num_shards=None
    )
    with pytest.raises(
        DataError, match=r"too few documents for 2 readers; give more documents"
    ) as raised:
        next(iter(stream))
    # torch re-raises a worker's error wrapped in its traceback: the CLI prints the message alone
    wrapped = DataError(
        f"Caught DataError in DataLoader worker process 0.\nOriginal Traceback (most recent call "
        f'last):\n  File "x.py", line 1\nfixed_embed.errors.DataError: {raised.value}\n'
    )
    assert _message(wrapped) == str(raised.value)
