"""Chunked head + cross-entropy: the same loss and gradients as ``F.cross_entropy`` over the
full logits."""

import socket
from dataclasses import asdict

import pytest
import torch
import torch.nn.functional as F

from fixed_embed.interfaces import GF2CodeInput, LearnedInput
from fixed_embed.model.decoder import Decoder, DecoderConfig
from fixed_embed.model.loss import linear_cross_entropy
from fixed_embed.train.module import LanguageModel

CONFIG = DecoderConfig(
    vocab_size=300, d_model=32, n_layers=2, n_heads=4, ffn_dim=64, max_seq_len=16
)
N = 3 * 16  # tokens of a [3, 16] batch
CHUNKS = [1, 7, 16, 20, N, 1000]  # one row, not dividing N, dividing N, > N


def plain_loss(hidden, weight, targets):
    return F.cross_entropy(F.linear(hidden, weight).float().flatten(0, -2), targets.flatten())


def close(got, ref, rtol=1e-5):
    """fp32 agreement up to summation order: relative, with a floor of ``rtol`` x the largest
    entry."""
    torch.testing.assert_close(got, ref, rtol=rtol, atol=rtol * float(ref.abs().max()))


def loss_and_grads(fn, *leaves):
    leaves = [x.detach().clone().requires_grad_(True) for x in leaves]
    loss = fn(*leaves)
    loss.backward()
    return loss.detach(), [x.grad for x in leaves]


@pytest.mark.parametrize("chunk", CHUNKS)
def test_matches_cross_entropy_on_the_full_logits(chunk):
    torch.manual_seed(0)
    h, w, t = torch.randn(3, 16, 32), torch.randn(300, 32) / 4, torch.randint(0, 300, (3, 16))
    ref, (ref_h, ref_w) = loss_and_grads(lambda h, w: plain_loss(h, w, t), h, w)
    got, (got_h, got_w) = loss_and_grads(lambda h, w: linear_cross_entropy(h, w, t, chunk), h, w)
    assert got.dtype == torch.float32 and got.shape == ()
    torch.testing.assert_close(got, ref, rtol=1e-6, atol=1e-6)
    close(got_h, ref_h)
    close(got_w, ref_w)


def test_upstream_gradient_scales_and_no_grad_gives_the_same_loss():
    torch.manual_seed(0)
    h, w, t = torch.randn(N, 32), torch.randn(300, 32), torch.randint(0, 300, (N,))
    _, (ref_h, ref_w) = loss_and_grads(lambda h, w: 2.5 * plain_loss(h, w, t), h, w)
    _, (got_h, got_w) = loss_and_grads(lambda h, w: 2.5 * linear_cross_entropy(h, w, t, 7), h, w)
    close(got_h, ref_h)
    close(got_w, ref_w)
    with torch.no_grad():
        torch.testing.assert_close(
            linear_cross_entropy(h, w, t, 7), plain_loss(h, w, t), rtol=1e-6, atol=1e-6
        )
    # a frozen head: only the hidden states get a gradient
    hidden = h.clone().requires_grad_(True)
    linear_cross_entropy(hidden, w, t, 7).backward()
    close(hidden.grad, ref_h / 2.5)
    with pytest.raises(ValueError, match="chunk_tokens"):
        linear_cross_entropy(h, w, t, -1)


def test_bf16_autocast_matches_the_plain_path():
    torch.manual_seed(0)
    h, w, t = torch.randn(N, 32), torch.randn(300, 32) / 4, torch.randint(0, 300, (N,))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        ref, (ref_h, ref_w) = loss_and_grads(lambda h, w: plain_loss(h, w, t), h, w)
        got, (got_h, got_w) = loss_and_grads(lambda h, w: linear_cross_entropy(h, w, t, 7), h, w)
    assert got_h.dtype == got_w.dtype == torch.float32  # the leaves' dtype, as on the plain path
    # same bf16 logits, same fp32 softmax
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)
    # bf16 matmuls of the same operands; the chunked head-weight gradient is summed over chunks in
    # fp32
    exact = loss_and_grads(lambda h, w: plain_loss(h.double(), w.double(), t), h, w)[1]
    for got_g, ref_g, exact_g in zip((got_h, got_w), (ref_h, ref_w), exact, strict=True):
        close(got_g, ref_g, rtol=1e-2)
        assert (got_g - exact_g).norm() <= 1.5 * (ref_g - exact_g).norm()  # no less accurate


def build(interface=GF2CodeInput, **config):
    torch.manual_seed(0)
    cfg = DecoderConfig(**{**asdict(CONFIG), **config})
    return Decoder(cfg, interface(cfg.vocab_size, cfg.d_model))


