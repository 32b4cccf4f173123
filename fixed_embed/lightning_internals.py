"""Every use of a library's private API, in one place: what is touched, why, and why no public hook serves.

Lightning 2.6.6 (pinned in ``pyproject.toml``) offers no public way to do the things below. Each one
is a function here, called from its one call site, or -- where the project overrides a protected
method of a Lightning class -- an entry of :data:`LIGHTNING_OVERRIDES` next to the override.
``tests/test_lightning_internals.py`` checks every name, signature and call this module relies on
(:data:`LIGHTNING_INTERNALS`, :data:`LIGHTNING_OVERRIDES`, :data:`TORCH_INTERNALS`), in-process and
without training, so a library upgrade fails there by name instead of in a run.

Lightning internals still used:

- ``ModelCheckpoint._every_n_train_steps`` (read): :func:`checkpoint_every_n_train_steps`, so an
  in-loop benchmark knows whether the checkpoint callback (which runs after it) saves at this update.
- ``ModelCheckpoint._last_global_step_saved``, ``._monitor_candidates``, ``._save_topk_checkpoint``,
  ``._save_last_checkpoint``: :func:`save_through`, a save now (preemption, the run's last update)
  under the callback's own names, retention and ``last`` link.
- ``_TrainingEpochLoop._should_accumulate`` (called): :func:`ends_update`, FSDP2's gradient sync on an
  update's last micro-batch only.
- ``_TrainingEpochLoop._broadcast_sigterm_tensor`` (shadowed): :func:`skip_sigterm_broadcast`, no
  collective and host sync per micro-batch under :class:`callbacks.preemption.PreemptionCheckpoint`.
- ``ModelParallelStrategy._data_parallel_size`` (write): :func:`set_data_parallel_size`, FSDP2 over
  every rank.
- The profiler action ``[_TrainingEpochLoop].train_dataloader_next`` around the loop's ``next()``:
  :class:`FetchTimer`, the data wait of ``callbacks/throughput.py``.
- The checkpoint layout ``checkpoint["loops"]["fit_loop"]["state_dict"]["combined_loader"]`` (the
  training loader's state, saved from global rank 0 only): :func:`fit_loop_state`, used by
  :mod:`fixed_embed.data.loader_state`.
- Overridden protected methods (:data:`LIGHTNING_OVERRIDES`): ``ModelCheckpoint._save_checkpoint``,
  ``._remove_checkpoint``, ``._should_remove_checkpoint``, ``._link_checkpoint``
  (``callbacks/checkpointing.py``); ``RichProgressBar._initialize_train_progress_bar_id``, calling
  ``._add_task``, ``._update``, ``._update_metrics`` (``callbacks/progress.py``).

Other libraries: torch's ``LRScheduler._last_lr`` (write, :func:`set_scheduler_last_lr`); tqdm's
``tqdm.__init__`` (wrapped, :func:`route_tqdm`); the class of an existing ``logging.Logger``
(swapped, :func:`take_over_logger`); and, listed in :data:`TORCH_INTERNALS` only, the torch
internals used elsewhere (sharded-checkpoint reading in ``fsdp.py``, the c10d store in
``rank_watch.py``).

Replaced by public API: ``LightningModule._trainer`` (:func:`attached_trainer` uses the public
``trainer`` property), ``ModelCheckpoint._every_n_train_steps`` inside ``CheckpointPolicy`` (its own
``every_n_steps``), ``ModelParallelStrategy._save_distributed_checkpoint`` in ``FSDP2Strategy`` (its
own ``save_distributed_checkpoint``), ``fit_loop.epoch_loop.max_steps`` (the CLI's ``instantiate_trainer``
gives the Trainer the length a token budget resolves to), ``LightningCLI._parse_ckpt_path`` (the CLI's
``parse_arguments`` holds the checkpoint path back from it).

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
    "LIGHTNING_OVERRIDES",
    "TORCH_INTERNALS",
    "FetchTimer",
    "Internal",
    "attached_trainer",
    "checkpoint_every_n_train_steps",
    "ends_update",
    "fit_loop_state",
    "route_tqdm",
    "save_through",
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
    ``called_in``: a function of the library (dotted, or a name on ``owner``) whose source must name
    ``name`` -- an override that nothing calls any more would silently do nothing.
    """

    owner: str
    name: str
    kind: str = "attribute"
    params: tuple[str, ...] = ()
    called_in: str | None = None
    used_by: str = ""


_CHECKPOINT = "lightning.pytorch.callbacks.ModelCheckpoint"
_FIT_LOOP = "lightning.pytorch.loops.fit_loop._FitLoop"
_EPOCH_LOOP = "lightning.pytorch.loops.training_epoch_loop._TrainingEpochLoop"
_CONNECTOR = "lightning.pytorch.trainer.connectors.checkpoint_connector._CheckpointConnector"
_RICH_BAR = "lightning.pytorch.callbacks.RichProgressBar"
_STRATEGY = "lightning.pytorch.strategies.ModelParallelStrategy"
_TRAINER, _CANDIDATES = ("self", "trainer"), ("self", "trainer", "monitor_candidates")

