"""UpdateCallback: one hook per optimizer update, the interval and ``enabled`` handled once."""

from types import SimpleNamespace
from unittest import mock

import pytest
import torch

from callbacks.benchmarks import BenchmarkCallback
from callbacks.gradients import GradientMonitor
from callbacks.input_norm import InputNormMonitor
from callbacks.preemption import PreemptionCheckpoint
from callbacks.throughput import SpeedMonitor
from callbacks.update_boundary import UpdateCallback
from tests.helpers import fit_tiny


class Recorder(UpdateCallback):
    """Every hook of the base, in order: (hook, update or None, trainer.global_step when called)."""

    def __init__(self, every_n_steps=1, enabled=True):
        super().__init__(every_n_steps, enabled)
        self.events = []

    def on_update_start(self, trainer, pl_module, update):
        self.events.append(("update_start", update, trainer.global_step))

    def on_micro_batch_start(self, trainer, pl_module, batch):
        self.events.append(("micro_start", None, trainer.global_step))

    def on_before_update_step(self, trainer, pl_module, update):
        self.events.append(("before_step", update, trainer.global_step))

    def on_micro_batch_end(self, trainer, pl_module, batch):
        self.events.append(("micro_end", None, trainer.global_step))

    def on_update_end(self, trainer, pl_module, update):
        self.events.append(("update_end", update, trainer.global_step, self.due(update)))

    def hooks(self, name):
        return [event[1:] for event in self.events if event[0] == name]


def drive(callback, micro_batches, accumulate, start_step=0):
    """Lightning's per-micro-batch call order, on a fake trainer: start, (the step), end."""
    trainer, batch = (
        SimpleNamespace(global_step=start_step, batch_idx=0),
        torch.zeros(2, 5, dtype=torch.long),
    )
    ends = lambda trainer: (trainer.batch_idx + 1) % accumulate == 0  # noqa: E731 -- Lightning's decision
    with mock.patch("callbacks.update_boundary.ends_update", ends):
        for i in range(micro_batches):
            trainer.batch_idx = i
            callback.on_train_batch_start(trainer, None, batch, i)
            if ends(trainer):
                callback.on_before_optimizer_step(trainer, None, None)
                trainer.global_step += 1
            callback.on_train_batch_end(trainer, None, {}, batch, i)
    return trainer


def test_on_update_end_fires_once_per_update_never_mid_accumulation():
    recorder = Recorder(every_n_steps=2)
    drive(recorder, micro_batches=10, accumulate=2)
    # After update n, global_step == n; due every 2nd update.
    assert recorder.hooks("update_end") == [
        (1, 1, False),
        (2, 2, True),
        (3, 3, False),
        (4, 4, True),
        (5, 5, False),
    ]
    # its first micro-batch
    assert recorder.hooks("update_start") == [(n, n - 1) for n in range(1, 6)]
    # the step not taken yet
    assert recorder.hooks("before_step") == [(n, n - 1) for n in range(1, 6)]
    assert len(recorder.hooks("micro_start")) == len(recorder.hooks("micro_end")) == 10
    # Per update: start, micro, micro, step, micro, end -- nothing after the first micro-batch's
    # end.
    names = [event[0] for event in recorder.events]
    update = [
        "update_start",
        "micro_start",
        "micro_end",
        "micro_start",
        "before_step",
        "micro_end",
        "update_end",
    ]
    assert names == update * 5


def test_a_resumed_run_counts_from_the_checkpoint_step():
    recorder = Recorder(every_n_steps=3)
    drive(recorder, micro_batches=9, accumulate=3, start_step=4)
    assert [(n, due) for n, _, due in recorder.hooks("update_end")] == [
        (5, False),
        (6, True),
        (7, False),
    ]


def test_the_fake_trainer_calls_the_hooks_as_lightning_does(tmp_path, corpus):
    in_fit, fake = Recorder(every_n_steps=2), Recorder(every_n_steps=2)
    fit_tiny(tmp_path, corpus, 4, max_steps=4, accumulate=2, callbacks=[in_fit])
    drive(fake, micro_batches=8, accumulate=2)
    assert in_fit.events == fake.events


def test_a_disabled_update_callback_never_fires():
    recorder = Recorder(every_n_steps=1, enabled=False)
    drive(recorder, micro_batches=6, accumulate=2)
    assert recorder.events == []


@pytest.mark.parametrize(
    ("make", "lowest"),
    [
        (lambda n: GradientMonitor(every_n_steps=n), 1),
        (lambda n: InputNormMonitor(every_n_steps=n), 1),
        (lambda n: SpeedMonitor(every_n_steps=n), 1),
        (lambda n: BenchmarkCallback(every_n_steps=n), 0),  # 0: only at the end of training
    ],
)
def test_every_interval_is_validated_in_one_place(make, lowest):
    make(lowest)
    name = type(make(lowest)).__name__
    with pytest.raises(
        ValueError, match=rf"^{name}: every_n_steps must be >= {lowest}, got {lowest - 1}$"
    ):
        make(lowest - 1)


def test_every_monitor_is_an_update_callback():
    for callback in (
        GradientMonitor(),
        InputNormMonitor(),
        SpeedMonitor(),
        BenchmarkCallback(),
        PreemptionCheckpoint(),
    ):
        assert isinstance(callback, UpdateCallback)
        for hook in ("on_train_batch_start", "on_train_batch_end", "on_before_optimizer_step"):
            assert getattr(type(callback), hook) is getattr(UpdateCallback, hook), (
                type(callback).__name__,
                hook,
            )
