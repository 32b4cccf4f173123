"""Monitors: the tags they write, values equal to references, and the same numbers under
2-process DDP."""

import inspect
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import lightning as L
import pytest
import torch
from lightning.pytorch.loggers import Logger, TensorBoardLogger
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
            module.decoder.interface.rows[0] ^= 1  # silently re-assign codes


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
    monkeypatch.chdir(
        tmp_path
    )  # the benchmark results go under the working folder, as in the 2-process run
    single = distributed_fit.main(
        [str(tmp_path / "1.json"), "--devices", "1", *flags]
    )  # one process: this one
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
    assert [s for s, _ in tags["bench/fixed_embed_word_order/acc"]] == [
        1,
        3,
        4,
    ]  # steps 2, 4 and the end (5)
    assert all(0 <= v <= 1 for _, v in tags["bench/fixed_embed_word_order/acc"])
    results = tmp_path / "bench" / "benchmarks" / "step_00000004" / "results.json"
    saved = json.loads(results.read_text())
    assert saved["lm_eval"]["0-shot"]["results"]["fixed_embed_word_order"]["sample_len"] == 6
    assert (
        saved["update"] == 4 and "checkpoint" in saved
    )  # what was scored (no checkpoint callback here: None)


def test_benchmark_task_typo_fails_when_fitting_starts(tmp_path, corpus):
    from callbacks.benchmarks import BenchmarkCallback

    with pytest.raises(ValueError, match=r"lm-eval knows no task \['hellaswagg'\]"):
        fit_tiny(tmp_path, corpus, 2, callbacks=[BenchmarkCallback(tasks=["hellaswagg"])])


# -- one update boundary, one trigger convention, `enabled`, data wait
# ------------------------------


class RecordingLogger(Logger):
    """Every ``log_metrics`` call: (step, names)."""

    def __init__(self):
        super().__init__()
        self.calls = []

    @property
    def name(self):
        return "recording"

    @property
    def version(self):
        return 0

    def log_hyperparams(self, *args, **kwargs):
        pass

    def log_metrics(self, metrics, step=None):
        self.calls.append((step, sorted(metrics)))

    def updates(self, prefix):
        """The updates n (logged at step n - 1) with a metric under ``prefix``."""
        return sorted(
            {step + 1 for step, names in self.calls if any(n.startswith(prefix) for n in names)}
        )


def test_every_callback_acts_after_the_same_updates_under_accumulation(
    tmp_path, corpus, monkeypatch
):
    from callbacks.benchmarks import BenchmarkCallback
    from callbacks.checkpointing import CheckpointPolicy

    evaluated = []
    monkeypatch.setattr(
        BenchmarkCallback,
        "evaluate",
        lambda self, trainer, _: evaluated.append(trainer.global_step),
    )
    every = 2
    callbacks = [
        GradientMonitor(every_n_steps=every),
        InputNormMonitor(every_n_steps=every),
        SpeedMonitor(every_n_steps=every, skip_first_steps=1),
        BenchmarkCallback(every_n_steps=every, at_train_end=False),
        CheckpointPolicy(every_n_steps=every, keep_last=10, dirpath=str(tmp_path / "policy")),
    ]
    logger = RecordingLogger()
    # 3 micro-batches per update: 18 calls of each batch hook for 6 updates.
    fit_tiny(tmp_path, corpus, 6, max_steps=6, accumulate=3, callbacks=callbacks, logger=logger)
    expected = [2, 4, 6]  # n % every_n_steps == 0, n = trainer.global_step after the update
    assert logger.updates("grad/") == expected
    assert logger.updates("input/") == expected
    assert logger.updates("perf/tokens_per_sec") == expected
    assert evaluated == expected
    saved = sorted(int(p.stem.split("=")[1]) for p in (tmp_path / "policy").glob("step=*.ckpt"))
    assert saved == expected


class Probe(L.Callback):
    """What a disabled callback must not have done, looked at while training."""

    def __init__(self):
        self.seen = []

    def on_train_batch_end(self, trainer, module, *args):
        from fixed_embed.distributed import rank_watch

        self.seen.append(
            {
                "forward hooks": len(module.decoder.interface._forward_hooks),
                "SIGTERM handler": getattr(signal.getsignal(signal.SIGTERM), "__self__", None),
                "profiler wrapped": "start" in vars(trainer.profiler),
                "rank watch": rank_watch.current(),
            }
        )


class Untouchable:
    """Any attribute read fails: a hook that does nothing never reads its arguments."""

    def __init__(self, name):
        self._name = name

    def __getattr__(self, attr):
        raise AssertionError(f"a disabled callback read {self._name}.{attr}")


