"""Every use of a library's private API, in one place: what is touched, why, and why no public hook serves.

Lightning 2.6.6 (pinned in ``pyproject.toml``) offers no public way to do the things below. Each one
is a function here, called from its call sites. ``tests/test_lightning_internals.py`` checks every
name, signature and call this module relies on (:data:`LIGHTNING_INTERNALS`, :data:`TORCH_INTERNALS`),
in-process and without training, so a library upgrade fails there by name instead of in a run.

Lightning internals still used:

- ``_TrainingEpochLoop._should_accumulate`` (called): :func:`ends_update`, the one answer to "does this
  micro-batch end an update" (every ``callbacks.update_boundary.UpdateCallback``, FSDP2's gradient sync).
- ``_TrainingEpochLoop._broadcast_sigterm_tensor`` (shadowed): :func:`skip_sigterm_broadcast`, no
  collective and host sync per micro-batch under :class:`callbacks.preemption.PreemptionCheckpoint`.
- ``ModelParallelStrategy._data_parallel_size`` (write): :func:`set_data_parallel_size`, FSDP2 over
  every rank.
- The profiler action ``[_TrainingEpochLoop].train_dataloader_next`` around the loop's ``next()``:
  :class:`FetchTimer`, the data wait of ``callbacks/throughput.py``.
- The checkpoint layout ``checkpoint["loops"]["fit_loop"]["state_dict"]["combined_loader"]`` (the
  training loader's state, saved from global rank 0 only): :func:`fit_loop_state`, used by
  :mod:`fixed_embed.data.loader_state`.

Other libraries: torch's ``LRScheduler._last_lr`` (write, :func:`set_scheduler_last_lr`); tqdm's
``tqdm.__init__`` (wrapped, :func:`route_tqdm`); the class of an existing ``logging.Logger``
(swapped, :func:`take_over_logger`); and, listed in :data:`TORCH_INTERNALS` only, the c10d store
that ``rank_watch.py`` uses.

Replaced by public API: ``LightningModule._trainer`` (:func:`attached_trainer` uses the public
``trainer`` property), ``ModelCheckpoint``'s protected methods (``CheckpointPolicy`` is a plain
``Checkpoint`` that calls ``trainer.save_checkpoint``), ``RichProgressBar``'s (``UpdateProgressBar``
draws with ``rich`` itself), torch's ``_load_state_dict`` and ``_EmptyStateDictLoadPlanner`` (``fsdp.py``
reads shards with the public ``load``), ``ModelParallelStrategy._save_distributed_checkpoint`` in ``FSDP2Strategy`` (its
own ``save_distributed_checkpoint``), ``fit_loop.epoch_loop.max_steps`` (the CLI's ``instantiate_trainer``
gives the Trainer the length a token budget resolves to), ``LightningCLI._parse_ckpt_path`` (the CLI's
``parse_arguments`` holds the checkpoint path back from it); torch's ``Module._non_persistent_buffers_set``
(:func:`fixed_embed.accounting.derived_buffers`: the buffers a state dict leaves out).

This module imports neither Lightning nor torch: :mod:`fixed_embed.console` uses it before any
library is imported.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any, NamedTuple

__all__ = [
    "LIGHTNING_INTERNALS",
    "TORCH_INTERNALS",
    "FetchTimer",
    "Internal",
    "attached_trainer",
    "ends_update",
    "fit_loop_state",
    "route_tqdm",
    "set_data_parallel_size",
    "set_scheduler_last_lr",
    "skip_sigterm_broadcast",
    "take_over_logger",
]


class Internal(NamedTuple):
    """One private name relied on: ``name`` on ``owner`` (a dotted class or module), and how.

    ``kind``: ``attribute`` (of the class or module), ``instance`` (set on instances, in
    ``__init__``), ``method`` (called or overridden with exactly the parameters ``params``; a last
    ``...`` allows more), or ``text`` (no attribute: ``name`` must appear in ``called_in``'s source).
    ``called_in``: functions of the library (dotted, or a name on ``owner``) whose source must name
    ``name`` -- an override that nothing calls any more would silently do nothing.
    """

    owner: str
    name: str
    kind: str = "attribute"
    params: tuple[str, ...] = ()
    called_in: tuple[str, ...] = ()
    used_by: str = ""


_FIT_LOOP = "lightning.pytorch.loops.fit_loop._FitLoop"
_EPOCH_LOOP = "lightning.pytorch.loops.training_epoch_loop._TrainingEpochLoop"
_CONNECTOR = "lightning.pytorch.trainer.connectors.checkpoint_connector._CheckpointConnector"
_STRATEGY = "lightning.pytorch.strategies.ModelParallelStrategy"

# Private names read, written or called by the functions of this module.
LIGHTNING_INTERNALS: tuple[Internal, ...] = (
    Internal(_EPOCH_LOOP, "_should_accumulate", "method", ("self",), ("update_lr_schedulers",), "ends_update"),
    Internal(_EPOCH_LOOP, "_broadcast_sigterm_tensor", "method", ("self",), ("advance",), "skip_sigterm_broadcast"),
    Internal(_STRATEGY, "_data_parallel_size", "instance", (), ("setup_environment",), "set_data_parallel_size"),
    Internal(_EPOCH_LOOP, "train_dataloader_next", "text", (), ("_on_before_fetch", "_on_after_fetch"), "FetchTimer"),
    Internal(_CONNECTOR, '"loops"', "text", (), ("dump_checkpoint",), "fit_loop_state"),
    Internal(_CONNECTOR, '"fit_loop"', "text", (), ("_get_loops_state_dict",), "fit_loop_state"),
    Internal(_FIT_LOOP, '"combined_loader"', "text", (), ("on_save_checkpoint", "on_load_checkpoint"),
             "fit_loop_state"),
)  # fmt: skip

# Other libraries' private names: the first two used here, the last listed for the upgrade check only.
TORCH_INTERNALS: tuple[Internal, ...] = (
    Internal("torch.optim.lr_scheduler.LRScheduler", "_last_lr", "text", (), ("get_last_lr",), "set_scheduler_last_lr"),
    Internal("tqdm.std.tqdm", "__init__", "method", ("self", "iterable", "desc", "total", "leave", "file", "..."),
             used_by="route_tqdm: file is the 5th positional parameter"),
    Internal("torch.distributed.distributed_c10d", "_get_default_store", "method", (),
             used_by="fixed_embed/rank_watch.py: the launcher's store, for a stop no collective can carry"),
)  # fmt: skip


# -- Lightning ---------------------------------------------------------------------------------------


def attached_trainer(module: Any) -> Any:
    """The module's trainer, or None outside one. Public API: the ``trainer`` property raises when unattached."""
    try:
        return module.trainer
    except RuntimeError:
        return None


def ends_update(trainer: Any) -> bool:
    """Whether the micro-batch now starting ends its optimizer update (read from ``on_train_batch_start``).

    Why private: Lightning's own decision (the accumulation count, an epoch's last batch, a stream that
    ran out) is ``_TrainingEpochLoop._should_accumulate``; a copy of it would drift from the step Lightning
    actually takes, and FSDP2 would step on gradients never reduce-scattered.
    """
    return not trainer.fit_loop.epoch_loop._should_accumulate()


def skip_sigterm_broadcast(trainer: Any) -> Callable[[], None]:
    """Stop Lightning's per-micro-batch SIGTERM broadcast; returns the function that restores it.

    Why private: with more than one rank Lightning broadcasts a flag from rank 0 before every micro-batch
    and reads it back (``.item()``: a collective and a host sync each time). The flag is set only by
    Lightning's own SIGTERM handler, which :class:`callbacks.preemption.PreemptionCheckpoint` replaces
    (its stop travels through the rank watch and a vote once per update), so the broadcast always says 0.
    No public switch turns it off.
    """
    loop = trainer.fit_loop.epoch_loop
    loop._broadcast_sigterm_tensor = lambda: None  # an instance attribute, over the class's method
    return lambda: loop.__dict__.pop("_broadcast_sigterm_tensor", None)


def set_data_parallel_size(strategy: Any, size: int) -> None:
    """The data-parallel width of a ``ModelParallelStrategy``'s device mesh, before ``setup_environment`` builds it.

    Why private: the constructor takes ``data_parallel_size``, but the world size it must equal is
    known only once the launcher set ``num_nodes`` x ``num_processes``; ``"auto"`` means one node wide.
    """
    strategy._data_parallel_size = size


_FETCH_ACTION = ".train_dataloader_next"


class FetchTimer:
    """Calls ``on_start`` / ``on_stop`` around each fetch of a training batch.

    Why not timestamps in the callback hooks: Lightning runs, per micro-batch, ``next()`` on the
    dataloader, then every callback's ``on_train_batch_start``, the step, every callback's
    ``on_train_batch_end`` (``ModelCheckpoint`` last), the module's hook, validation and logging.
    "From this callback's ``on_train_batch_end`` to the next ``on_train_batch_start``" therefore
    includes every later callback (checkpoint writes, in-loop benchmarks) and the loop's own work;
    no callback hook runs right before the fetch. The fetch itself is bracketed by the trainer's
    profiler -- ``profiler.start/stop("[_TrainingEpochLoop].train_dataloader_next")``, the default
    ``PassThroughProfiler`` included -- so this timer wraps the trainer's profiler object (its
    ``start``/``stop``, delegating to the originals: a configured profiler still sees every action)
    for the duration of the fit. Exactly the time in ``next()`` is data wait; nothing else is.
    Why private: the action's name is the loop's, not an API.
    """

    def __init__(self, profiler: Any, on_start: Callable[[], None], on_stop: Callable[[], None]) -> None:
        self.profiler, self.on_start, self.on_stop = profiler, on_start, on_stop
        self._start, self._stop = profiler.start, profiler.stop
        profiler.start, profiler.stop = self.start, self.stop

    def start(self, action_name: str) -> None:
        if action_name.endswith(_FETCH_ACTION):
            self.on_start()
        self._start(action_name)

    def stop(self, action_name: str) -> None:
        self._stop(action_name)
        if action_name.endswith(_FETCH_ACTION):
            self.on_stop()

    def remove(self) -> None:
        if self.profiler.start == self.start:  # not wrapped again since
            self.profiler.start, self.profiler.stop = self._start, self._stop


COMBINED_LOADER = "combined_loader"  # the fit loop's key for the training loader's state


def fit_loop_state(checkpoint: dict[str, Any]) -> dict[str, Any] | None:
    """The fit loop's own state in a checkpoint, which holds the training loader's under :data:`COMBINED_LOADER`.

    Why private: Lightning saves (and restores) the loader's state inside its loop's state, written
    from global rank 0 only; no hook hands a rank its own. The layout is Lightning's checkpoint format.
    """
    return checkpoint.get("loops", {}).get("fit_loop", {}).get("state_dict")


# -- other libraries ---------------------------------------------------------------------------------


def set_scheduler_last_lr(scheduler: Any, lrs: list[float]) -> None:
    """Make ``scheduler.get_last_lr()`` (and its saved state) say ``lrs``, the LRs just set on its optimizer.

    Why private: torch's ``get_last_lr()`` has no setter; only ``step()`` sets it, and a step would
    advance the schedule.
    """
    scheduler._last_lr = lrs


def route_tqdm(stream: Any) -> None:
    """tqdm bars created without a ``file`` (lm-eval's, datasets', the evaluation's own) write to ``stream``.

    Why a patch: tqdm has no process-wide default for ``file`` (it is ``sys.stderr`` at each bar's
    creation), and the bars are made inside other libraries. Idempotent.
    """
    try:
        from tqdm import std
    except ImportError:
        return
    original = std.tqdm.__init__
    if getattr(original, "_fixed_embed_console", False):
        return

    @functools.wraps(original)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        if len(args) < 5 and kwargs.get("file") is None:  # file is tqdm's 5th parameter
            kwargs["file"] = stream
        original(self, *args, **kwargs)

    __init__._fixed_embed_console = True  # type: ignore[attr-defined]
    std.tqdm.__init__ = __init__


def take_over_logger(logger: logging.Logger, cls: type[logging.Logger]) -> None:
    """Make the existing ``logger`` an instance of ``cls`` (a ``logging.Logger`` subclass adding no state).

    Why: Lightning, transformers, datasets, ... configure their logger when imported (a stderr
    handler, ``propagate = False``), after :func:`fixed_embed.console.setup`. ``logging`` has no hook
    for that, and ``logging.setLoggerClass`` affects only loggers created later, not ones that exist.
    """
    logger.__class__ = cls
