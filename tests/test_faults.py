"""Faults: killed saves, non-finite updates, poisoned weights and SIGTERM never cost a good
checkpoint."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import lightning as L
import pytest
import torch

from callbacks.preemption import PreemptionCheckpoint
from fixed_embed.distributed.checkpoint import AtomicCheckpointIO
from tests.helpers import fit_tiny

ROOT = Path(__file__).resolve().parents[1]

SAVE_FOREVER = """
import sys, torch
from fixed_embed.distributed.checkpoint import AtomicCheckpointIO
io, path = AtomicCheckpointIO(), sys.argv[1]
weights = torch.arange(6_000_000, dtype=torch.float32)  # 24 MB: a save takes a while
step = 0
while True:
    step += 1
    io.save_checkpoint({"step": step, "weights": weights + step}, path)
    print(step, flush=True)
"""


@pytest.mark.slow
def test_sigkill_mid_save_leaves_the_previous_checkpoint_loadable(tmp_path):
    path = tmp_path / "last.ckpt"
    proc = subprocess.Popen(
        [sys.executable, "-c", SAVE_FOREVER, str(path)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout.readline().strip() == "1"  # one complete checkpoint exists
        deadline = time.monotonic() + 60
        while not list(tmp_path.glob(".last.ckpt.tmp-*")):  # a later save is in flight
            assert time.monotonic() < deadline, "no save in flight within 60 s"
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        proc.kill()
    assert list(tmp_path.glob(".last.ckpt.tmp-*")), "the kill was meant to land mid-save"
    checkpoint = torch.load(path, weights_only=True)
    assert torch.equal(
        checkpoint["weights"], torch.arange(6_000_000, dtype=torch.float32) + checkpoint["step"]
    )

    AtomicCheckpointIO().save_checkpoint({"step": 0}, path)  # the next save clears the orphan
    assert not list(tmp_path.glob(".last.ckpt.tmp-*"))
    assert torch.load(path, weights_only=True) == {"step": 0}


class PoisonGradient(L.Callback):
    def __init__(self, step):
        self.step = step

    def on_after_backward(self, trainer, module):
        if trainer.global_step == self.step:
            next(module.parameters()).grad.view(-1)[0] = float("nan")


class Snapshot(L.Callback):
    """Parameters before and after every optimizer step."""

    def __init__(self):
        self.before, self.after = {}, {}

    def on_train_batch_start(self, trainer, module, *args):
        self.before[trainer.global_step] = [p.detach().clone() for p in module.parameters()]

    def on_train_batch_end(self, trainer, module, *args):
        self.after[trainer.global_step - 1] = [p.detach().clone() for p in module.parameters()]


def test_nonfinite_gradient_stops_naming_the_step_and_keeps_the_last_good_checkpoint(
    tmp_path, corpus
):
    with pytest.raises(FloatingPointError, match="non-finite gradient at step 3"):
        fit_tiny(tmp_path, corpus, 9, callbacks=[PoisonGradient(3)])
    checkpoint = torch.load(tmp_path / "ckpt" / "last.ckpt", weights_only=True)
    assert checkpoint["global_step"] == 3
    assert all(
        torch.isfinite(t).all() for t in checkpoint["state_dict"].values() if t.is_floating_point()
    )


def test_skip_drops_exactly_the_nonfinite_update(tmp_path, corpus):
    snapshot = Snapshot()
    _, model = fit_tiny(
        tmp_path, corpus, 6, callbacks=[PoisonGradient(3), snapshot], on_nonfinite="skip"
    )
    assert model.skipped_updates == 1
    assert all(
        torch.equal(a, b) for a, b in zip(snapshot.before[3], snapshot.after[3], strict=True)
    )
    assert not all(
        torch.equal(a, b) for a, b in zip(snapshot.before[4], snapshot.after[4], strict=True)
    )
    assert all(torch.isfinite(p).all() for p in model.parameters())
    assert torch.load(tmp_path / "ckpt" / "last.ckpt", weights_only=True)["skipped_updates"] == 1


class PoisonWeights(L.Callback):
    def __init__(self, step):
        self.step = step

    def on_train_batch_end(self, trainer, module, *args):
        if trainer.global_step == self.step:
            with torch.no_grad():
                next(module.parameters()).view(-1)[0] = float("inf")


def test_a_poisoned_model_is_never_written_over_a_good_checkpoint(tmp_path, corpus):
    with pytest.raises(FloatingPointError, match="refusing to write a checkpoint at step 4"):
        fit_tiny(tmp_path, corpus, 9, callbacks=[PoisonWeights(4)])
    checkpoint = torch.load(tmp_path / "ckpt" / "last.ckpt", weights_only=True)
    assert checkpoint["global_step"] == 3
    assert all(
        torch.isfinite(t).all() for t in checkpoint["state_dict"].values() if t.is_floating_point()
    )


class SignalSelf(L.Callback):
    """Deliver SIGTERM to this process after micro-batch ``batch`` (mid-accumulation when
    odd-even)."""

    def __init__(self, batch):
        self.batch = batch

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        if batch_idx == self.batch:
            os.kill(os.getpid(), signal.SIGTERM)


def test_sigterm_mid_accumulation_saves_after_the_update_and_resumes_exactly(tmp_path, corpus):
    full, _ = fit_tiny(tmp_path / "full", corpus, 6, accumulate=2, max_steps=6)
    # Micro-batch 4 is the first half of update 3: the save must wait for the update to complete.
    preemption = PreemptionCheckpoint()
    first, _ = fit_tiny(
        tmp_path / "run",
        corpus,
        6,
        accumulate=2,
        max_steps=6,
        expect_step=3,
        callbacks=[SignalSelf(4), preemption],
    )
    assert preemption.received == signal.SIGTERM
    assert signal.getsignal(signal.SIGTERM) is not preemption._handle  # handler restored after fit
    second, _model = fit_tiny(
        tmp_path / "run",
        corpus,
        6,
        accumulate=2,
        max_steps=6,
        ckpt_path=str(tmp_path / "run" / "ckpt" / "last.ckpt"),
    )
    assert len(first.losses) == 6 and len(first.losses + second.losses) == 12
    assert first.losses + second.losses == pytest.approx(full.losses, rel=1e-5)
    assert all(
        torch.equal(a, b) for a, b in zip(full.batches, first.batches + second.batches, strict=True)
    )


def test_preemption_rejects_unknown_signals():
    with pytest.raises(ValueError, match="SIGNOPE"):
        PreemptionCheckpoint(signals=["SIGNOPE"])


@pytest.mark.slow
def test_cli_fit_on_sigterm_saves_last_checkpoint_and_exits_zero(tmp_path, corpus):
    data, tok = corpus
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "fixed_embed",
            "fit",
            "--config",
            str(ROOT / "experiments/tiny/gf2.yaml"),
            "--trainer.max_steps",
            "100000",
            f"--trainer.logger.init_args.save_dir={tmp_path}/logs",
            "--model.decoder.vocab_size",
            "300",
            "--model.decoder.d_model",
            "32",
            "--model.decoder.n_heads",
            "4",
            "--model.decoder.ffn_dim",
            "64",
            "--model.decoder.max_seq_len",
            "256",
            "--data.seq_len",
            "32",
            f"--data.train={data}",
            f"--data.tokenizer={tok}",
            "--data.num_shards",
            "4",
            "--data.val_sequences",
            "4",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=tmp_path,
        env={**os.environ, "HF_DATASETS_CACHE": str(tmp_path / "hf")},
    )
    output = []
    for line in proc.stdout:
        output.append(line)
        if "PreemptionCheckpoint: on SIGTERM" in line:
            time.sleep(2)  # a few updates
            proc.send_signal(signal.SIGTERM)
            break
    output.extend(proc.stdout)
    assert proc.wait(timeout=120) == 0, "".join(output)[-3000:]
    last = tmp_path / "logs" / "tiny" / "gf2" / "default" / "checkpoints" / "last.ckpt"
    checkpoint = torch.load(last, weights_only=False)
    assert 0 < checkpoint["global_step"] < 100000
    text = "".join(output).replace("\n", "")
    # The signal lands between updates (the preemption callback saves) or during the in-loop
    # benchmark (the checkpoint due at that update was saved before it; the evaluation stops).
    assert f"saved {last} at step {checkpoint['global_step']}" in text or (
        f"BenchmarkCallback at step {checkpoint['global_step']}: stopped by a stop request" in text
    )
