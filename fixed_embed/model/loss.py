"""The head and cross-entropy fused over chunks of rows (as Liger-Kernel's), never holding the
``[N, V]`` fp32 logits: each chunk's become ``(softmax - onehot) / N`` in place, multiplied out
into the gradients backward only scales."""

from __future__ import annotations

import torch
import torch.nn.functional as F

#: ``LanguageModel``'s default ``loss_chunk_tokens``: an fp32 [4096, 49,152] buffer is 0.75 GiB;
#: 4,096 rows fill a GPU.
DEFAULT_LOSS_CHUNK_TOKENS = 4096


def linear_cross_entropy(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    chunk_tokens: int | None = None,
) -> torch.Tensor:
    """Mean cross-entropy of ``hidden[..., d] @ weight[V, d].T`` against ``targets[...]`` (fp32
    scalar)."""
    if chunk_tokens is not None and chunk_tokens < 0:
        raise ValueError(f"chunk_tokens must be >= 0 (0 or None: unchunked), got {chunk_tokens}")
    h, t = hidden.reshape(-1, hidden.shape[-1]), targets.reshape(-1)
    if h.shape[0] != t.shape[0]:
        raise ValueError(f"{h.shape[0]} hidden states but {t.shape[0]} targets")
    if not chunk_tokens:
        return F.cross_entropy(F.linear(h, weight).float(), t)
    device = h.device.type
    # what F.linear would compute in; the casts are differentiable
    if torch.is_autocast_enabled(device):
        dtype = torch.get_autocast_dtype(device)
        h, weight = h.to(dtype), weight.to(dtype)
    else:
        h = h.to(weight.dtype)
    with torch.autocast(device, enabled=False):
        if torch.is_grad_enabled() and (h.requires_grad or weight.requires_grad):
            return _LinearCrossEntropy.apply(h, weight, t, chunk_tokens)
        return _chunked(h, weight, t, chunk_tokens, False, False)[0]


class _LinearCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, h, weight, targets, chunk_tokens):
        loss, grad_h, grad_w = _chunked(h, weight, targets, chunk_tokens, *ctx.needs_input_grad[:2])
        ctx.grads = (grad_h, grad_w)
        return loss

    @staticmethod
    def backward(ctx, grad_loss):
        grad_h, grad_w = ctx.grads
        grad_h = None if grad_h is None else grad_h * grad_loss.to(grad_h.dtype)
        grad_w = None if grad_w is None else grad_w * grad_loss
        return grad_h, grad_w, None, None


@torch.no_grad()
def _chunked(h, weight, targets, chunk_tokens, need_h, need_w):
    """Loss (and gradients of the mean loss wrt ``h`` and ``weight``), ``chunk_tokens`` rows at
    a time."""
    n = h.shape[0]
    total = torch.zeros((), dtype=torch.float32, device=h.device)
    grad_h = torch.empty_like(h) if need_h else None
    grad_w = (
        torch.zeros(weight.shape, dtype=torch.float32, device=weight.device) if need_w else None
    )
    for start in range(0, n, chunk_tokens):
        rows, t = h[start : start + chunk_tokens], targets[start : start + chunk_tokens, None]
        z = F.linear(rows, weight).float()  # fp32 [c, V]; the compute-dtype logits are freed here
        target_logit = z.gather(1, t)
        peak = z.amax(1, keepdim=True)
        z.sub_(peak).exp_()  # in place: no second [c, V] buffer
        sums = z.sum(1, keepdim=True)
        total += (peak + sums.log() - target_logit).sum()
        if not (need_h or need_w):
            continue
        z.div_(sums)  # softmax
        z.scatter_add_(1, t, torch.full_like(target_logit, -1.0))  # - onehot
        z.mul_(1.0 / n)  # d(mean loss) / d(logits), as F.cross_entropy's backward computes it
        g = z.to(weight.dtype)
        if need_h:
            torch.mm(g, weight, out=grad_h[start : start + chunk_tokens])
        if need_w:
            if g.dtype == torch.float32:
                grad_w.addmm_(g.t(), rows)
            else:
                grad_w += g.t() @ rows
        del z, g
    return total / n, grad_h, None if grad_w is None else grad_w.to(weight.dtype)
