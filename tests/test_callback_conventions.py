"""Callback conventions: every callback acts after the same updates (one update boundary, one
trigger convention), a disabled callback does nothing, and the speed monitor's data wait is the
loader's time and nothing else."""

import inspect
import signal
import sys
import time
from types import SimpleNamespace

import lightning as L
import pytest
from lightning.pytorch.loggers import Logger

from callbacks.gradients import GradientMonitor
from callbacks.input_norm import InputNormMonitor
from callbacks.throughput import SpeedMonitor
from tests.helpers import fit_tiny

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
        # set-up would refuse the task
        BenchmarkCallback(tasks=["no_such_task"], every_n_steps=1, enabled=False),
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

    # the last window: updates 3-4 = 4 micro-batches of 4 samples, 4 fetches
    def wait_seconds(
        metrics,
    ):
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
    # float32
    assert wait_seconds(monitor.last_metrics) == pytest.approx(0.4, rel=1e-6), monitor.last_metrics