def disabled_callbacks():
    from callbacks.benchmarks import BenchmarkCallback
    from callbacks.fail_fast import FailFast
    from callbacks.model_summary import ParameterSummary
    from callbacks.preemption import PreemptionCheckpoint

    return [
        GradientMonitor(every_n_steps=1, enabled=False),
        InputNormMonitor(every_n_steps=1, enabled=False),
        SpeedMonitor(every_n_steps=1, skip_first_steps=0, enabled=False),
        BenchmarkCallback(
            tasks=["no_such_task"], every_n_steps=1, enabled=False
        ),  # set-up would refuse the task
        PreemptionCheckpoint(enabled=False),
        FailFast(enabled=False),
        ParameterSummary(enabled=False),
    ]


def test_a_disabled_callback_does_nothing_in_any_hook():
    trainer, module = Untouchable("trainer"), Untouchable("pl_module")
    values = {"stage": "fit", "batch_idx": 0, "idx": 0, "dataloader_idx": 0}
    for callback in disabled_callbacks():
        before = dict(vars(callback))
        for name in dir(L.Callback):
            hook = getattr(callback, name)
            if (
                not (name.startswith("on_") or name in ("setup", "teardown"))
                or "checkpoint" in name
            ):
                continue
            params = list(inspect.signature(hook).parameters)
            hook(
                *[
                    trainer
                    if p == "trainer"
                    else module
                    if p == "pl_module"
                    else values.get(p, Untouchable(p))
                    for p in params
                    if p not in ("args", "kwargs")
                ]
            )
        assert vars(callback) == before, type(callback).__name__


def test_disabled_callbacks_leave_no_trace_in_a_fit(tmp_path, corpus, capsys):
    def state(callback):  # but the log / log_dict Lightning gives every callback
        return {k: v for k, v in vars(callback).items() if k not in ("log", "log_dict")}

    callbacks, probe, logger = disabled_callbacks(), Probe(), RecordingLogger()
    before = [state(c) for c in callbacks]
    handler = signal.getsignal(signal.SIGTERM)
    fit_tiny(
        tmp_path, corpus, 4, max_steps=4, accumulate=2, callbacks=[*callbacks, probe], logger=logger
    )
    assert [state(c) for c in callbacks] == before
    assert len(probe.seen) == 8 and all(
        s
        == {
            "forward hooks": 0,
            "SIGTERM handler": None,
            "profiler wrapped": False,
            "rank watch": None,
        }
        for s in probe.seen
    ), probe.seen[0]
    assert signal.getsignal(signal.SIGTERM) == handler
    logged = {name for _, names in logger.calls for name in names}
    assert not any(name.startswith(("grad/", "input/", "perf/", "bench/")) for name in logged), (
        logged
    )
    out = capsys.readouterr()
    assert (
        "LanguageModel with" not in out.out + out.err
        and "PreemptionCheckpoint" not in out.out + out.err
    )


class Clock:
    """The monitor's clock, moved only by the pretend work below: its windows measure exactly
    that work."""

    def __init__(self):
        self.now = 0.0

    def sleep(self, seconds):
        self.now += seconds


class SlowAfter(L.Callback):
    """A later callback that takes its time (a checkpoint write, an in-loop benchmark)."""

    def __init__(self, clock):
        self.clock = clock

    def on_train_batch_end(self, *args):
        self.clock.sleep(0.1)


def test_data_wait_is_the_loader_and_nothing_else(tmp_path, corpus, monkeypatch):
    clock = Clock()
    fake_time = SimpleNamespace(perf_counter=lambda: clock.now, time=time.time)
    monkeypatch.setattr(sys.modules[SpeedMonitor.__module__], "time", fake_time)

    def wait_seconds(
        metrics,
    ):  # the last window: updates 3-4 = 4 micro-batches of 4 samples, 4 fetches
        return metrics["perf/data_wait_frac"] * 16 / metrics["perf/samples_per_sec"]

    # A slow callback after the monitor (0.1 s per micro-batch) is not data wait, though it runs
    # between this callback's batch end and the next batch start.
    monitor = SpeedMonitor(every_n_steps=2, skip_first_steps=1)
    fit_tiny(
        tmp_path / "slow-callback",
        corpus,
        4,
        max_steps=4,
        accumulate=2,
        callbacks=[monitor, SlowAfter(clock)],
    )
    assert wait_seconds(monitor.last_metrics) == 0, monitor.last_metrics

    # A loader that takes 0.1 s per batch: all of it is data wait, and nothing else.
    from fixed_embed.data import TextDataModule

    loader_of = TextDataModule.train_dataloader

    def slow_loader(self):
        loader = loader_of(self)
        collate = loader.collate_fn
        loader.collate_fn = lambda samples: (clock.sleep(0.1), collate(samples))[1]
        return loader

    monkeypatch.setattr(TextDataModule, "train_dataloader", slow_loader)
    monitor = SpeedMonitor(every_n_steps=2, skip_first_steps=1)
    fit_tiny(
        tmp_path / "slow-loader",
        corpus,
        4,
        max_steps=4,
        accumulate=2,
        callbacks=[monitor, SlowAfter(clock)],
    )
    assert wait_seconds(monitor.last_metrics) == pytest.approx(0.4, rel=1e-6), (
        monitor.last_metrics
    )  # float32
