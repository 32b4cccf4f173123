"""LanguageModel: the Lightning wrapper around the decoder and its input interface; batches are
``[B, T + 1]``."""

from __future__ import annotations

import importlib
import math
from collections.abc import Callable, Mapping
from dataclasses import asdict
from functools import partial
from typing import Any, Literal

import lightning as L
import torch
from lightning.pytorch.utilities import rank_zero_warn
from torchmetrics.aggregation import MeanMetric

from fixed_embed.config import NonNegativeInt, PositiveInt
from fixed_embed.data.loader_state import gather_loader_states
from fixed_embed.distributed.parallel import ParallelConfig, apply_parallelism
from fixed_embed.errors import ConfigError
from fixed_embed.interfaces import BinaryCodeInput, InputInterface
from fixed_embed.lightning_internals import attached_trainer, ends_update
from fixed_embed.measure.memory import refuse_unless_it_fits
from fixed_embed.model.decoder import Decoder, DecoderConfig
from fixed_embed.model.loss import DEFAULT_LOSS_CHUNK_TOKENS
from fixed_embed.model.recipe import AdamWConfig, ScheduleConfig, build_adamw, lr_at
from fixed_embed.train import resume

InterfaceFactory = Callable[[int, int], InputInterface]


class LanguageModel(L.LightningModule):
    """Next-token language model. The signature is the ``model:`` schema of an experiment YAML.

    Args:
        decoder: the backbone (vocabulary, width, depth, ...).
        interface: the input interface class (and its options), built as ``interface(vocab_size,
        d_model)``. optimizer: AdamW settings.
        schedule: warm-up and cosine floor.
        token_budget: prediction tokens to train on; ``fixed-embed fit`` sets
        ``trainer.max_steps`` from it. on_nonfinite: on a non-finite loss or gradient, ``stop``
        raises before the update; ``skip`` drops it. max_skipped_updates: with ``skip``, stop
        once this many consecutive updates (or 10x in all) were skipped. parallel: activation
        checkpointing, compile and FSDP2 settings. loss_chunk_tokens: tokens per chunk of head +
        cross-entropy, so the full fp32 logits never exist (same
            loss and gradients); ``0`` or ``None``: unchunked.
    """

    def __init__(
        self,
        decoder: DecoderConfig | None = None,
        interface: InterfaceFactory = BinaryCodeInput,
        optimizer: AdamWConfig | None = None,
        schedule: ScheduleConfig | None = None,
        token_budget: PositiveInt | None = None,
        on_nonfinite: Literal["stop", "skip"] = "stop",
        max_skipped_updates: PositiveInt = 20,
        parallel: ParallelConfig | None = None,
        loss_chunk_tokens: NonNegativeInt | None = DEFAULT_LOSS_CHUNK_TOKENS,
    ) -> None:
        super().__init__()
        self.config = _as(DecoderConfig, decoder)
        self.optimizer_config = _as(AdamWConfig, optimizer)
        self.parallel_config = _as(ParallelConfig, parallel)
        self.schedule_config = _as(ScheduleConfig, schedule)
        self.loss_chunk_tokens = loss_chunk_tokens
        self.on_nonfinite = on_nonfinite
        self.max_skipped_updates = max_skipped_updates
        built = _interface_factory(interface)(self.config.vocab_size, self.config.d_model)
        self.decoder = Decoder(self.config, built)

        # Plain dicts: the checkpoint loads weights_only, and LightningCLI and
        # LanguageModel(**hparams) agree.
        self.save_hyperparameters()
        self.hparams.update(
            decoder=asdict(self.config),
            interface=built.spec(),
            optimizer=asdict(self.optimizer_config),
            schedule=asdict(self.schedule_config),
            parallel=asdict(self.parallel_config),
        )
        self.val_loss = MeanMetric()
        self.tokens_seen = self.skipped_updates = self.consecutive_skips = 0
        self._last_loss: torch.Tensor | None = None
        self._fresh_groups: list[dict[str, Any]] = []
        self._parallelized = False
        self._stance = None  # the compiler stance evaluation replaced
        # Set when plan_fit already printed what the resume changes: loading then does not repeat
        # it.
        self.resume_planned = False

    @property
    def interface(self) -> InputInterface:
        return self.decoder.interface

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.decoder(ids)

    def block_loss(self, block: torch.Tensor) -> tuple[torch.Tensor, int]:
        """Mean next-token loss over a batch of packed blocks ``[B, T + 1]`` (chunked head), and
        its target count."""
        if block.dim() != 2 or block.shape[1] < 2:
            raise ValueError(
                f"a batch must be packed blocks of shape [B, T + 1], got {tuple(block.shape)}"
            )
        inputs, targets = block[:, :-1], block[:, 1:]
        return self.decoder(inputs, targets, self.loss_chunk_tokens), targets.numel()

    def training_step(self, block: torch.Tensor, batch_idx: int) -> torch.Tensor:
        loss, n_targets = self.block_loss(block)
        # A non-finite loss is acted on in on_before_optimizer_step: once per update, alike on
        # every rank.
        self._last_loss = loss.detach()
        self.tokens_seen += n_targets * self.trainer.world_size
        # No host sync per micro-batch: the loss is not prog_bar (callbacks/progress.py reads it
        # per update), and Python numbers (a blocking copy when logged on CUDA) are logged on an
        # update's last micro-batch only.
        self.log("train/loss", loss)
        if ends_update(self.trainer):
            self.log("train/tokens", float(self.tokens_seen), rank_zero_only=True)
            self.log(
                "train/lr", self.trainer.optimizers[0].param_groups[0]["lr"], rank_zero_only=True
            )
        return loss

    def on_train_batch_start(self, batch: Any, batch_idx: int) -> None:
        # FSDP2: no reduce-scatter on an update's non-final micro-batches (Lightning's no_sync
        # covers DDP only).
        if not self.parallel_config.sync_every_micro_batch and hasattr(
            self.decoder, "set_requires_gradient_sync"
        ):
            self.decoder.set_requires_gradient_sync(ends_update(self.trainer))  # an FSDPModule's

    def on_before_optimizer_step(self, optimizer: torch.optim.Optimizer) -> None:
        # After the reduction, before clipping. One fused norm is non-finite iff some element is;
        # FSDP ranks see only their shard, hence the any-rank vote.
        grads = [resume.local_shard(p.grad) for p in self.parameters() if p.grad is not None]
        local_bad = bool(grads) and not bool(torch.isfinite(torch.nn.utils.get_total_norm(grads)))
        if not self.trainer.strategy.reduce_boolean_decision(local_bad, all=False):
            self.consecutive_skips = 0
            return
        loss = float(self._last_loss) if self._last_loss is not None else float("nan")
        if self.on_nonfinite == "stop":
            raise FloatingPointError(
                f"non-finite gradient at step {self.global_step} (last micro-batch loss {loss}); "
                "stopping "
                "before the update, so no checkpoint with poisoned weights is written. "
                "Set model.on_nonfinite=skip to drop such updates instead."
            )
        self.skipped_updates += 1
        self.consecutive_skips += 1
        limit = self.max_skipped_updates
        if self.consecutive_skips >= limit or self.skipped_updates >= 10 * limit:
            raise FloatingPointError(
                f"non-finite gradient at step {self.global_step} (loss {loss}): "
                f"{self.consecutive_skips} "
                f"consecutive and {self.skipped_updates} skipped updates in all reach "
                "model.max_skipped_updates "
                f"= {limit} ({10 * limit} in all); stopping. Lower the LR or resume from an "
                "earlier checkpoint."
            )
        rank_zero_warn(
            f"non-finite gradient at step {self.global_step} (loss {loss}): update skipped"
        )
        self.log("train/skipped_updates", float(self.skipped_updates), rank_zero_only=True)
        # AdamW leaves parameters without a gradient untouched (no moment update, no decay).
        optimizer.zero_grad(set_to_none=True)

    def validation_step(self, block: torch.Tensor, batch_idx: int) -> None:
        loss, n_targets = self.block_loss(block)
        self.val_loss.update(loss.detach(), weight=n_targets)

    test_step = validation_step

    # Evaluation runs the compiled blocks eagerly: its grad modes (and lm-eval's lengths) would
    # each add a graph (tens of seconds at d 2,048) until the recompile limit; training keeps its
    # one graph.
    def on_validation_start(self) -> None:
        if self.parallel_config.compile:
            # it keeps the stance it replaced
            self._stance = torch.compiler.set_stance("force_eager")

    def on_validation_end(self) -> None:
        if self._stance is not None:
            self._stance.__exit__(None, None, None)
            self._stance = None

    def on_validation_epoch_end(self) -> None:
        testing = self.trainer.testing
        mean = self.val_loss.compute()
        self.val_loss.reset()
        # Already global (torchmetrics reduced it); sync_dist averages identical values, silencing
        # Lightning.
        self.log("test/loss" if testing else "val/loss", mean, prog_bar=not testing, sync_dist=True)
        self.log("test/ppl" if testing else "val/ppl", torch.exp(mean), sync_dist=True)
        if not testing and (
            per_target := getattr(self.trainer.datamodule, "val_bytes_per_target", None)
        ):
            # tokenizer-free: total nats / ln 2 over the UTF-8 bytes the targets stand for
            self.log("val/bits_per_byte", mean / (math.log(2) * per_target), sync_dist=True)

    on_test_start, on_test_end = on_validation_start, on_validation_end
    on_test_epoch_end = on_validation_epoch_end

    def configure_model(self) -> None:
        # Lightning may call this hook again (e.g. fit then test): apply the wrapping once.
        if self._parallelized:
            return
        # ModelParallelStrategy sets the mesh
        apply_parallelism(self.decoder, self.parallel_config, self.device_mesh)
        self._parallelized = True

    def setup(self, stage: str) -> None:
        if stage == "fit":
            if not self.trainer.max_steps > 0:
                raise ConfigError(
                    "set trainer.max_steps to bound training (fixed-embed fit sets it from "
                    "model.token_budget)"
                )
            refuse_unless_it_fits(self, self.trainer)  # CUDA only: nothing to compare with on CPU

    def configure_optimizers(self) -> dict[str, Any]:
        optimizer = build_adamw(self, self.optimizer_config)
        peak, sched, max_steps = (
            self.optimizer_config.lr,
            self.schedule_config,
            self.trainer.max_steps,
        )
        scheduler = torch.optim.lr_scheduler.LambdaLR(
            optimizer,
            lambda step: (
                lr_at(step, peak, sched.warmup_steps, max_steps, sched.min_lr_ratio) / peak
            ),
        )
        self._fresh_groups = [
            {k: v for k, v in g.items() if k != "params"} for g in optimizer.param_groups
        ]
        return {
            "optimizer": optimizer,
            "lr_scheduler": {"scheduler": scheduler, "interval": "step"},
        }

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        trainer = attached_trainer(self)
        resume.refuse_poisoned(checkpoint, trainer, self.global_step)
        checkpoint.update(tokens_seen=self.tokens_seen, skipped_updates=self.skipped_updates)
        if trainer is not None and trainer.world_size > 1:
            gather_loader_states(checkpoint, trainer.world_size)

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        resume.check_resume(checkpoint, self, say_changes=not self.resume_planned)
        self.tokens_seen = checkpoint.get("tokens_seen", 0)
        self.skipped_updates = checkpoint.get("skipped_updates", 0)

    def on_train_start(self) -> None:
        # A resume restored the checkpoint's optimizer and scheduler settings; the config given now
        # wins.
        if self.trainer.ckpt_path is None or not self._fresh_groups:
            return
        scheduler = self.trainer.lr_scheduler_configs[0].scheduler
        resume.reapply_config(self.trainer.optimizers[0], scheduler, self._fresh_groups)


def _as(cls: type, value: Any) -> Any:
    """A config dataclass from None (defaults), a mapping (checkpoint hparams) or an instance."""
    if value is None:
        return cls()
    if isinstance(value, Mapping):
        return cls(**value)
    if not isinstance(value, cls):
        raise TypeError(
            f"expected {cls.__name__} or a mapping of its fields, got {type(value).__name__}"
        )
    return value


def _interface_factory(interface: InterfaceFactory | Mapping) -> InterfaceFactory:
    """Accept a class, a partial, or a ``{"class_path", "init_args"}`` mapping (as stored in
    hparams)."""
    if not isinstance(interface, Mapping):
        return interface
    module_name, _, name = str(interface.get("class_path")).rpartition(".")
    cls = getattr(importlib.import_module(module_name), name, None) if module_name else None
    if not (isinstance(cls, type) and issubclass(cls, InputInterface)):
        raise ValueError(
            f"interface spec {interface!r} needs the dotted class_path of an InputInterface "
            "subclass"
        )
    return partial(cls, **dict(interface.get("init_args") or {}))