# Private names read, written or called by the functions of this module.
LIGHTNING_INTERNALS: tuple[Internal, ...] = (
    Internal(_CHECKPOINT, "_every_n_train_steps", "instance", used_by="checkpoint_every_n_train_steps"),
    Internal(_CHECKPOINT, "_last_global_step_saved", "instance", called_in="_save_checkpoint", used_by="save_through"),
    Internal(_CHECKPOINT, "_monitor_candidates", "method", _TRAINER, used_by="save_through"),
    Internal(_CHECKPOINT, "_save_topk_checkpoint", "method", _CANDIDATES, used_by="save_through"),
    Internal(_CHECKPOINT, "_save_last_checkpoint", "method", _CANDIDATES, used_by="save_through"),
    Internal(
        _EPOCH_LOOP, "_should_accumulate", "method", ("self",), called_in="update_lr_schedulers", used_by="ends_update"
    ),
    Internal(
        _EPOCH_LOOP,
        "_broadcast_sigterm_tensor",
        "method",
        ("self",),
        called_in="advance",
        used_by="skip_sigterm_broadcast",
    ),
    Internal(
        _STRATEGY, "_data_parallel_size", "instance", called_in="setup_environment", used_by="set_data_parallel_size"
    ),
    Internal(_EPOCH_LOOP, "train_dataloader_next", "text", called_in="_on_before_fetch", used_by="FetchTimer"),
    Internal(_EPOCH_LOOP, "train_dataloader_next", "text", called_in="_on_after_fetch", used_by="FetchTimer"),
    Internal(_CONNECTOR, '"loops"', "text", called_in="dump_checkpoint", used_by="fit_loop_state"),
    Internal(_CONNECTOR, '"fit_loop"', "text", called_in="_get_loops_state_dict", used_by="fit_loop_state"),
    Internal(_FIT_LOOP, '"combined_loader"', "text", called_in="on_save_checkpoint", used_by="fit_loop_state"),
    Internal(_FIT_LOOP, '"combined_loader"', "text", called_in="on_load_checkpoint", used_by="fit_loop_state"),
)

# Protected methods of Lightning classes that this project overrides, or calls from a subclass.
LIGHTNING_OVERRIDES: tuple[Internal, ...] = (
    Internal(_CHECKPOINT, "_save_checkpoint", "method", ("self", "trainer", "filepath"),
             called_in="_update_best_and_save", used_by="callbacks/checkpointing.py: one console line each"),
    Internal(_CHECKPOINT, "_remove_checkpoint", "method", ("self", "trainer", "filepath"),
             called_in="_update_best_and_save", used_by="callbacks/checkpointing.py: keeps the permanent ones"),
    Internal(_CHECKPOINT, "_should_remove_checkpoint", "method", ("self", "trainer", "previous", "current"),
             called_in="_update_best_and_save", used_by="callbacks/checkpointing.py: the resumed-from one may go"),
    Internal(_CHECKPOINT, "_link_checkpoint", "method", ("trainer", "filepath", "linkpath"),
             called_in="_save_last_checkpoint", used_by="callbacks/checkpointing.py: last swapped atomically"),
    Internal(_RICH_BAR, "_initialize_train_progress_bar_id", "method", ("self",), called_in="on_train_batch_end",
             used_by="callbacks/progress.py: the bar counts updates"),
    Internal(_RICH_BAR, "_add_task", "method", ("self", "total_batches", "description", "visible"),
             used_by="callbacks/progress.py"),
    Internal(_RICH_BAR, "_update", "method", ("self", "progress_bar_id", "current", "visible", "hard"),
             used_by="callbacks/progress.py"),
    Internal(_RICH_BAR, "_update_metrics", "method", ("self", "trainer", "pl_module"), used_by="callbacks/progress.py"),
)  # fmt: skip

# Other libraries' private names: the first two used here, the others listed for the upgrade check only.
TORCH_INTERNALS: tuple[Internal, ...] = (
    Internal("torch.optim.lr_scheduler.LRScheduler", "_last_lr", "text", called_in="get_last_lr",
             used_by="set_scheduler_last_lr"),
    Internal("tqdm.std.tqdm", "__init__", "method", ("self", "iterable", "desc", "total", "leave", "file", "..."),
             used_by="route_tqdm: file is the 5th positional parameter"),
    Internal("torch.distributed.checkpoint.default_planner", "_EmptyStateDictLoadPlanner",
             used_by="fixed_embed/fsdp.py: a weights-only read of sharded checkpoints"),
    Internal("torch.distributed.checkpoint.state_dict_loader", "_load_state_dict", "method",
             ("state_dict", "storage_reader", "process_group", "coordinator_rank", "no_dist", "planner", "..."),
             used_by="fixed_embed/fsdp.py"),
    Internal("torch.distributed.distributed_c10d", "_get_default_store", "method", (),
             used_by="fixed_embed/rank_watch.py"),
)  # fmt: skip


# -- Lightning ---------------------------------------------------------------------------------------


def attached_trainer(module: Any) -> Any:
    """The module's trainer, or None outside one. Public API: the ``trainer`` property raises when unattached."""
    try:
        return module.trainer
    except RuntimeError:
        return None


def checkpoint_every_n_train_steps(callback: Any) -> int:
    """The save interval of a ``ModelCheckpoint`` (0: none, also for no callback).

    Why private: ``ModelCheckpoint`` takes ``every_n_train_steps`` but exposes it only as
    ``_every_n_train_steps`` (``every_n_epochs`` has a property; this one has none in 2.6).
    """
    return getattr(callback, "_every_n_train_steps", 0) or 0


def save_through(callback: Any, trainer: Any) -> None:
    """Save now through ``callback`` (a ``ModelCheckpoint``): its top-k names and retention, then its ``last``.

    Nothing happens if the callback already saved this update. Why private: the callback saves only
    from its own hooks (every N train steps, validation end, epoch end); ``trainer.save_checkpoint``
    writes a file but past the callback's names, retention and ``last`` link, which then never learn of it.
    """
    if callback._last_global_step_saved != trainer.global_step:
        candidates = callback._monitor_candidates(trainer)
        callback._save_topk_checkpoint(trainer, candidates)
        callback._save_last_checkpoint(trainer, candidates)


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