def model_grads(model, ids, chunk, checkpointing=False):
    model.zero_grad(set_to_none=True)
    model.activation_checkpointing = checkpointing
    if chunk is None:  # today's path: full logits, then F.cross_entropy
        loss = F.cross_entropy(model(ids[:, :-1]).float().flatten(0, 1), ids[:, 1:].flatten())
    else:
        loss = model(ids[:, :-1], ids[:, 1:], chunk)
    loss.backward()
    return loss.detach(), {
        n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None
    }


@pytest.mark.parametrize(
    ("interface", "options"),
    [(GF2CodeInput, {}), (LearnedInput, {}), (LearnedInput, {"tie_embeddings": True})],
)
@pytest.mark.parametrize("chunk", [5, 16, 64])
def test_decoder_loss_gives_every_parameter_the_same_gradient(interface, options, chunk):
    model = build(interface, **options)
    ids = torch.randint(0, 300, (3, 17), generator=torch.Generator().manual_seed(1))
    ref_loss, ref = model_grads(model, ids, None)
    loss, got = model_grads(model, ids, chunk)
    torch.testing.assert_close(loss, ref_loss, rtol=1e-6, atol=1e-6)
    assert got.keys() == ref.keys() == {n for n, p in model.named_parameters() if p.requires_grad}
    for name in ref:
        close(got[name], ref[name])
    # 0: unchunked
    torch.testing.assert_close(model(ids[:, :-1], ids[:, 1:], 0), ref_loss, rtol=0, atol=0)


def test_with_activation_checkpointing_and_logits_unchanged():
    model = build()
    ids = torch.randint(0, 300, (2, 17), generator=torch.Generator().manual_seed(2))
    ref_loss, ref = model_grads(model, ids, None)
    loss, got = model_grads(model, ids, 6, checkpointing=True)
    torch.testing.assert_close(loss, ref_loss, rtol=1e-6, atol=1e-6)
    for name in ref:
        close(got[name], ref[name])
    model.activation_checkpointing = False
    logits = model(ids[:, :-1])  # forward(ids) still gives the logits
    assert logits.shape == (2, 16, 300) and torch.equal(
        logits, model.head(model.hidden(ids[:, :-1]))
    )


def test_language_model_option_and_validation_use_the_chunked_loss():
    decoder = asdict(CONFIG)
    block = torch.randint(0, 300, (3, 17), generator=torch.Generator().manual_seed(3))
    losses = {}
    for chunk in (None, 0, 5):
        torch.manual_seed(0)
        model = LanguageModel(decoder=decoder, loss_chunk_tokens=chunk)
        assert model.hparams.loss_chunk_tokens == chunk
        losses[chunk] = model.block_loss(block)[0]
    assert LanguageModel(decoder=decoder).loss_chunk_tokens == 4096
    torch.testing.assert_close(losses[5], losses[0], rtol=1e-6, atol=1e-6)
    # a negative chunk: refused by its type (tests/test_bad_values.py)
    assert torch.equal(losses[None], losses[0])


def _fsdp_worker(rank, world, port, results):
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    from callbacks.update_boundary import global_norms
    from fixed_embed.distributed.parallel import ParallelConfig, apply_parallelism

    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world
    )
    try:
        torch.set_num_threads(1)
        mesh = init_device_mesh("cpu", (world,))
        ids = torch.randint(0, 300, (4, 17), generator=torch.Generator().manual_seed(4))[
            rank::world
        ]
        out = {}
        for dtype in ("float32", "bfloat16"):
            for chunk in (0, 5):
                model = build(LearnedInput)
                apply_parallelism(model, ParallelConfig(param_dtype=dtype), mesh)
                loss = model(ids[:, :-1], ids[:, 1:], chunk)
                loss.backward()
                # one scalar per parameter (identical on all ranks): the sum of squares of its full
                # gradient
                sums = {
                    n: norm.square()
                    for n, norm in global_norms(
                        {n: [p.grad] for n, p in model.named_parameters()}
                    ).items()
                }
                out[dtype, chunk] = (float(loss), {n: float(v) for n, v in sums.items()})
        if rank == 0:
            results.put(out)
    finally:
        dist.destroy_process_group()


@pytest.mark.multi_rank
def test_fsdp2_sharded_head_gets_the_same_gradients():
    """FSDP2 (2 CPU processes): the loss runs inside the head's forward, where the weight is
    gathered."""
    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    mp.start_processes(_fsdp_worker, args=(2, port, results), nprocs=2, start_method="spawn")
    out = results.get(timeout=60)
    for dtype, rel in (("float32", 1e-4), ("bfloat16", 2e-2)):
        (ref_loss, ref), (loss, got) = out[dtype, 0], out[dtype, 5]
        assert loss == pytest.approx(ref_loss, rel=rel / 100)
        assert got.keys() == ref.keys() and "head.weight" in got
        for name in ref:
            assert got[name] == pytest.approx(ref[name], rel=rel), (dtype, name)
