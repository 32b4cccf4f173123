"""Input interfaces: codes, tiling, invertibility, costs, errors, token 0."""

import importlib
import math
import re
from pathlib import Path

import pytest
import torch

import fixed_embed.interfaces as interfaces
from fixed_embed.interfaces import BinaryCodeInput, GF2CodeInput, InputInterface, LearnedInput
from fixed_embed.interfaces.codes import bits_of, matrix_from_rows, random_invertible_gf2
from fixed_embed.model.accounting import parameter_count
from fixed_embed.model.decoder import Decoder, DecoderConfig

V, D = 49152, 2048


def test_binary_code_of_known_ids_and_tiling():
    iface = BinaryCodeInput(V, D)
    assert iface.code_width == 16
    ids = torch.tensor([[0, 1, 2, 255, 49151]])
    out = iface(ids)
    assert out.shape == (1, 5, D) and out.dtype == torch.float32
    bits = iface.bits(ids)
    assert bits[0, 4].tolist() == [1] * 14 + [0, 1]
    # element j is bit j mod K: 128 identical copies
    assert torch.equal(out.view(1, 5, 128, 16), bits.float().unsqueeze(2).expand(1, 5, 128, 16))


def test_tiling_truncates_last_copy_when_d_not_multiple_of_k():
    iface = BinaryCodeInput(8192, 30)  # K = 13: copies 13 + 13 + 4
    ids = torch.tensor([[5, 8191, 4096]])
    out = iface(ids)
    bits = iface.bits(ids).float()
    expected = torch.cat([bits, bits, bits[..., :4]], dim=-1)
    assert torch.equal(out, expected)
    assert torch.allclose(iface.expected_norm(ids), out.norm(dim=-1))


def test_binary_has_no_table_and_no_trainable_state():
    iface = BinaryCodeInput(V, D)
    assert not any(p.requires_grad for p in iface.parameters())
    assert all(t.numel() < V for t in iface.state_dict().values())
    assert iface.fixed


def test_gf2_codes_and_vectors_are_injective():
    iface = GF2CodeInput(V, D, code_seed=12345)
    ids = torch.arange(V)
    assert torch.unique(iface.bits(ids), dim=0).shape[0] == V
    vectors = iface(ids.unsqueeze(0))[0]
    assert torch.unique(vectors, dim=0).shape[0] == V
    assert not any(p.requires_grad for p in iface.parameters())
    assert all(t.numel() <= 16 * 16 for t in iface.state_dict().values())


def test_gf2_code_is_matrix_times_bits_plus_offset():
    offset = 0b1010_0000_0000_0011
    iface = GF2CodeInput(V, D, code_seed=3, offset=offset)
    ids = torch.randint(0, V, (64,))
    a = iface.code_matrix.long()
    expected = (bits_of(ids, 16) @ a.T) % 2 ^ bits_of(torch.tensor(offset), 16)
    assert torch.equal(iface.bits(ids), expected)


def test_gf2_paper_seed_matrix_and_explicit_matrix():
    iface = GF2CodeInput(V, D)  # the paper's default seed
    assert iface.code_matrix.shape == (16, 16)
    rows = random_invertible_gf2(16, 12345)
    explicit = GF2CodeInput(V, D, matrix=iface.code_matrix.tolist())
    ids = torch.arange(0, V, 97)
    assert torch.equal(explicit.bits(ids), iface.bits(ids))
    assert [sum(int(v) << c for c, v in enumerate(r)) for r in iface.code_matrix.tolist()] == rows


