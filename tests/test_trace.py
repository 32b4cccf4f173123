"""The traced update (fixed_embed/measure/trace.py) at tiny shapes: its peak against the
estimate, its FLOPs against the MFU formula, the id check on fake tensors, and the compiled
paper block without graph breaks."""

import pytest
import torch

from fixed_embed.distributed.parallel import ParallelConfig, apply_parallelism
from fixed_embed.measure.memory import RunShape, memory_estimate
from fixed_embed.measure.trace import trace_update
from fixed_embed.train.experiment import build_model

TINY = {
    "vocab_size": 512,
    "d_model": 64,
    "n_layers": 2,
    "n_heads": 4,
    "ffn_dim": 128,
    "max_seq_len": 32,
}


def _model(interface="BinaryCodeInput", ac=False, group=None):
    return build_model(
        {
            "decoder": TINY,
            "interface": {"class_path": f"fixed_embed.interfaces.{interface}"},
            "parallel": {"activation_checkpointing": ac, "shard_group_size": group},
            "loss_chunk_tokens": 16,
        }
    )


def _ddp(accumulate=4):
    return RunShape(micro_batch=2, seq_len=32, precision="bf16-mixed", accumulate=accumulate)


def test_traced_ddp_update_holds_the_state_the_estimate_counts_and_peaks_near_it():
    model = _model("LearnedInput")
    estimate = memory_estimate(model, _ddp())
    # of the update's 4: its peak (docs/benchmarks.md)
    traced = trace_update(model, _ddp(), micro_batches=2)
    assert traced.micro_batches == 2 and traced.tokens == 2 * 32
    assert (
        traced.kinds["Parameter"] == estimate.weights
        and traced.kinds["Gradient"] == estimate.gradients
    )
    # + AdamW's step counters
    assert estimate.optimizer <= traced.kinds["Optstate"] <= estimate.optimizer + 4096
    # docs/benchmarks.md: within 4 % at the paper shape
    assert 0.95 < estimate.allocated / traced.peak < 1.05


@pytest.mark.parametrize(("world_size", "group"), [(8, None), (8, 2)])
def test_traced_fsdp2_update_is_rank_0_of_a_sharded_world(world_size, group):
    """FSDP2 over every rank, or hybrid: sharded within groups of ``group`` ranks, replicated
    across them."""
    run = RunShape(micro_batch=2, seq_len=32, world_size=world_size, sharded=True, accumulate=3)
    model = _model(group=group)
    estimate = memory_estimate(model, run)
    traced = trace_update(model, run)
    assert not torch.distributed.is_initialized()  # the fake process group is gone
    # shards padded per tensor
    assert traced.kinds["Sharded Param"] == pytest.approx(estimate.weights, rel=0.05)
    assert traced.kinds["OptState"] == pytest.approx(estimate.optimizer, rel=0.05)
    # the gathered blocks weigh more at tiny shapes
    assert 0.95 < estimate.allocated / traced.peak < 1.15


@pytest.mark.parametrize("ac", [False, True])
def test_flops_per_token_is_what_flop_counter_mode_counts_less_recomputation(ac):
    """The MFU numerator (Decoder.flops_per_token: 6 per matmul weight + 12 d T per block) is
    the traced count less what is computed twice: the flash backward's QK^T (2 d T per block),
    and with checkpointing each block's forward again but its last matmul (down_proj: its output
    is not saved)."""
    model = _model(ac=ac)
    formula = model.decoder.flops_per_token()
    d, t, layers, f = TINY["d_model"], TINY["max_seq_len"], TINY["n_layers"], TINY["ffn_dim"]
    recomputed = layers * 2 * d * t
    if ac:
        recomputed += layers * (2 * (4 * d * d + 3 * d * f) - 2 * d * f + 4 * d * t)
    traced = trace_update(model, _ddp(accumulate=1)).flops_per_token
    assert traced - recomputed == pytest.approx(formula, rel=0.01)


def test_fake_ids_pass_the_id_check_and_real_ones_are_still_checked():
    from torch._subclasses.fake_tensor import FakeTensorMode

    interface = _model().interface
    with FakeTensorMode():
        # no values: nothing to check, no data-dependent op
        interface.check_ids(torch.zeros(2, 3, dtype=torch.long))
    with pytest.raises(ValueError, match="must lie in"):
        interface.check_ids(torch.tensor([[0, 512]]))


@pytest.mark.parametrize(
    ("interface", "ac", "graphs"), [("LearnedInput", True, 1), ("BinaryCodeInput", False, 2)]
)
def test_the_paper_block_compiles_without_graph_breaks(monkeypatch, interface, ac, graphs):
    """As fit compiles it (apply_parallelism: Module.compile per block), with fullgraph: a graph
    break or a data-dependent branch would raise. Every block shares one graph; a fixed code's
    first block a second one (its input needs no gradient)."""
    from torch._dynamo.testing import CompileCounter

    torch._dynamo.reset()
    counter = CompileCounter()
    compile_module = torch.nn.Module.compile
    monkeypatch.setattr(
        torch.nn.Module,
        "compile",
        lambda self, **kw: compile_module(self, backend=counter, fullgraph=True),
    )
    model = _model(interface, ac=ac)
    model.to_empty(device="cpu")
    model.decoder.init_weights()
    apply_parallelism(model.decoder, ParallelConfig(compile=True, activation_checkpointing=ac))
    try:
        loss, _ = model.block_loss(torch.randint(0, TINY["vocab_size"], (2, 33)))
        loss.backward()
        assert counter.frame_count == graphs
    finally:
        torch._dynamo.reset()


@pytest.mark.slow  # ~10 s: the parameter reports, the plan and the trace
def test_params_prints_the_traced_peak_per_rank_beside_the_estimate(tmp_path):
    import yaml

    from tests.cli import run_cli
    from tests.test_params import PAPER

    config = tmp_path / "tiny_fsdp.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "__base__": str(PAPER / "binary16.yaml"),
                "trainer": {
                    "strategy": {"class_path": "fixed_embed.distributed.fsdp.FSDP2Strategy"},
                    "precision": "32-true",
                },
                "data": {"batch_size": 2, "seq_len": 32},
                "model": {"decoder": TINY},
            }
        )
    )
    result = run_cli("params", config, "--world-size", "8", "--trace")
    assert result.returncode == 0, result.stderr[-2000:]
    assert "traced update, rank 0 of 8" in result.stdout and "traced peak per rank" in result.stdout
