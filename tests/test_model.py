"""Decoder: shapes, causality, RoPE, equality with Hugging Face Llama, FLOPs."""

import math
from dataclasses import asdict

import pytest
import torch

from fixed_embed.interfaces import BinaryCodeInput, GF2CodeInput, LearnedInput
from fixed_embed.model.decoder import Decoder, DecoderConfig, rotate

CONFIG = DecoderConfig(
    vocab_size=256, d_model=32, n_layers=2, n_heads=4, ffn_dim=64, max_seq_len=16
)
INTERFACES = [LearnedInput, BinaryCodeInput, GF2CodeInput]


def build(cls, config=CONFIG):
    torch.manual_seed(0)
    return Decoder(config, cls(config.vocab_size, config.d_model))


@pytest.mark.parametrize("cls", INTERFACES)
def test_forward_backward(cls):
    model = build(cls)
    ids = torch.randint(0, 256, (3, 16))
    logits = model(ids)
    assert logits.shape == (3, 16, 256)
    loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), ids.roll(-1, 1).flatten())
    loss.backward()
    assert math.isfinite(loss.item())
    trainable = [p for p in model.parameters() if p.requires_grad]
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in trainable)


@pytest.mark.parametrize("cls", INTERFACES)
def test_causal(cls):
    model = build(cls).eval()
    ids = torch.randint(0, 256, (2, 12))
    changed = ids.clone()
    changed[:, 7] = (changed[:, 7] + 1) % 256
    a, b = model(ids), model(changed)
    assert torch.allclose(a[:, :7], b[:, :7], atol=1e-6)
    assert not torch.allclose(a[:, 7], b[:, 7])


def test_rope_matches_direct_rotation_formula():
    h, t, theta = 8, 5, 10000.0  # CONFIG's head dim and rope_theta
    x = torch.randn(1, 1, t, h, dtype=torch.float64)
    got = rotate(x, *build(BinaryCodeInput).rope(torch.zeros(1, t, dtype=torch.long)))
    expected = torch.empty_like(x)
    for p in range(t):
        for i in range(h // 2):
            angle = p * theta ** (-2 * i / h)
            c, s = math.cos(angle), math.sin(angle)
            x1, x2 = x[0, 0, p, i], x[0, 0, p, i + h // 2]
            expected[0, 0, p, i] = x1 * c - x2 * s
            expected[0, 0, p, i + h // 2] = x2 * c + x1 * s
    assert torch.allclose(got, expected, atol=1e-12)


def test_rope_scores_depend_only_on_relative_position():
    rope = build(BinaryCodeInput).rope(torch.zeros(1, 32, dtype=torch.long))
    q, k = torch.randn(8, dtype=torch.float64), torch.randn(8, dtype=torch.float64)
    qs = rotate(q.expand(1, 1, 32, 8), *rope)[0, 0]
    ks = rotate(k.expand(1, 1, 32, 8), *rope)[0, 0]
    assert torch.allclose(qs[10] @ ks[7], qs[25] @ ks[22])


def test_parameter_count_formula():
    model = build(BinaryCodeInput)
    d, f, v, n = 32, 64, 256, 2
    assert (
        sum(p.numel() for p in model.parameters())
        == n * (4 * d * d + 3 * d * f + 2 * d) + d + v * d
    )


def test_flops_match_6n_plus_attention_formula():
    config = DecoderConfig(
        vocab_size=512, d_model=64, n_layers=3, n_heads=4, ffn_dim=128, max_seq_len=32
    )
    for cls in INTERFACES:
        model = build(cls, config)
        matmul_params = sum(
            p.numel() for n, p in model.named_parameters() if n.endswith("proj.weight")
        )
        matmul_params += config.vocab_size * config.d_model  # head
        expected = 6 * matmul_params + 12 * config.n_layers * config.d_model * config.max_seq_len
        assert model.flops_per_token() == expected  # a learned table costs no FLOPs either
        assert model.flops_per_token(8) == expected - 12 * 3 * 64 * 24


def test_head_flops_are_reported_once_tied_or_not():
    from fixed_embed.model.accounting import module_costs

    for tie in (False, True):
        config = DecoderConfig(**{**asdict(CONFIG), "tie_embeddings": tie})
        model = Decoder(config, LearnedInput(256, 32))
        rows = {row.name: row.flops_per_token for row in module_costs(model)}
        # tied: under the interface that owns the table
        assert rows["head"] == (0 if tie else 6 * 256 * 32)
        assert rows["interface"] == (6 * 256 * 32 if tie else 0)
        assert sum(rows.values()) == model.flops_per_token()


def test_tying_needs_a_learned_table():
    tied = DecoderConfig(**{**asdict(CONFIG), "tie_embeddings": True})
    model = Decoder(tied, LearnedInput(256, 32))
    assert model.head.weight is model.interface.weight
    with pytest.raises(
        ValueError,
        match="tie_embeddings=True needs a LearnedInput table to tie to, got BinaryCodeInput",
    ):
        Decoder(tied, BinaryCodeInput(256, 32))


def test_config_errors():
    with pytest.raises(ValueError, match=r"d_model \(30\) must be divisible by n_heads \(4\)"):
        DecoderConfig(d_model=30, n_heads=4)
    with pytest.raises(ValueError, match=r"interface is built for vocab_size=100"):
        Decoder(CONFIG, BinaryCodeInput(100, 32))
    with pytest.raises(ValueError, match="sequence length 17 exceeds max_seq_len 16"):
        build(BinaryCodeInput)(torch.zeros(1, 17, dtype=torch.long))


def test_meta_device_construction_then_materialise():
    with torch.device("meta"):
        model = Decoder(CONFIG, GF2CodeInput(256, 32))
    model.to_empty(device="cpu")
    model.init_weights()
    reference = GF2CodeInput(256, 32)
    ids = torch.arange(256).view(1, -1)
    assert torch.equal(model.interface(ids), reference(ids))
    assert torch.isfinite(model(ids[:, :16])).all()


@pytest.mark.parametrize("cls", INTERFACES)
def test_matches_hugging_face_llama(cls):
    transformers = pytest.importorskip("transformers")
    config = DecoderConfig(
        vocab_size=256, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=64, max_seq_len=16
    )
    model = build(cls, config).eval()
    hf_config = transformers.LlamaConfig(
        vocab_size=256,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=16,
        rms_norm_eps=config.norm_eps,
        rope_theta=config.rope_theta,
        tie_word_embeddings=False,
        attention_bias=False,
        mlp_bias=False,
    )
    hf = transformers.LlamaForCausalLM(hf_config).eval()
    state = {
        "model.embed_tokens.weight": model.interface.table(),
        "model.norm.weight": model.norm.weight,
        "lm_head.weight": model.head.weight,
    }
    for i, layer in enumerate(model.layers):
        p = f"model.layers.{i}."
        state |= {
            p + "input_layernorm.weight": layer.attn_norm.weight,
            p + "post_attention_layernorm.weight": layer.mlp_norm.weight,
        }
        for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
            state[p + f"self_attn.{name}.weight"] = getattr(layer.attn, name).weight
        for name in ("gate_proj", "up_proj", "down_proj"):
            state[p + f"mlp.{name}.weight"] = getattr(layer.mlp, name).weight
    missing, unexpected = hf.load_state_dict(state, strict=False)
    assert not unexpected and all("rotary" in k for k in missing)
    ids = torch.randint(0, 256, (2, 16))
    with torch.no_grad():
        assert torch.allclose(hf(ids).logits, model(ids), atol=1e-5)
