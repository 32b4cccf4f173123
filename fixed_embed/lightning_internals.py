"""Every use of a library's private API, each a function saying why no public way serves
(docs/design.md, "Lightning internals"). Imports neither Lightning nor torch:
:mod:`fixed_embed.run.console` uses it first."""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any, NamedTuple


class Internal(NamedTuple):
    """A private ``name`` on ``owner``, used as ``kind``: ``attribute``, ``instance`` (set in
    ``__init__``), ``method`` (exactly ``params``; a last ``...`` allows more) or ``text``; each
    function ``called_in`` must name it."""

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
    Internal(
        _EPOCH_LOOP,
        "_should_accumulate",
        "method",
        ("self",),
        ("update_lr_schedulers",),
        "ends_update",
    ),
    Internal(
        _EPOCH_LOOP,
        "_broadcast_sigterm_tensor",
        "method",
        ("self",),
        ("advance",),
        "skip_sigterm_broadcast",
    ),
    Internal(
        _STRATEGY,
        "_data_parallel_size",
        "instance",
        (),
        ("setup_environment",),
        "set_data_parallel_size",
    ),
    Internal(
        _EPOCH_LOOP,
        "train_dataloader_next",
        "text",
        (),
        ("_on_before_fetch", "_on_after_fetch"),
        "FetchTimer",
    ),
    Internal(_CONNECTOR, '"loops"', "text", (), ("dump_checkpoint",), "fit_loop_state"),
    Internal(_CONNECTOR, '"fit_loop"', "text", (), ("_get_loops_state_dict",), "fit_loop_state"),
    Internal(
        _FIT_LOOP,
        '"combined_loader"',
        "text",
        (),
        ("on_save_checkpoint", "on_load_checkpoint"),
        "fit_loop_state",
    ),
)

# Other libraries' private names: the first two used here, the others where they are named.
TORCH_INTERNALS: tuple[Internal, ...] = (
    Internal(
        "torch.optim.lr_scheduler.LRScheduler",
        "_last_lr",
        "text",
        (),
        ("get_last_lr",),
        "set_scheduler_last_lr",
    ),
    Internal(
        "tqdm.std.tqdm",
        "__init__",
        "method",
        ("self", "iterable", "desc", "total", "leave", "file", "..."),
        used_by="route_tqdm: file is the 5th positional parameter",
    ),
    Internal(
        "torch.distributed.distributed_c10d",
        "_get_default_store",
        "method",
        (),
        used_by="fixed_embed/distributed/rank_watch.py: the launcher's store, for a stop no "
        "collective carries",
    ),
    Internal(
        "torch.nn.Module",
        "_load_from_state_dict",
        "method",
        ("self", "state_dict", "prefix", "..."),
        used_by="fixed_embed/interfaces: a fixed code's stored state checked against its spec, "
        "naming both",
    ),
    Internal(
        "torch",
        "_assert_async",
        used_by="fixed_embed/interfaces/base.py: the id range checked on the device, without a "
        "host sync",
    ),
    # fixed_embed/measure/trace.py: torch's memory tracing has no public API yet (torchtitan's
    # estimator uses these)
    Internal(
        "torch._subclasses.fake_tensor",
        "FakeTensorMode",
        used_by="fixed_embed/measure/trace.py: storage-less tensors",
    ),
    Internal(
        "torch._subclasses.fake_tensor",
        "is_fake",
        used_by="fixed_embed/interfaces/base.py: fake ids have no values to check (trace_update)",
    ),
    Internal(
        "torch.distributed._tools.mem_tracker",
        "MemTracker",
        used_by="fixed_embed/measure/trace.py: the peak, by kind",
    ),
    Internal(
        "torch.distributed._tools.fsdp2_mem_tracker",
        "FSDPMemTracker",
        used_by="fixed_embed/measure/trace.py: the peak, by kind, with FSDP2's gathers and "
        "reduce-scatters",
    ),
    Internal(
        "torch.testing._internal.distributed.fake_pg",
        "FakeStore",
        used_by="fixed_embed/measure/trace.py: importing it registers the 'fake' process group "
        "(one rank of W)",
    ),
    Internal(
        "torch.ops.aten",
        "_scaled_dot_product_flash_attention_for_cpu",
        used_by="fixed_embed/measure/trace.py: its FLOPs, which FlopCounterMode counts for the "
        "CUDA kernels only",
    ),
    Internal(
        "torch.ops.aten",
        "_scaled_dot_product_flash_attention_for_cpu_backward",
        used_by="fixed_embed/measure/trace.py: as the forward",
    ),
)


