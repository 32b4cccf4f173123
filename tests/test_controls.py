"""The controls beyond the paper: each new interface keeps the interface contracts and does what
it claims."""

import math

import pytest
import torch

from fixed_embed.interfaces import (
    BinaryCodeInput,
    GF2CodeInput,
    LowRankLearnedInput,
    NormMatchedLearnedInput,
    PermutedCodeInput,
    RandomCodeInput,
    binary_code_norm,
)
from fixed_embed.interfaces.codes import bits_of
from fixed_embed.model.accounting import parameter_count
from fixed_embed.train.module import _interface_factory
from tests.helpers import fit_tiny

V, D = 300, 40  # K = 9; d is not a multiple of K, so the truncated last copy is exercised
CONTROLS = [
    (BinaryCodeInput, {"bipolar": True}, 0),
    (GF2CodeInput, {"bipolar": True, "code_seed": 7}, 0),
    (PermutedCodeInput, {"code_seed": 3}, 0),
    (RandomCodeInput, {"code_seed": 1}, 0),
    (RandomCodeInput, {"code_seed": 1, "distribution": "uniform", "norm_match": True}, 0),
    (RandomCodeInput, {"code_seed": 2, "code_width": D}, 0),
    (LowRankLearnedInput, {}, V * 9),
    (NormMatchedLearnedInput, {}, V * D),
]
IDS = lambda: torch.arange(V)  # noqa: E731


@pytest.mark.parametrize(
    ("cls", "options", "trainable"), CONTROLS, ids=lambda x: getattr(x, "__name__", str(x))
)
def test_contracts(cls, options, trainable):
    interface = cls(V, D, **options)
    ids = torch.randint(0, V, (3, 7))
    out = interface(ids)
    assert out.shape == (3, 7, D) and out.dtype == torch.float32
    assert parameter_count(interface, trainable=True) == trainable
    assert interface.fixed == (trainable == 0)
    assert torch.allclose(interface.expected_norm(ids), out.norm(dim=-1), rtol=1e-5, atol=1e-6)
    # the spec (what checkpoints store) rebuilds the same interface, state included
    rebuilt = _interface_factory(interface.spec())(V, D)
    rebuilt.load_state_dict(interface.state_dict())
    assert torch.equal(rebuilt(ids), out)
    assert torch.equal(interface.table()[ids], out.detach())
    with pytest.raises(ValueError, match=r"token ids must lie in \[0, 299\]"):
        interface(torch.tensor([[V]]))


def test_bipolar_codes_are_centred_with_norm_sqrt_d_and_no_zero_vector():
    interface = BinaryCodeInput(V, D, bipolar=True)
    out = interface(IDS())
    assert set(out.unique().tolist()) == {-1.0, 1.0}
    assert torch.allclose(out.norm(dim=-1), torch.full((V,), math.sqrt(D)))
    assert torch.equal(out[0], -torch.ones(D))  # token 0: all -1, not the zero vector
    assert torch.unique(out, dim=0).shape[0] == V


def test_permuted_assignment_is_a_seeded_injection_recorded_in_checkpoints():
    interface = PermutedCodeInput(V, D, code_seed=3)
    codes = interface.encode(IDS())
    assert codes.unique().numel() == V and codes.max() < 2**9 and not torch.equal(codes, IDS())
    assert torch.equal(bits_of(codes, 9), interface.bits(IDS()))
    assert torch.equal(PermutedCodeInput(V, D, code_seed=3).encode(IDS()), codes)
    assert not torch.equal(PermutedCodeInput(V, D, code_seed=4).encode(IDS()), codes)
    with pytest.raises(ValueError, match="assignment differs from the one code_seed=4 gives"):
        PermutedCodeInput(V, D, code_seed=4).load_state_dict(interface.state_dict())


def test_random_codes_norm_matching_is_exact_and_the_table_is_verified_on_load():
    matched = RandomCodeInput(V, D, code_seed=1, norm_match=True)
    assert torch.allclose(
        matched(IDS()).norm(dim=-1), binary_code_norm(IDS(), V, D), rtol=1e-5, atol=1e-6
    )
    assert torch.equal(matched(IDS())[0], torch.zeros(D))  # token 0: the binary code's norm, 0
    raw = RandomCodeInput(V, D, code_seed=1)
    assert raw.codes.std().item() == pytest.approx(1.0, abs=0.05)  # unit variance before tiling
    assert torch.equal(raw.codes, RandomCodeInput(V, D, code_seed=1).codes)
    state = raw.state_dict()
    state["fingerprint"] = state["fingerprint"] + 1
    with pytest.raises(ValueError, match="fingerprint differs"):
        RandomCodeInput(V, D, code_seed=1).load_state_dict(state)
    with pytest.raises(ValueError, match="distribution must be"):
        RandomCodeInput(V, D, distribution="cauchy")


def test_random_codes_store_only_a_fingerprint_checked_at_the_precision_stored():
    # never the V x K table
    assert list(RandomCodeInput(V, D, code_seed=1).state_dict()) == ["fingerprint"]
    # bf16-true casts float buffers: its checkpoint still loads into the same code, and no other
    for seed, refused in ((1, False), (2, True)):
        state = RandomCodeInput(V, D, code_seed=seed).to(torch.bfloat16).state_dict()
        assert state["fingerprint"].dtype == torch.bfloat16
        if refused:
            with pytest.raises(ValueError, match="fingerprint differs from the one code_seed=1"):
                RandomCodeInput(V, D, code_seed=1).load_state_dict(state)
        else:
            RandomCodeInput(V, D, code_seed=1).load_state_dict(state)


def test_low_rank_learned_starts_at_the_binary_code_and_learns():
    interface = LowRankLearnedInput(V, D)
    assert torch.equal(interface(IDS()), BinaryCodeInput(V, D)(IDS()))
    interface(IDS()).sum().backward()
    assert interface.weight.grad is not None and interface.weight.grad.abs().sum() > 0
    assert torch.equal(interface.weight.detach(), bits_of(IDS(), 9).float())


def test_norm_matched_learned_rows_have_the_binary_norm_and_learn_direction():
    interface = NormMatchedLearnedInput(V, D)
    out = interface(IDS())
    assert torch.allclose(out.norm(dim=-1), binary_code_norm(IDS(), V, D), rtol=1e-5, atol=1e-6)
    out[1:].sum().backward()
    assert interface.weight.grad[1:].abs().sum() > 0 and interface.weight.grad[0].abs().sum() == 0


@pytest.mark.parametrize(
    ("cls", "options", "trainable"), CONTROLS[2:], ids=lambda x: getattr(x, "__name__", str(x))
)
def test_tiny_fit(tmp_path, corpus, cls, options, trainable):
    from functools import partial

    if options.get("code_width") == D:  # full-width codes: the tiny model's width
        options = {**options, "code_width": 32}
    recorder, model = fit_tiny(tmp_path, corpus, 2, max_steps=2, interface=partial(cls, **options))
    assert all(math.isfinite(loss) for loss in recorder.losses)
    assert model.hparams["interface"]["class_path"].endswith(cls.__name__)


@pytest.mark.gpu
@pytest.mark.parametrize(
    ("cls", "options", "trainable"), CONTROLS, ids=lambda x: getattr(x, "__name__", str(x))
)
def test_contracts_on_gpu(cls, options, trainable):
    interface = cls(V, D, **options)
    cpu = interface(IDS()[None])
    gpu = interface.to("cuda")(IDS()[None].cuda())
    assert gpu.device.type == "cuda" and torch.allclose(gpu.cpu(), cpu, atol=1e-6)
