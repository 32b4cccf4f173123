"""Monitors: the tags they write, values equal to references, and the same numbers under
2-process DDP."""

import json
import os
import subprocess
import sys
from pathlib import Path

import lightning as L
import pytest
import torch
from lightning.pytorch.loggers import TensorBoardLogger
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from callbacks.gradients import GradientMonitor
from callbacks.input_norm import InputNormMonitor
from callbacks.throughput import SpeedMonitor
from fixed_embed.interfaces import BinaryCodeInput, GF2CodeInput, LearnedInput
from fixed_embed.interfaces.codes import bits_of
from fixed_embed.measure.peak_flops import peak_flops
from tests import distributed_fit
from tests.helpers import fit_tiny

ROOT = Path(__file__).resolve().parents[1]


def scalars(log_dir):
    events = EventAccumulator(str(log_dir))
    events.Reload()
    return {
        tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]
    }, events


@pytest.mark.parametrize("interface", [LearnedInput, GF2CodeInput])
def test_monitors_write_their_tags_at_their_steps(tmp_path, corpus, interface):
    monitors = [
        GradientMonitor(every_n_steps=2, parameter_norms=True),
        InputNormMonitor(every_n_steps=2, histogram=True),
        SpeedMonitor(every_n_steps=2, skip_first_steps=1),
    ]
    logger = TensorBoardLogger(tmp_path / "logs", name="run")
    fit_tiny(
        tmp_path,
        corpus,
        6,
        max_steps=6,
        callbacks=monitors,
        logger=logger,
        clip=1.0,
        interface=interface,
    )
    tags, events = scalars(logger.log_dir)
    every_other = [
        "grad/norm",
        "grad/clip_coef",
        "grad/block_0",
        "grad/block_1",
        "grad/head",
        "param/norm",
    ]
    every_other += ["input/norm_mean", "input/norm_min", "input/norm_max"]
    # against an analytic norm for fixed codes; a learned table's "expected" norm is its own (error
    # 0 by construction)
    every_other += ["input/norm_expected", "input/norm_error"] if interface.fixed else []
    for tag in every_other:  # after updates 2, 4, 6, each logged at its index n - 1
        assert [s for s, _ in tags[tag]] == [1, 3, 5], tag
    assert [s for s, _ in tags["perf/tokens_per_sec"]] == [1, 3, 5]  # windows open after update 1
    assert ("grad/interface" in tags) == ("input/drift" in tags) == (interface is LearnedInput)
    assert "perf/mfu" not in tags  # CPU: no known peak, no MFU
    assert all(0 <= v <= 1 for _, v in tags["perf/data_wait_frac"])
    assert all(v > 0 for _, v in tags["perf/tokens_per_sec"] + tags["perf/peak_mem_gb"])
    assert all(0 < v <= 1 for _, v in tags["grad/clip_coef"])
    assert ("input/norm_error" in tags) == ("input/norm_expected" in tags) == interface.fixed
    assert "input/norms" in events.Tags()["histograms"]


class Reference(L.Callback):
    """Independent references, taken at the same points as the monitors."""

    def __init__(self):
        self.grad_norm, self.batches = {}, {}

    def on_train_batch_start(self, trainer, module, batch, batch_idx):
        self.batches[trainer.global_step] = batch.clone()

    def on_before_optimizer_step(self, trainer, module, optimizer):
        flat = torch.cat([p.grad.flatten() for p in module.parameters() if p.grad is not None])
        self.grad_norm[trainer.global_step] = flat.double().norm().item()


def test_values_equal_independent_references(tmp_path, corpus):
    gradients, norms, reference = (
        GradientMonitor(every_n_steps=1),
        InputNormMonitor(every_n_steps=1),
        Reference(),
    )
    fit_tiny(
        tmp_path,
        corpus,
        3,
        max_steps=3,
        callbacks=[reference, gradients, norms],
        interface=BinaryCodeInput,
    )
    assert gradients.last_metrics["grad/norm"] == pytest.approx(reference.grad_norm[2], rel=1e-5)
    # Binary codes, V = 300 -> K = 9, d = 32 = 3 full copies + the first 5 bits: the norm is
    # analytic.
    bits = bits_of(reference.batches[2][:, :-1], 9)
    expected = (3 * bits.sum(-1) + bits[..., :5].sum(-1)).double().sqrt()
    assert norms.last_metrics["input/norm_mean"] == pytest.approx(expected.mean().item(), rel=1e-6)
    assert norms.last_metrics["input/norm_min"] == pytest.approx(expected.min().item(), rel=1e-6)
    assert norms.last_metrics["input/norm_max"] == pytest.approx(expected.max().item(), rel=1e-6)
    assert norms.last_metrics["input/norm_error"] == 0.0


class CorruptCode(L.Callback):
    def on_train_batch_end(self, trainer, module, *args):
        if trainer.global_step == 2:
            module.decoder.interface.code_matrix[0, 0] ^= 1  # silently re-assign codes


def test_a_fixed_code_that_moves_is_an_error(tmp_path, corpus):
    with pytest.raises(
        RuntimeError, match=r"fixed GF2CodeInput changed during training \(step 2\)"
    ):
        fit_tiny(tmp_path, corpus, 4, callbacks=[CorruptCode(), InputNormMonitor(every_n_steps=1)])


