"""Token shards resumed at other world sizes and worker counts: the seeded global block order,
simulated readers in-process, two gloo processes (DDP and FSDP2), and the resume plan's
refusals of other data."""

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from fixed_embed.data import DocumentSource, PackedBlocks, TextDataModule, block_order
from fixed_embed.data.block_order import GlobalBlockOrder, RankBatches, TokenBlockLoader
from fixed_embed.data.loader_state import LOADER_STATES, take_own_loader_state
from fixed_embed.data.token_shards import TokenShards
from fixed_embed.errors import CheckpointError
from fixed_embed.model.recipe import AdamWConfig
from fixed_embed.train.resume import check_resume
from tests import token_shard_fit
from tests.test_token_shards import SEQ, WIDTH

ROOT = Path(__file__).resolve().parents[1]

# -- the global order, resumed at other world sizes
# ---------------------------------------------------


def test_the_global_order_is_a_seeded_permutation_reshuffled_every_pass():
    order = GlobalBlockOrder(50, seed=3)
    first, second = order(np.arange(50)), order(np.arange(50, 100))
    assert sorted(first) == sorted(second) == list(range(50)) and not np.array_equal(first, second)
    assert np.array_equal(
        GlobalBlockOrder(50, seed=3)(np.arange(100)), np.concatenate([first, second])
    )
    assert not np.array_equal(GlobalBlockOrder(50, seed=4)(np.arange(50)), first)


def _launch(shards_dir, world, batches, state, batch_size=3):
    """``world`` simulated ranks each take ``batches`` batches, resuming ``state``; their blocks
    in global batch order, and each rank's state after."""
    loaders = []
    for rank in range(world):
        data = RankBatches(
            TokenShards(shards_dir), SEQ, batch_size, seed=7, rank=rank, world_size=world
        )
        loader = TokenBlockLoader(data)
        if state is not None:
            loader.load_state_dict(state)
        loaders.append(loader)
    its = [iter(loader) for loader in loaders]
    # global batch k: rank 0's rows, then rank 1's, ...
    out = [next(it) for _ in range(batches) for it in its]
    states = [loader.state_dict() for loader in loaders]
    assert all(s == states[0] for s in states), "every rank saves the same global position"
    return torch.cat(out), states[0]


def test_a_resume_on_1_then_2_then_4_readers_reads_every_block_once_in_the_global_order(shards):
    stored = TokenShards(shards)
    n = stored.block_count(WIDTH)
    a, state = _launch(shards, 1, 70, None)  # 210 blocks
    b, state = _launch(shards, 2, 40, state)  # +240
    c, state = _launch(shards, 4, 30, state)  # +360: 810 blocks, more than a pass
    assert state[block_order.GLOBAL_POSITION] == 810 > n
    trained = torch.cat([a, b, c])
    expected = stored.blocks(GlobalBlockOrder(n, seed=7)(np.arange(810)), WIDTH)
    assert torch.equal(trained, torch.from_numpy(expected))
    positions = block_order.GlobalBlockOrder(n, seed=7)(np.arange(n))
    assert sorted(positions.tolist()) == list(range(n)), "the first pass holds every block once"


