"""The interface contract: ``forward(ids[B, T]) -> x[B, T, d_model]`` (a lookup or a bit code:
no FLOPs), and how to rebuild it."""

from __future__ import annotations

import inspect
import sys
from typing import Any

import torch
from torch import nn
from torch._subclasses.fake_tensor import is_fake

from fixed_embed.interfaces import codes

_PACKAGE = __name__.rpartition(".")[0]  # fixed_embed.interfaces


class InputInterface(nn.Module):
    """Subclasses take ``vocab_size`` and ``d_model`` first: any is built from a YAML
    ``class_path`` + ``init_args``."""

    #: True when the interface has no trainable state (its output is a fixed function of the id).
    fixed: bool = False
    #: The persistent buffer that fixes the code, if any: a checkpoint holding another than
    #: ``code_from_options()`` gives (it, and those options in words) is refused.
    code_buffer: str | None = None

    def __init__(self, vocab_size: int, d_model: int) -> None:
        super().__init__()  # both checked by DecoderConfig's types
        self.vocab_size, self.d_model = vocab_size, d_model

    @classmethod
    def least_d_model(cls, vocab_size: int, code_width: int | None = None, **options: Any) -> int:
        """The least d_model it takes: a ``code_width`` option (K; None: ceil(log2 V)) tiles a
        K-bit code over it."""
        return (
            (code_width or codes.code_width(vocab_size))
            if "code_width" in inspect.signature(cls).parameters
            else 1
        )

    def expected_norm(self, ids: torch.Tensor) -> torch.Tensor:
        """The L2 norm each id's output vector should have (shape of ``ids``)."""
        raise NotImplementedError

    @torch.no_grad()
    def table(self) -> torch.Tensor:
        """The V x d matrix this interface computes, materialised (for export)."""
        device = next(self.buffers(), next(self.parameters(), torch.empty(0))).device
        return self(torch.arange(self.vocab_size, device=device))

    def spec(self) -> dict[str, Any]:
        """``{"class_path", "init_args"}`` that rebuilds this interface (vocab_size and d_model
        excluded): the signature read back, so every ``__init__`` option must be kept as an
        attribute of the same name."""
        cls = type(self)
        names = list(inspect.signature(cls.__init__).parameters)[3:]  # self, vocab_size, d_model
        return {"class_path": _class_path(cls), "init_args": {n: getattr(self, n) for n in names}}

    def check_ids(self, ids: torch.Tensor) -> None:
        """Reject non-integer or out-of-vocabulary ids instead of silently encoding them."""
        if ids.dtype.is_floating_point or ids.dtype.is_complex or ids.dtype == torch.bool:
            raise TypeError(f"token ids must be an integer tensor, got dtype {ids.dtype}")
        # shapes only: no values to check
        if ids.device.type == "meta" or ids.numel() == 0 or is_fake(ids):
            return
        if ids.device.type == "cuda":
            # No host sync on the hot path: the check fails asynchronously on the device.
            torch._assert_async(((ids >= 0) & (ids < self.vocab_size)).all())
            return
        lo, hi = int(ids.min()), int(ids.max())
        if lo < 0 or hi >= self.vocab_size:
            raise ValueError(
                f"token ids must lie in [0, {self.vocab_size - 1}], got min {lo} and max {hi}"
            )

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs) -> None:
        stored = state_dict.get(prefix + self.code_buffer) if self.code_buffer else None
        if stored is not None and stored.device.type != "meta":
            expected, options = self.code_from_options()
            stored = stored.cpu()
            # A model cast to 16 bits (bf16-true) casts its float buffers too: compare to the
            # precision stored.
            rtol = max(1e-9, torch.finfo(stored.dtype).eps) if stored.is_floating_point() else 1e-9
            if not torch.allclose(stored.double(), expected.cpu().double(), rtol=rtol, atol=0):
                raise ValueError(
                    f"the checkpoint's {self.code_buffer} differs from the one {options} gives"
                )
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)


def _class_path(cls: type) -> str:
    # Checkpoints and saved configs store this and a resume compares it: name exported classes by
    # the package.
    if getattr(sys.modules.get(_PACKAGE), cls.__qualname__, None) is cls:
        return f"{_PACKAGE}.{cls.__qualname__}"
    return f"{cls.__module__}.{cls.__qualname__}"