def test_gf2_checkpoints_hold_only_the_matrix_and_refuse_another():
    iface = GF2CodeInput(300, 16, code_seed=5)
    # the key and K x K form existing checkpoints (single-file and sharded) hold
    assert list(iface.state_dict()) == ["code_matrix"]
    saved = {"code_matrix": matrix_from_rows(random_invertible_gf2(9, 5), 9)}
    GF2CodeInput(300, 16, code_seed=5).load_state_dict(saved)
    with pytest.raises(ValueError, match="code_matrix differs from the one code_seed=6 gives"):
        GF2CodeInput(300, 16, code_seed=6).load_state_dict(saved)
    explicit = GF2CodeInput(300, 16, matrix=torch.eye(9, dtype=torch.long).tolist())
    with pytest.raises(
        ValueError, match="code_matrix differs from the one the explicit matrix gives"
    ):
        explicit.load_state_dict(saved)
    # the matrix encode applies is derived from the options
    assert iface.code_matrix.tolist() == saved["code_matrix"].tolist()
    assert torch.unique(iface.encode(torch.arange(300))).numel() == 300


def interface_classes() -> list[type]:
    """Every InputInterface subclass the package defines, in whichever of its files."""
    found, todo = [], [InputInterface]
    while todo:
        for cls in todo.pop().__subclasses__():
            if cls.__module__.startswith("fixed_embed.interfaces") and cls not in found:
                found.append(cls)
                todo.append(cls)
    return found


def test_every_interface_is_built_by_its_config_name_and_keeps_the_contract():
    classes = interface_classes()
    assert {BinaryCodeInput, GF2CodeInput, LearnedInput} <= set(classes)
    ids = torch.tensor([[0, 1, 299, 7]])
    for cls in classes:
        original = cls(300, 16)
        spec = original.spec()
        # configs and checkpoints name the package, whichever file defines the class
        assert spec["class_path"] == f"fixed_embed.interfaces.{cls.__name__}"
        module, _, name = spec["class_path"].rpartition(".")
        built = getattr(importlib.import_module(module), name)(300, 16, **spec["init_args"])
        out = built(ids)
        assert out.shape == (1, 4, 16) and out.dtype == torch.float32, cls
        assert torch.allclose(built.expected_norm(ids), out.norm(dim=-1), atol=1e-6), cls
        assert torch.allclose(built.table()[ids], out), cls
        assert built.fixed == (parameter_count(built, trainable=True) == 0), cls
        if built.fixed:  # the options alone define a fixed code: the spec rebuilds the same one
            assert torch.equal(original(ids), out), cls
        with pytest.raises(ValueError, match="token ids must lie"):
            built(torch.tensor([[300]]))
    # every class path the experiments and docs name still resolves
    root = Path(__file__).resolve().parents[1]
    texts = [
        p.read_text() for folder in ("experiments", "docs") for p in (root / folder).rglob("*.y*ml")
    ]
    named = set(re.findall(r"fixed_embed\.interfaces\.(\w+)", "\n".join(texts)))
    assert named and all(isinstance(getattr(interfaces, name, None), type) for name in named)


def test_linear_gf2_keeps_token_zero_at_zero_affine_moves_it():
    assert GF2CodeInput(V, D)(torch.zeros(1, 1, dtype=torch.long)).abs().sum() == 0
    assert GF2CodeInput(V, D, offset=1)(torch.zeros(1, 1, dtype=torch.long)).abs().sum() > 0


def test_learned_is_trainable_table():
    iface = LearnedInput(V, 64, init_std=0.5)
    assert parameter_count(iface, trainable=True) == V * 64
    assert abs(iface.weight.std().item() - 0.5) < 0.01
    ids = torch.tensor([[3, 4]])
    assert torch.equal(iface(ids)[0, 1], iface.weight[4])
    assert torch.allclose(iface.expected_norm(ids), iface(ids).norm(dim=-1))


@pytest.mark.parametrize("cls", [BinaryCodeInput, GF2CodeInput])
def test_expected_norm_equals_actual_for_codes(cls):
    iface = cls(V, D)
    ids = torch.randint(0, V, (4, 32))
    assert torch.equal(iface.expected_norm(ids), iface(ids).norm(dim=-1))
    popcount = iface.bits(ids).sum(-1)
    assert torch.allclose(iface.expected_norm(ids), (popcount * 128).float().sqrt())


