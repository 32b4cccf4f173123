"""Strategies: FSDP2 sharded checkpoints resume exactly and consolidate; DDP through the CLI;
checkpointing is exact."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from fixed_embed.distributed.checkpoint import consolidate, is_sharded_checkpoint
from fixed_embed.evaluation.export import export_llama
from fixed_embed.evaluation.lm_eval_model import FixedEmbedLM
from fixed_embed.evaluation.loading import load_checkpoint
from fixed_embed.interfaces import BinaryCodeInput, LearnedInput
from fixed_embed.model.decoder import Decoder, DecoderConfig

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "tests" / "distributed_fit.py"


def fit(out, *args):
    run = subprocess.run(
        [sys.executable, str(SCRIPT), str(out), *map(str, args)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    return [row["loss"] for row in json.loads(Path(out).read_text())["rows"]]


@pytest.mark.multi_rank
def test_fsdp_sharded_checkpoint_resumes_exactly_then_consolidates_for_eval_and_export(
    tmp_path, corpus
):
    fsdp = ["--devices", 2, "--strategy", "fsdp"]
    full = fit(tmp_path / "full.json", *fsdp, "--ckpt-dir", tmp_path / "full")
    first = fit(tmp_path / "a.json", *fsdp, "--ckpt-dir", tmp_path / "run", "--stop-at", 2)
    last = tmp_path / "run" / "last.ckpt"
    assert last.is_symlink() and is_sharded_checkpoint(last)
    second = fit(tmp_path / "b.json", *fsdp, "--ckpt-dir", tmp_path / "run", "--resume", last)
    assert first + second == pytest.approx(full, rel=1e-6)
    # Every replaced shard folder is gone: one folder, the one last.ckpt names.
    assert [p.name for p in (tmp_path / "run").iterdir() if p.is_dir() and not p.is_symlink()] == [
        last.resolve().name
    ]

    single = consolidate(last, tmp_path / "one.ckpt")
    assert single["global_step"] == 4 and "optimizer_states" not in single
    model, _ = load_checkpoint(tmp_path / "one.ckpt", tokenizer=str(corpus[1]))
    sharded, tokenizer = load_checkpoint(last, tokenizer=str(corpus[1]))
    assert isinstance(model.interface, LearnedInput)
    ids = torch.randint(0, 300, (2, 16))
    assert torch.equal(model(ids), sharded(ids))
    lm = FixedEmbedLM(module=model, tokenizer_object=tokenizer, batch_size=2)
    assert all(
        torch.isfinite(torch.tensor(s))
        for s, _ in lm._loglikelihood_tokens([(None, [1, 2, 3], [4, 5])])
    )
    export_llama(model, tokenizer, tmp_path / "hf")
    assert (tmp_path / "hf" / "model.safetensors").is_file()


def test_an_orphaned_shard_folder_never_shadows_last(tmp_path):
    from fixed_embed.distributed.fsdp import _SHARDS_PREFIX
    from fixed_embed.train.resume import choose_checkpoint

    # A save killed mid-write leaves a hidden folder, newer than last; "last" must not see it.
    torch.save({"global_step": 3, "hyper_parameters": {}}, tmp_path / "step=00000003.ckpt")
    os.symlink("step=00000003.ckpt", tmp_path / "last.ckpt")
    orphan = tmp_path / f"{_SHARDS_PREFIX}7-123"
    orphan.mkdir()
    torch.save({"global_step": 7}, orphan / "meta.pt")
    path, checkpoint, notes = choose_checkpoint(tmp_path)
    assert (
        path == tmp_path / "step=00000003.ckpt" and checkpoint["global_step"] == 3 and notes == []
    )


@pytest.mark.multi_rank
def test_cli_fit_ddp_two_processes(tmp_path, corpus):
    data, tok = corpus
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "fixed_embed",
            "fit",
            "--config",
            str(ROOT / "experiments/tiny/learned.yaml"),
            "--config",
            str(ROOT / "experiments/strategies/ddp.yaml"),
            "--trainer.devices",
            "2",
            "--trainer.max_steps",
            "3",
            f"--trainer.logger.init_args.save_dir={tmp_path}/logs",
            "--model.decoder.vocab_size",
            "300",
            "--model.decoder.d_model",
            "32",
            "--model.decoder.n_heads",
            "4",
            "--model.decoder.ffn_dim",
            "64",
            "--data.seq_len",
            "32",
            f"--data.train={data}",
            f"--data.tokenizer={tok}",
            "--data.num_shards",
            "4",
            "--data.val_sequences",
            "4",
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=600,
        env={**os.environ, "HF_DATASETS_CACHE": str(tmp_path / "hf")},
    )
    assert run.returncode == 0, run.stderr[-3000:]
    checkpoint = torch.load(
        tmp_path / "logs/tiny/learned/default/checkpoints/last.ckpt", weights_only=True
    )
    assert checkpoint["global_step"] == 3 and checkpoint["tokens_seen"] == 3 * 2 * 8 * 32


def twin_decoders():
    """Two tiny decoders with the same weights, and a batch of ids."""
    config = DecoderConfig(
        vocab_size=256, d_model=32, n_layers=2, n_heads=4, ffn_dim=64, max_seq_len=16
    )
    torch.manual_seed(0)
    first, second = (
        Decoder(config, BinaryCodeInput(256, 32)),
        Decoder(config, BinaryCodeInput(256, 32)),
    )
    second.load_state_dict(first.state_dict())
    return first, second, torch.randint(0, 256, (2, 16))


def test_activation_checkpointing_changes_nothing_but_memory():
    plain, recomputed, ids = twin_decoders()
    recomputed.activation_checkpointing = True
    for model in (plain, recomputed):
        model(ids).square().mean().backward()
    assert torch.equal(plain(ids), recomputed(ids))
    for a, b in zip(plain.parameters(), recomputed.parameters(), strict=True):
        assert torch.allclose(a.grad, b.grad, atol=1e-7)


@pytest.mark.slow
def test_regional_compile_with_checkpointing_keeps_outputs_and_parameter_names():
    from fixed_embed.distributed.parallel import ParallelConfig, apply_parallelism

    compiled, reference, ids = twin_decoders()
    apply_parallelism(compiled, ParallelConfig(compile=True, activation_checkpointing=True))
    assert torch.allclose(compiled(ids), reference(ids), atol=1e-5)
    # no _orig_mod. / wrapper prefixes
    assert list(compiled.state_dict()) == list(reference.state_dict())