def test_loader_workers_deal_whole_batches_in_the_order_the_loader_returns_them(
    shards, monkeypatch
):
    data = RankBatches(TokenShards(shards), SEQ, 2, seed=7, rank=1, world_size=2, start=10)
    reference = [data.batch(k) for k in range(9)]
    workers = []
    for w in range(3):
        monkeypatch.setattr(
            block_order, "get_worker_info", lambda w=w: SimpleNamespace(num_workers=3, id=w)
        )
        it = iter(data)
        workers.append([next(it) for _ in range(3)])
    # how a DataLoader interleaves its workers
    round_robin = [workers[k % 3][k // 3] for k in range(9)]
    assert all(torch.equal(x, y) for x, y in zip(round_robin, reference, strict=True))


def test_a_token_shard_position_goes_to_every_rank_and_the_data_module_refuses_at_load(
    shards, corpus
):
    def checkpoint(states):
        return {
            LOADER_STATES: states,
            "loops": {"fit_loop": {"state_dict": {"combined_loader": None}}},
        }

    def trainer(world, rank, datamodule=None):
        return SimpleNamespace(
            world_size=world,
            global_rank=rank,
            state=SimpleNamespace(fn="fit"),
            datamodule=datamodule,
        )

    def module(trainer):
        return SimpleNamespace(trainer=trainer, hparams={}, optimizer_config=AdamWConfig())

    position = [{block_order.GLOBAL_POSITION: 12, "fingerprint": "{}"}]
    for world in (1, 3, 4):
        for rank in range(world):
            ckpt = checkpoint([position, position])
            take_own_loader_state(ckpt, rank)
            assert ckpt["loops"]["fit_loop"]["state_dict"]["combined_loader"] == position
    stream = [{"reader": [1, 2], "fingerprint": "{}"}]
    ckpt = checkpoint([[{"reader": [0, 2], "fingerprint": "{}"}], stream])
    take_own_loader_state(ckpt, 1)
    # a text stream: its rank's
    assert ckpt["loops"]["fit_loop"]["state_dict"]["combined_loader"] == stream
    sharded = TextDataModule(train=str(shards), seq_len=SEQ, holdout_per_mille=100)
    with pytest.raises(CheckpointError, match="differ"):
        check_resume(
            checkpoint([position, [{block_order.GLOBAL_POSITION: 14}]]),
            module(trainer(2, 0, sharded)),
        )
    data, tok = corpus
    text = TextDataModule(train=str(data), tokenizer=str(tok), seq_len=SEQ)
    with pytest.raises(
        CheckpointError, match=r"2 ranks but this run has 4.*token shards \(fixed-embed pretokenize"
    ):
        check_resume(checkpoint([stream, stream]), module(trainer(4, 0, text)))


# -- 2 gloo processes: the world changes between launches, DDP and FSDP2
# --------------------------------------


def _check_launches(tmp_path, shards, launches):
    """Every launch's ranks trained on their slices of consecutive global batches, from where
    the last stopped."""
    stored = TokenShards(shards)
    order = GlobalBlockOrder(stored.block_count(WIDTH), seed=5)
    position, seen = 0, []
    for i, (devices, _, steps) in enumerate(launches):
        ranks = [
            json.loads((tmp_path / f"launch{i}" / f"rank{r}.json").read_text())
            for r in range(devices)
        ]
        assert all(r["world_size"] == devices for r in ranks)
        first = launches[i - 1][2] if i else 0
        for k, step in enumerate(range(first, steps)):
            for rank, record in enumerate(ranks):
                got_step, rows = record["steps"][k]
                assert got_step == step
                start = position + rank * 2
                assert rows == stored.blocks(order(np.arange(start, start + 2)), WIDTH).tolist(), (
                    i,
                    step,
                    rank,
                )
                seen += range(start, start + 2)
            position += 2 * devices
    assert sorted(seen) == list(range(position)), (
        "every block of the global order once, none skipped"
    )
    return position


def _launch_fit(tmp_path, shards, i, devices, workers, steps, strategy, in_process):
    argv = [
        str(tmp_path / f"launch{i}"),
        str(shards),
        "--devices",
        str(devices),
        "--workers",
        str(workers),
        "--steps",
        str(steps),
        "--ckpt-dir",
        str(tmp_path / "ckpt"),
        "--strategy",
        strategy,
    ]
    if in_process:
        token_shard_fit.main(argv)
        return
    run = subprocess.run(
        [sys.executable, str(ROOT / "tests" / "token_shard_fit.py"), *argv],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
        env={**os.environ, "HF_DATASETS_CACHE": str(tmp_path / "hf")},
    )
    assert run.returncode == 0, run.stderr[-3000:]


@pytest.mark.multi_rank
def test_a_run_resumed_on_two_processes_with_workers_and_back_on_one_reads_every_block_once(
    shards, tmp_path
):
    """DDP. Launch 1: 1 process (this one), 3 updates; launch 2: 2 processes (gloo) x 2 loader
    workers = 4 readers, updates 4-5; launch 3: 1 process again, updates 6-7. Each resumes the
    last checkpoint (saved with the ranks' positions gathered). Together they train on global
    positions [0, 18) of the seeded order, each exactly once, every rank on its slice of every
    global batch (the simulated-reader test above covers 1 -> 2 -> 4 ranks in-process)."""
    launches = [(1, 0, 3), (2, 2, 5), (1, 0, 7)]
    for i, (devices, workers, steps) in enumerate(launches):
        _launch_fit(tmp_path, shards, i, devices, workers, steps, "ddp", in_process=devices == 1)
    assert _check_launches(tmp_path, shards, launches) == 18


@pytest.mark.multi_rank
def test_an_fsdp2_run_resumed_on_one_process_reshards_and_reads_every_block_once(shards, tmp_path):
    """FSDP2: 2 processes x 2 workers, 3 updates, a sharded checkpoint; then 1 process (FSDP2 on
    one rank: the distributed checkpoint reshards the weights and optimizer), updates 4-5, from
    the next global block."""
    launches = [(2, 2, 3), (1, 0, 5)]
    for i, (devices, workers, steps) in enumerate(launches):
        _launch_fit(tmp_path, shards, i, devices, workers, steps, "fsdp", in_process=False)
    assert (tmp_path / "ckpt" / "last.ckpt").is_dir(), "a sharded (distributed) checkpoint"
    assert _check_launches(tmp_path, shards, launches) == 16


def test_the_resume_plan_refuses_other_shard_data_and_a_switch_between_text_and_shards(
    corpus, shards
):
    """Before any work (the plan reads the checkpoint only): a shard position resumes at any
    world size, but not over other blocks (seq_len, seed, other shards) and not into a text
    stream, nor a text one into shards."""
    from fixed_embed.lightning_internals import COMBINED_LOADER

    data, tok = corpus

    def refusals(position, **options):
        checkpoint = {"loops": {"fit_loop": {"state_dict": {COMBINED_LOADER: [position]}}}}
        dm = TextDataModule(
            **{"train": str(shards), "seq_len": 16, "holdout_per_mille": 100, **options}
        )
        return dm.resume_refusals(checkpoint, 2)

    order = RankBatches(TokenShards(shards), 16, 4, 0, 0, 1)
    position = TokenBlockLoader(order).state_dict()
    assert refusals(position) == []  # the same data at another world size (2 ranks now)
    assert "seq_len: checkpoint 16, now 8" in refusals(position, seq_len=8)[0]
    assert "seed: checkpoint 0, now 5" in refusals(position, seed=5)[0]
    (text,) = refusals(position, train=str(data), tokenizer=str(tok))
    assert "data position is in token shards, and data.train is now text" in text
    stream = PackedBlocks(
        DocumentSource(str(data)), str(tok), 16, eos_id=0, num_shards=4
    ).state_dict()
    (switch,) = refusals(stream)
    assert "text stream's" in switch and str(shards) in switch