@pytest.mark.multi_rank
@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_two_processes_give_the_single_process_norms_losses_and_benchmarks(
    tmp_path, corpus, strategy, monkeypatch
):
    flags = ["--strategy", strategy, "--bench-tokenizer", str(corpus[1])]
    # the benchmark results go under the working folder, as in the 2-process run
    monkeypatch.chdir(tmp_path)
    # one process: this one
    single = distributed_fit.main([str(tmp_path / "1.json"), "--devices", "1", *flags])
    run = subprocess.run(
        [
            sys.executable,
            distributed_fit.__file__,
            str(tmp_path / "2.json"),
            "--devices",
            "2",
            *flags,
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=600,
        env={**os.environ, "HF_DATASETS_CACHE": str(tmp_path / "hf-datasets")},
    )
    assert run.returncode == 0, run.stderr[-3000:]
    ddp = json.loads((tmp_path / "2.json").read_text())
    assert ddp["world_size"] == 2 and len(single["rows"]) == len(ddp["rows"]) == 4
    for a, b in zip(single["rows"], ddp["rows"], strict=True):
        for key in (
            "loss",
            "grad/norm",
            "grad/block_0",
            "grad/head",
            "input/norm_mean",
            "input/norm_min",
            "input/norm_max",
            "input/drift",
        ):
            assert b[key] == pytest.approx(a[key], rel=1e-4, abs=1e-7), (a["step"], key)
    # lm-eval split the 6 examples over the 2 ranks and gathered them: the same accuracy.
    bench = "bench/fixed_embed_word_order/acc"
    assert ddp["rows"][-1][bench] == pytest.approx(single["rows"][-1][bench])


def test_cpu_has_no_peak():
    assert peak_flops(torch.device("cpu"), "bf16") is None


# Lightning's table, read through its public lookup: the H200s with their sparse figures (halved
# for the dense ones), the H100s dense. "nvl" before the bare chip: an H200 NVL must not get the
# SXM's peak.
@pytest.mark.parametrize(
    ("device_name", "sparse"),
    [
        ("NVIDIA H200 SXM1", True),
        ("NVIDIA H200 NVL1", True),
        ("NVIDIA H100 80GB HBM3", False),
        ("NVIDIA H100 PCIe", False),
    ],
)
def test_peak_flops_are_dense_datasheet_figures(device_name, sparse, monkeypatch):
    from lightning.fabric.utilities.throughput import get_available_flops

    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: device_name)
    cuda = torch.device("cuda")
    for ours, theirs in (("bf16", torch.bfloat16), ("fp16", torch.float16)):
        dense = get_available_flops(cuda, theirs) / (2 if sparse else 1)
        assert peak_flops(cuda, ours) == pytest.approx(dense, rel=0.02), (device_name, ours)


def test_mfu_is_logged_where_the_device_has_a_known_peak(tmp_path, corpus, monkeypatch):
    peak = 1e9  # a pretend entry for this CPU's fp32 matmuls
    fake = lambda device, dtype: peak if dtype in ("fp32", "tf32") else None  # noqa: E731
    monkeypatch.setattr(sys.modules[SpeedMonitor.__module__], "peak_flops", fake)
    monitor = SpeedMonitor(every_n_steps=2, skip_first_steps=1)
    logger = TensorBoardLogger(tmp_path / "logs", name="run")
    _, model = fit_tiny(tmp_path, corpus, 4, max_steps=4, callbacks=[monitor], logger=logger)
    tags, _ = scalars(logger.log_dir)
    assert [s for s, _ in tags["perf/mfu"]] == [s for s, _ in tags["perf/tokens_per_sec"]] == [1, 3]
    flops = model.decoder.flops_per_token(16)  # data.seq_len: 16 predictions per sample
    metrics = monitor.last_metrics
    assert metrics["perf/mfu"] == pytest.approx(
        flops * metrics["perf/tokens_per_sec"] / peak, rel=1e-5
    )


def test_benchmark_callback_logs_in_the_loop_without_perturbing_training(
    tmp_path, corpus, monkeypatch
):
    from callbacks.benchmarks import BenchmarkCallback

    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "hf-datasets"))
    decoder = {"max_seq_len": 256}
    plain, _ = fit_tiny(tmp_path / "plain", corpus, 5, max_steps=5, decoder=decoder)
    bench = BenchmarkCallback(
        tasks=["fixed_embed_word_order"], every_n_steps=2, limit=6, batch_size=4
    )
    logger = TensorBoardLogger(tmp_path / "logs", name="run")
    with_bench, model = fit_tiny(
        tmp_path / "bench",
        corpus,
        5,
        max_steps=5,
        decoder=decoder,
        callbacks=[bench],
        logger=logger,
    )
    assert with_bench.losses == plain.losses  # same data order, same updates
    assert model.training and torch.is_grad_enabled()
    tags, _ = scalars(logger.log_dir)
    # steps 2, 4 and the end (5)
    assert [s for s, _ in tags["bench/fixed_embed_word_order/acc"]] == [
        1,
        3,
        4,
    ]
    assert all(0 <= v <= 1 for _, v in tags["bench/fixed_embed_word_order/acc"])
    results = tmp_path / "bench" / "benchmarks" / "step_00000004" / "results.json"
    saved = json.loads(results.read_text())
    assert saved["lm_eval"]["0-shot"]["results"]["fixed_embed_word_order"]["sample_len"] == 6
    # what was scored (no checkpoint callback here: None)
    assert saved["update"] == 4 and "checkpoint" in saved


def test_benchmark_task_typo_fails_when_fitting_starts(tmp_path, corpus):
    from callbacks.benchmarks import BenchmarkCallback

    with pytest.raises(ValueError, match=r"lm-eval knows no task \['hellaswagg'\]"):
        fit_tiny(tmp_path, corpus, 2, callbacks=[BenchmarkCallback(tasks=["hellaswagg"])])