def test_spec_round_trips():
    for iface in (
        LearnedInput(300, 16, init_std=0.1),
        BinaryCodeInput(300, 16, code_width=10),
        GF2CodeInput(300, 16, code_seed=9, offset=[1] + [0] * 8),
        GF2CodeInput(4, 16, matrix=[[1, 1], [0, 1]]),
    ):
        spec = iface.spec()
        module, _, name = spec["class_path"].rpartition(".")
        rebuilt = getattr(__import__(module, fromlist=[name]), name)(
            300 if iface.vocab_size == 300 else 4, 16, **spec["init_args"]
        )
        ids = torch.arange(iface.vocab_size).view(1, -1)
        if iface.fixed:
            assert torch.equal(rebuilt(ids), iface(ids))
        assert rebuilt.spec() == spec


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (
            lambda: BinaryCodeInput(49152, 2048, code_width=15),
            r"vocab_size 49152 needs 16 bits but code_width=15",
        ),
        (lambda: BinaryCodeInput(49152, 8), r"d_model \(8\) must be >= the code width K = 16"),
        (lambda: GF2CodeInput(4, 8, matrix=[[1, 1], [1, 1]]), r"singular \(rank 1 < 2\)"),
        (lambda: GF2CodeInput(4, 8, matrix=[[1, 0, 0], [0, 1, 0], [0, 0, 1]]), r"K x K = 2 x 2"),
        (
            lambda: GF2CodeInput(49152, 2048, offset=[1, 0, 1]),
            r"offset must have K = 16 bits, got 3",
        ),
        (
            lambda: GF2CodeInput(49152, 2048, offset=2**16),
            r"16-bit mask in \[0, 65535\], got 65536",
        ),
    ],
)
def test_errors_name_the_numbers(build, message):
    with pytest.raises(ValueError, match=message):
        build()


@pytest.mark.parametrize("cls", [LearnedInput, BinaryCodeInput, GF2CodeInput])
def test_out_of_vocab_and_float_ids_rejected(cls):
    iface = cls(100, 16)
    with pytest.raises(ValueError, match=r"\[0, 99\], got min 0 and max 100"):
        iface(torch.tensor([[0, 100]]))
    with pytest.raises(TypeError, match="integer tensor"):
        iface(torch.tensor([[0.0, 1.0]]))


def _tiny(interface_cls, **kw):
    config = DecoderConfig(
        vocab_size=256, d_model=32, n_layers=2, n_heads=4, ffn_dim=64, max_seq_len=16
    )
    return Decoder(config, interface_cls(256, 32, **kw))


@pytest.mark.parametrize("cls", [BinaryCodeInput, GF2CodeInput])
def test_fixed_interfaces_receive_no_gradient(cls):
    model = _tiny(cls)
    ids = torch.randint(0, 256, (2, 8))
    model(ids).sum().backward()
    assert list(model.interface.parameters()) == []
    assert all(p.grad is not None for p in model.parameters())


@pytest.mark.parametrize("cls", [LearnedInput, BinaryCodeInput, GF2CodeInput])
def test_sequence_of_token_zero_gives_finite_logits_and_gradients(cls):
    torch.manual_seed(0)
    model = _tiny(cls)
    ids = torch.zeros(2, 16, dtype=torch.long)
    logits = model(ids)
    assert torch.isfinite(logits).all()
    torch.nn.functional.cross_entropy(logits.flatten(0, 1), ids.flatten()).backward()
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    assert grads and all(torch.isfinite(g).all() for g in grads)
    if cls is not LearnedInput:
        # all-zero input stays zero through bias-free blocks: uniform logits, by design
        assert torch.allclose(logits, torch.zeros_like(logits))
        assert math.isclose(
            torch.nn.functional.cross_entropy(logits.flatten(0, 1), ids.flatten()).item(),
            math.log(256),
            rel_tol=1e-6,
        )
