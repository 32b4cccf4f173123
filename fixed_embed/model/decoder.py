"""The paper's Llama-style decoder, fed by any input interface (our choices: docs/design.md,
"The recipe"); it never assumes the input is non-zero, and RoPE is in the Hugging Face layout so
an export to ``LlamaForCausalLM`` is exact."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from fixed_embed.config import PositiveFinite, PositiveInt, domain
from fixed_embed.errors import ConfigError
from fixed_embed.interfaces import InputInterface, LearnedInput
from fixed_embed.model.loss import linear_cross_entropy

#: 2**24: past any model's sizes, and every weight's bytes well inside the int64 torch counts them
#: in.
VocabSize = domain("an integer in [2, 2**24]", int, (">=", 2), ("<=", 2**24))
Dim = domain("an integer in [1, 2**24]", int, (">=", 1), ("<=", 2**24))
# a block takes ~3 ms to build on meta
Depth = domain("an integer in [1, 1024]", int, (">=", 1), ("<=", 1024))


@dataclass
class DecoderConfig:
    """The backbone's schema. Paper: V 49,152, d 2048, 24 layers, 32 heads, SwiGLU 8192, ctx
    2048."""

    vocab_size: VocabSize = 49152
    d_model: Dim = 2048
    n_layers: Depth = 24
    n_heads: PositiveInt = 32
    n_kv_heads: PositiveInt | None = None
    ffn_dim: Dim = 8192
    max_seq_len: Dim = 2048
    rope_theta: PositiveFinite = 10000.0
    norm_eps: PositiveFinite = 1e-5
    init_std: PositiveFinite = 0.02
    tie_embeddings: bool = False

    def __post_init__(
        self,
    ) -> None:  # ConfigError: fit and params report it in one line before any work
        d, heads, kv = self.d_model, self.n_heads, self.n_kv_heads or 1
        if heads % self.kv_heads:
            raise ConfigError(
                f"model.decoder.n_heads {heads} is not a multiple of model.decoder.n_kv_heads "
                f"{kv}: "
                f"set model.decoder.n_kv_heads {math.gcd(heads, kv)}"
            )
        if (
            d % (2 * heads)
            # whole heads of even dim (RoPE rotates pairs): fewer heads if any divide, else a wider
            # d
        ):
            fewer = max(
                (h for h in range(1, min(heads, d // 2) + 1) if d % (2 * h) == 0 and h % kv == 0),
                default=0,
            )
            fix = f"n_heads {fewer}" if fewer else f"d_model {-(-d // (2 * heads)) * 2 * heads}"
            raise ConfigError(
                f"model.decoder.d_model ({d}) must be divisible by n_heads ({heads}) into heads of "
                "even "
                f"dim (RoPE): set model.decoder.{fix}"
            )

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    @property
    def kv_heads(self) -> int:
        return self.n_kv_heads or self.n_heads


class RMSNorm(nn.Module):
    """x / sqrt(mean(x^2) + eps) * gain, computed in float32, cast back to the input dtype."""

    def __init__(self, dim: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def reset_parameters(self) -> None:
        nn.init.ones_(self.weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        normed = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return (normed * self.weight.float()).to(x.dtype)


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """RoPE: rotate ``x[B, H, T, h]`` by the tables of :meth:`Decoder.rope`, in float32 (as
    torchtitan): a bf16 ``x`` is rounded once, at the end."""
    x1, x2 = x.float().chunk(2, dim=-1)
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).to(x.dtype)


class Attention(nn.Module):
    def __init__(self, config: DecoderConfig) -> None:
        super().__init__()
        d, h, kv = config.d_model, config.head_dim, config.kv_heads
        self.head_dim = h
        self.q_proj = nn.Linear(d, config.n_heads * h, bias=False)
        self.k_proj = nn.Linear(d, kv * h, bias=False)
        self.v_proj = nn.Linear(d, kv * h, bias=False)
        self.o_proj = nn.Linear(config.n_heads * h, d, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        q, k, v = (  # [B, heads, T, h]
            proj(x).view(b, t, -1, self.head_dim).transpose(1, 2)
            for proj in (self.q_proj, self.k_proj, self.v_proj)
        )
        q, k = rotate(q, cos, sin), rotate(k, cos, sin)
        y = F.scaled_dot_product_attention(
            q, k, v, is_causal=True, enable_gqa=k.shape[1] != q.shape[1]
        )
        return self.o_proj(y.transpose(1, 2).reshape(b, t, -1))


class SwiGLU(nn.Module):
    def __init__(self, config: DecoderConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(config.d_model, config.ffn_dim, bias=False)
        self.up_proj = nn.Linear(config.d_model, config.ffn_dim, bias=False)
        self.down_proj = nn.Linear(config.ffn_dim, config.d_model, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Block(nn.Module):
    """Pre-norm transformer block: x + attn(norm(x)); x + mlp(norm(x))."""

    def __init__(self, config: DecoderConfig) -> None:
        super().__init__()
        self.attn_norm = RMSNorm(config.d_model, config.norm_eps)
        self.attn = Attention(config)
        self.mlp_norm = RMSNorm(config.d_model, config.norm_eps)
        self.mlp = SwiGLU(config)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.attn_norm(x), cos, sin)
        return x + self.mlp(self.mlp_norm(x))


class OutputHead(nn.Linear):
    """``head(h)``: logits; ``head(h, targets, chunk_tokens)``: the loss, in ``forward`` so
    FSDP2 gathers the weight."""

    def forward(
        self, x: torch.Tensor, targets: torch.Tensor | None = None, chunk_tokens: int | None = None
    ) -> torch.Tensor:
        if targets is None:
            return super().forward(x)
        return linear_cross_entropy(x, self.weight, targets, chunk_tokens)


class Decoder(nn.Module):
    """interface -> n_layers pre-norm blocks -> RMSNorm -> head: ``forward(ids) -> logits``."""

    def __init__(self, config: DecoderConfig, interface: InputInterface) -> None:
        super().__init__()
        if (interface.vocab_size, interface.d_model) != (config.vocab_size, config.d_model):
            raise ValueError(
                f"interface is built for vocab_size={interface.vocab_size}, "
                f"d_model={interface.d_model} "
                f"but the decoder has vocab_size={config.vocab_size}, d_model={config.d_model}"
            )
        if config.tie_embeddings and not isinstance(interface, LearnedInput):
            raise ConfigError(
                f"tie_embeddings=True needs a LearnedInput table to tie to, got "
                f"{type(interface).__name__}: set model.decoder.tie_embeddings false"
            )
        self.config, self.interface = config, interface
        self.layers = nn.ModuleList(Block(config) for _ in range(config.n_layers))
        self.norm = RMSNorm(config.d_model, config.norm_eps)
        self.head = OutputHead(config.d_model, config.vocab_size, bias=False)
        # Set by fixed_embed.distributed.parallel: recompute each block in backward (names and
        # weights unchanged).
        self.activation_checkpointing = False
        self.init_weights()
        if config.tie_embeddings:
            self.head.weight = interface.weight

    @torch.no_grad()
    def init_weights(self) -> None:
        """Initialise every parameter and buffer (also used after meta-device construction)."""
        std = self.config.init_std
        residual_std = std / math.sqrt(2 * self.config.n_layers)
        for name, module in self.named_modules():
            if isinstance(module, nn.Linear):
                residual_out = name.endswith(("o_proj", "down_proj"))
                nn.init.normal_(module.weight, mean=0.0, std=residual_std if residual_out else std)
            elif module is not self and hasattr(module, "reset_parameters"):
                module.reset_parameters()

    def forward(
        self,
        ids: torch.Tensor,
        targets: torch.Tensor | None = None,
        chunk_tokens: int | None = None,
    ) -> torch.Tensor:
        """Logits ``[B, T, V]``; given ``targets[B, T]``, the mean cross-entropy instead,
        ``chunk_tokens`` rows at a time (0/None: unchunked), in forward for FSDP2's hooks."""
        return self.head(self.hidden(ids), targets, chunk_tokens)

    def hidden(self, ids: torch.Tensor) -> torch.Tensor:
        """The final-normed hidden states ``[B, T, d]``."""
        x, rope = self.embed(ids), self.rope(ids)
        for layer in self.layers:
            if self.activation_checkpointing and torch.is_grad_enabled():
                x = checkpoint(layer, x, *rope, use_reentrant=False)
            else:
                x = layer(x, *rope)
        return self.norm(x)

    def rope(self, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """RoPE's fp32 cos and sin ``[T, h / 2]`` for ``ids[B, T]``, from float64 angles: position
        p turns the pair (x_i, x_{i+h/2}) by p theta^(-2i/h). Made per forward: no buffer to
        rebuild after meta-device init or to keep in fp32 under bf16-true."""
        h, device = self.config.head_dim, ids.device
        inv_freq = 1.0 / (
            self.config.rope_theta
            ** (torch.arange(0, h, 2, dtype=torch.float64, device=device) / h)
        )
        angles = torch.outer(
            torch.arange(ids.shape[1], dtype=torch.float64, device=device), inv_freq
        )
        return angles.cos().float(), angles.sin().float()

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        """The interface's output for ``ids[B, T]``, after checking they fit the context."""
        if ids.shape[1] > self.config.max_seq_len:
            raise ValueError(
                f"sequence length {ids.shape[1]} exceeds max_seq_len {self.config.max_seq_len}"
            )
        return self.interface(ids)

    def hidden_states(self, ids: torch.Tensor) -> list[torch.Tensor]:
        """The residual stream after the interface (index 0) and after each block (index i + 1)."""
        states, rope = [self.embed(ids)], self.rope(ids)
        for layer in self.layers:
            states.append(layer(states[-1], *rope))
        return states

    @torch.no_grad()
    def generate(
        self,
        ids: torch.Tensor,
        new_tokens: int,
        temperature: float = 0.0,
        top_k: int | None = None,
        vocab: int | None = None,
        generator: torch.Generator | None = None,
    ) -> torch.Tensor:
        """``ids[B, T]`` and ``new_tokens`` more, each from the logits after the last
        ``max_seq_len`` ids (no cache): the likeliest at ``temperature`` 0, else drawn from the
        ``top_k`` likeliest of the first ``vocab`` ids."""
        for _ in range(new_tokens):
            logits = self.head(self.hidden(ids[:, -self.config.max_seq_len :])[:, -1])[
                :, :vocab
            ].float()
            if top_k is not None:
                logits[
                    logits < logits.topk(min(top_k, logits.shape[-1])).values[:, -1:]
                ] = -torch.inf
            if temperature:
                pick = (logits / temperature).softmax(-1).multinomial(1, generator=generator)
            else:
                pick = logits.argmax(-1, keepdim=True)
            ids = torch.cat([ids, pick], dim=1)
        return ids

    def flops_per_token(self, seq_len: int | None = None) -> int:
        """Training FLOPs per token at context ``seq_len`` (default: max_seq_len): 6 (2 forward +
        4 backward) per weight of every matmul (the head's also when tied: the matmul still runs),
        and per block 12 d T for the attention scores (QK^T and AV); the input interface does
        none."""
        matmul = sum(m.weight.numel() for m in self.modules() if isinstance(m, nn.Linear))
        config = self.config
        return 6 * matmul + 12 * config.d_model * (seq_len or config.max_seq_len) * config.n_layers
