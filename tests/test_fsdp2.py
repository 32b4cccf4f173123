"""FSDP2, proven on CPU: the wrapping (the root keeps torch's default, tied weights refused),
gradient sync only on an update's last micro-batch, and (two processes) gradients equal to
today's without a reduce-scatter per micro-batch."""

import json
import subprocess
import sys
from argparse import ArgumentError

import lightning as L
import pytest
import torch
from jsonargparse import ArgumentParser

from fixed_embed.errors import ConfigError
from fixed_embed.interfaces import GF2CodeInput, LearnedInput
from fixed_embed.train.module import LanguageModel
from tests.test_gpu_path import ROOT, TINY

# -- 7. FSDP2: wrapping, tied weights, gradient sync
# ----------------------------------------------------


class FakeMesh:
    mesh_dim_names = ("data_parallel",)
    device_type = "cpu"

    def __getitem__(self, name):
        return self

    def size(self):
        return 2


def test_fsdp2_root_keeps_torch_default_and_blocks_reshard(monkeypatch):
    import torch.distributed.fsdp as fsdp

    from fixed_embed.distributed.parallel import ParallelConfig, apply_parallelism
    from fixed_embed.model.decoder import Decoder, DecoderConfig

    calls = []
    monkeypatch.setattr(fsdp, "fully_shard", lambda module, **kw: calls.append((module, kw)))
    config = DecoderConfig(**TINY)
    decoder = Decoder(config, GF2CodeInput(config.vocab_size, config.d_model))
    apply_parallelism(decoder, ParallelConfig(), FakeMesh())
    assert [kw.get("reshard_after_forward") for _, kw in calls] == [True, True, False, None]
    # root: torch's default
    assert "reshard_after_forward" not in calls[-1][1] and calls[-1][0] is decoder

    tied = DecoderConfig(**{**TINY, "tie_embeddings": True})
    with pytest.raises(ConfigError, match="tie_embeddings=true cannot be sharded with FSDP2"):
        apply_parallelism(Decoder(tied, LearnedInput(300, 32)), ParallelConfig(), FakeMesh())
    # its type, which jsonargparse checks while parsing
    parser = ArgumentParser(exit_on_error=False)
    parser.add_class_arguments(ParallelConfig, "parallel")
    with pytest.raises(ArgumentError, match="shard_group_size"):
        parser.parse_args(["--parallel.shard_group_size=0"])


def test_fsdp2_gradient_sync_only_on_an_updates_last_micro_batch():
    """The sync decision, taken before each micro-batch, is the step Lightning then takes: every 4th
    micro-batch, and the short accumulation at the end of a 6-batch epoch."""
    from fixed_embed.lightning_internals import ends_update

    class Record(L.Callback):
        def __init__(self):
            self.decided, self.stepped = [], []

        def on_train_batch_start(self, trainer, *args):
            self.decided.append(ends_update(trainer))
            self.before = trainer.global_step

        def on_train_batch_end(self, trainer, *args):
            self.stepped.append(trainer.global_step != self.before)

    blocks = torch.randint(0, 300, (12, 17), generator=torch.Generator().manual_seed(0))
    record = Record()
    trainer = L.Trainer(
        accelerator="cpu",
        max_epochs=1,
        max_steps=100,
        accumulate_grad_batches=4,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        limit_val_batches=0,
        callbacks=[record],
    )
    model = LanguageModel(decoder=TINY, interface=GF2CodeInput, schedule={"warmup_steps": 1})
    trainer.fit(model, torch.utils.data.DataLoader(blocks, batch_size=2))
    assert record.decided == record.stepped == [False, False, False, True, False, True]


@pytest.mark.multi_rank
def test_fsdp2_gradients_without_per_micro_batch_reduce_scatter_equal_todays(tmp_path):
    out = tmp_path / "grads.json"
    run = subprocess.run(
        [sys.executable, str(ROOT / "tests" / "fsdp_grad_sync.py"), str(out)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["params"] > 0
    assert result["max_abs_diff"]["last_only"] < 1e-6 and result["max_abs_diff"]["hybrid"] < 1e-6, (
        result
    )