def attached_trainer(module: Any) -> Any:
    """The module's trainer, or None outside one (the public ``trainer`` property raises)."""
    try:
        return module.trainer
    except RuntimeError:
        return None


def ends_update(trainer: Any) -> bool:
    """Whether the micro-batch now starting (``on_train_batch_start``) ends its update. Why
    private: Lightning decides in ``_should_accumulate`` (count, epoch end, stream end); a copy
    would drift, and FSDP2 would step unreduced."""
    return not trainer.fit_loop.epoch_loop._should_accumulate()


def skip_sigterm_broadcast(trainer: Any) -> Callable[[], None]:
    """Stop Lightning's per-micro-batch SIGTERM broadcast (a collective and host sync) that says
    0 once ``PreemptionCheckpoint`` replaced its handler; returns its restorer. Why private: no
    public switch turns it off."""
    loop = trainer.fit_loop.epoch_loop
    loop._broadcast_sigterm_tensor = lambda: None  # an instance attribute, over the class's method
    return lambda: loop.__dict__.pop("_broadcast_sigterm_tensor", None)


def set_data_parallel_size(strategy: Any, size: int) -> None:
    """A ``ModelParallelStrategy``'s data-parallel width, before ``setup_environment``. Why
    private: the constructor's must equal a world size known only once the launcher set
    ``num_nodes`` x ``num_processes`` ("auto": one node)."""
    strategy._data_parallel_size = size


class FetchTimer:
    """``on_start`` / ``on_stop`` around each training batch's fetch: the profiler brackets
    exactly ``next()`` (no callback hook does), wrapped so it still sees every action. Why
    private: the action's name is the loop's."""

    FETCH_ACTION = ".train_dataloader_next"

    def __init__(
        self, profiler: Any, on_start: Callable[[], None], on_stop: Callable[[], None]
    ) -> None:
        self.profiler, self.on_start, self.on_stop = profiler, on_start, on_stop
        self._start, self._stop = profiler.start, profiler.stop
        profiler.start, profiler.stop = self.start, self.stop

    def start(self, action_name: str) -> None:
        if action_name.endswith(self.FETCH_ACTION):
            self.on_start()
        self._start(action_name)

    def stop(self, action_name: str) -> None:
        self._stop(action_name)
        if action_name.endswith(self.FETCH_ACTION):
            self.on_stop()

    def remove(self) -> None:
        if self.profiler.start == self.start:  # not wrapped again since
            self.profiler.start, self.profiler.stop = self._start, self._stop


COMBINED_LOADER = "combined_loader"  # the fit loop's key for the training loader's state


def fit_loop_state(checkpoint: dict[str, Any]) -> dict[str, Any] | None:
    """The fit loop's state in a checkpoint; the training loader's is under
    :data:`COMBINED_LOADER`. Why private: Lightning keeps the loader's state inside its loop's
    (from rank 0 only); no hook hands a rank its own."""
    return checkpoint.get("loops", {}).get("fit_loop", {}).get("state_dict")


def set_scheduler_last_lr(scheduler: Any, lrs: list[float]) -> None:
    """Make ``scheduler.get_last_lr()`` (and its saved state) say ``lrs``, the LRs just set on
    its optimizer. Why private: only ``step()`` sets it, and a step would advance the schedule."""
    scheduler._last_lr = lrs


def route_tqdm(stream: Any) -> None:
    """tqdm bars created without a ``file`` (lm-eval's, datasets', the evaluation's own) write
    to ``stream``. Why a patch: tqdm has no process-wide default ``file``, and other libraries
    make the bars. Idempotent."""
    from tqdm import std  # a requirement of Lightning's

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
    """Make the existing ``logger`` a ``cls`` (a Logger subclass adding no state): libraries
    make theirs on import, after :func:`fixed_embed.run.console.setup`, and
    ``logging.setLoggerClass`` affects only loggers made later."""
    logger.__class__ = cls
