"""The private names of Lightning (and torch, tqdm) this project relies on are still there, as
relied on.

An upgrade that renames, drops or re-signs one fails here, naming it, instead of somewhere in a run.
In-process and without training: imports, signatures, a few cheap objects and the library's source.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import re
from pathlib import Path

import lightning as L
import pytest
import torch

from fixed_embed import lightning_internals as internals
from fixed_embed.lightning_internals import Internal

ROOT = Path(__file__).resolve().parents[1]
EVERY = internals.LIGHTNING_INTERNALS + internals.TORCH_INTERNALS


def _resolve(dotted: str):
    """A module, or an attribute reached from the longest importable module prefix."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            found = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for part in parts[cut:]:
            found = getattr(found, part)
        return found
    raise ImportError(dotted)


@functools.cache
def _trainer() -> L.Trainer:
    return L.Trainer(
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )


def _instance(owner: str):
    """A cheap object of ``owner``, for attributes that exist on instances only."""
    return {
        "lightning.pytorch.loops.fit_loop._FitLoop": lambda: _trainer().fit_loop,
        "lightning.pytorch.loops.training_epoch_loop._TrainingEpochLoop": lambda: (
            _trainer().fit_loop.epoch_loop
        ),
        "lightning.pytorch.strategies.ModelParallelStrategy": lambda: (
            L.pytorch.strategies.ModelParallelStrategy()
        ),
        "torch.nn.Module": torch.nn.Module,
    }[owner]()


def _source(function) -> str:
    if isinstance(function, property):
        function = function.fget
    return inspect.getsource(getattr(function, "__func__", function))  # a staticmethod's function


def _problem(entry: Internal) -> str | None:
    """What changed about ``entry``, or None."""
    try:
        owner = _resolve(entry.owner)
    except (ImportError, AttributeError):
        return f"{entry.owner} is gone"
    if entry.kind == "instance" and not hasattr(_instance(entry.owner), entry.name):
        return "no such attribute on its instances"
    if entry.kind in ("attribute", "method") and not hasattr(owner, entry.name):
        return "no such attribute"
    if entry.kind == "method":
        found = tuple(inspect.signature(getattr(owner, entry.name)).parameters)
        expected = entry.params
        if expected[-1:] == ("...",):
            expected, found = expected[:-1], found[: len(expected) - 1]
        if found != expected:
            return f"parameters {found}, relied on: {expected}"
    for called_in in entry.called_in:
        where = called_in if "." in called_in else f"{entry.owner}.{called_in}"
        source = _source(
            inspect.getattr_static(_resolve(where.rpartition(".")[0]), where.rpartition(".")[2])
        )
        if not re.search(re.escape(entry.name) + (r"\(" if entry.kind == "method" else ""), source):
            return f"{where} no longer uses it"
    return None


def _library(entry: Internal) -> str:
    top = entry.owner.split(".")[0]
    module = importlib.import_module(top)
    name = "Lightning" if top == "lightning" else top
    return f"{name} {getattr(module, '__version__', '?')}"


@pytest.mark.parametrize(
    "entry", EVERY, ids=lambda e: f"{e.owner.rsplit('.', 1)[-1]}.{e.name.strip(chr(34))}"
)
def test_every_relied_on_internal_is_still_there(entry):
    problem = _problem(entry)
    assert problem is None, (
        f"{_library(entry)} changed {entry.owner}.{entry.name} ({problem}; used by "
        f"{entry.used_by}); "
        "update fixed_embed/lightning_internals.py"
    )


def test_the_helpers_do_what_their_callers_rely_on():
    trainer = L.Trainer(
        accelerator="cpu",
        max_steps=5,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    module = L.LightningModule()
    assert internals.attached_trainer(module) is None
    module.trainer = trainer
    assert internals.attached_trainer(module) is trainer

    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 0.5)
    internals.set_scheduler_last_lr(scheduler, [0.25])
    assert scheduler.get_last_lr() == [0.25] and scheduler.state_dict()["_last_lr"] == [0.25]

    checkpoint = {"loops": {"fit_loop": {"state_dict": {internals.COMBINED_LOADER: ["state"]}}}}
    assert internals.fit_loop_state(checkpoint) == {"combined_loader": ["state"]}
    # the loop's own state, under the key read above
    assert "state_dict" in trainer.fit_loop.state_dict()

    # The profiler wrap sees the loop's fetch action (named after the loop's class) and passes
    # every action on.
    class Profiler:
        def __init__(self):
            self.seen = []

        def start(self, action):
            self.seen.append(("start", action))

        def stop(self, action):
            self.seen.append(("stop", action))

    profiler, calls = Profiler(), []
    timer = internals.FetchTimer(
        profiler, lambda: calls.append("fetch start"), lambda: calls.append("fetch stop")
    )
    fetch = f"[{type(trainer.fit_loop.epoch_loop).__name__}].train_dataloader_next"
    profiler.start(fetch)
    profiler.stop(fetch)
    profiler.start("run_training_batch")
    assert calls == ["fetch start", "fetch stop"]
    assert profiler.seen == [("start", fetch), ("stop", fetch), ("start", "run_training_batch")]
    timer.remove()
    profiler.start(fetch)
    assert calls == ["fetch start", "fetch stop"]  # unwrapped


def test_no_other_project_file_touches_these_internals():
    """The private names read, written or called through this module appear nowhere else in the
    project's code."""
    touched = {
        f".{e.name}" for e in internals.LIGHTNING_INTERNALS if e.kind in ("instance", "method")
    }
    touched -= {".max_steps"}  # also the trainer's public (read-only) property
    touched |= {
        "._last_lr",
        "._trainer",
        "._save_distributed_checkpoint",
        "train_dataloader_next",
        ".__class__ =",
    }
    home = Path(internals.__file__).resolve()
    found = [
        f"{path.relative_to(ROOT)}:{n}: {name}"
        for folder in ("fixed_embed", "callbacks", "benchmarks")
        for path in sorted((ROOT / folder).rglob("*.py"))
        if path.resolve() != home
        for n, line in enumerate(path.read_text().splitlines(), 1)
        for name in touched
        if re.search(re.escape(name) + r"\b" if name[-1].isalnum() else re.escape(name), line)
    ]
    assert not found, "move these into fixed_embed/lightning_internals.py:\n" + "\n".join(found)


def test_the_sigterm_broadcast_is_skipped_while_preemption_owns_sigterm_and_restored_after():
    import signal

    import lightning as L

    from callbacks.preemption import PreemptionCheckpoint

    trainer = L.Trainer(
        accelerator="cpu", logger=False, enable_checkpointing=False, enable_progress_bar=False
    )
    loop = trainer.fit_loop.epoch_loop
    original = loop._broadcast_sigterm_tensor
    callback = PreemptionCheckpoint()
    callback.on_train_start(trainer, None)
    try:
        assert loop._broadcast_sigterm_tensor() is None and "_broadcast_sigterm_tensor" in vars(
            loop
        )
    finally:
        callback.teardown(trainer, None, "fit")
    assert loop._broadcast_sigterm_tensor == original and "_broadcast_sigterm_tensor" not in vars(
        loop
    )
    # Lightning's SIGTERM handler stays: so does its broadcast
    other = PreemptionCheckpoint(signals=["SIGUSR1"])
    other.on_train_start(trainer, None)
    try:
        assert "_broadcast_sigterm_tensor" not in vars(loop)
    finally:
        other.teardown(trainer, None, "fit")
    assert signal.getsignal(signal.SIGUSR1) is not other._handle
