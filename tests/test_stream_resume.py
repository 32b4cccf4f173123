"""The text stream among readers and across launches: ranks and workers read disjoint, complete
parts; the loader resumes exactly; the data module's resume check names what changed."""

import json
import re

import pytest
import torch
from torchdata.stateful_dataloader import StatefulDataLoader

from fixed_embed.data import TextDataModule
from fixed_embed.data.tokenizer import train_bpe
from tests import test_data
from tests.test_data import stream

# test_data's module fixtures (its own corpus, not conftest's), shared by name
corpus, tokenizer = test_data.corpus, test_data.tokenizer


def _reader_blocks(corpus, tokenizer, rank, world, workers, **kw):
    ds = stream(corpus, tokenizer, rank=rank, world_size=world, epochs=1, shuffle_buffer=4, **kw)
    loader = StatefulDataLoader(ds, batch_size=None, num_workers=workers)
    return [tuple(b.tolist()) for b in loader]


def test_ranks_and_workers_are_disjoint_and_complete(corpus, tokenizer):
    single = _reader_blocks(corpus, tokenizer, 0, 1, 0)
    sharded = [b for rank in range(2) for b in _reader_blocks(corpus, tokenizer, rank, 2, 2)]
    assert len(sharded) == len(set(sharded)) == len(single)
    assert sorted(sharded) == sorted(single)


def test_more_readers_than_num_shards_split_finer(corpus, tokenizer):
    # 2 ranks x 2 workers = 4 readers > num_shards = 2: one virtual shard per reader, as num_shards
    # = 4
    four = _reader_blocks(corpus, tokenizer, 0, 1, 0, num_shards=4)
    sharded = [
        b for rank in range(2) for b in _reader_blocks(corpus, tokenizer, rank, 2, 2, num_shards=2)
    ]
    assert len(sharded) == len(set(sharded)) and sorted(sharded) == sorted(four)


def _batches(loader, n):
    it = iter(loader)
    return [next(it) for _ in range(n)]


@pytest.mark.parametrize("workers", [0, 2])
def test_loader_resumes_exactly_after_two_resumes(corpus, tokenizer, workers):
    def loader():
        ds = stream(corpus, tokenizer, shuffle_buffer=8, seed=3, tokenize_batch=3)
        return StatefulDataLoader(ds, batch_size=4, num_workers=workers)

    reference = _batches(loader(), 60)  # several passes over the corpus
    first = loader()
    out = _batches(first, 17)
    state = first.state_dict()
    second = loader()
    second.load_state_dict(state)
    out += _batches(second, 21)
    state = second.state_dict()
    third = loader()
    third.load_state_dict(state)
    out += _batches(third, 22)
    assert all(torch.equal(a, b) for a, b in zip(reference, out, strict=True))


def test_resume_refusals_name_what_changed(corpus, tokenizer, tmp_path):
    """The data module's one resume check: the stream's settings, the readers (ranks, workers),
    the tokenizer."""
    from fixed_embed.data.loader_state import LOADER_STATES

    def data(**kw):
        return TextDataModule(
            **{"train": str(corpus / "*.jsonl"), "tokenizer": tokenizer, "seq_len": 16, **kw}
        )

    states = []
    for rank in range(2):
        ds = data().train_source.training_stream(rank, 2)
        next(iter(ds))
        states.append([ds.state_dict()])
    checkpoint = {
        LOADER_STATES: states,
        "datamodule_hyper_parameters": {"num_workers": 0},
        "TextDataModule": data().state_dict(),
    }
    assert data().resume_refusals(checkpoint, 2) == []
    (why,) = data(seq_len=32).resume_refusals(checkpoint, 2)
    assert re.search(
        r"refusing to resume: .*other data settings \(seq_len: checkpoint 16, now 32\)", why
    )
    (why,) = data().resume_refusals(checkpoint, 4)
    assert "the data position of 2 ranks but this run has 4" in why
    (why,) = data(num_workers=2).resume_refusals(checkpoint, 2)
    assert "saved by 0 loader worker(s) per device and data.num_workers is 2" in why
    texts = [
        json.loads(line)["text"]
        for p in sorted(corpus.glob("*.jsonl"))
        for line in p.read_text().splitlines()
    ]
    other = str(train_bpe(texts, 280, tmp_path / "other", "other"))
    refusals = data(tokenizer=other).resume_refusals(checkpoint, 2)
    assert re.search(
        rf"and data.tokenizer {re.escape(repr(other))} \(\w{{12}}\) differ in merges, vocab:",
        refusals[0],
    )
    # at load
    with pytest.raises(ValueError, match=r"differ in .*: resuming would feed the model other ids"):
        data(tokenizer=other).load_state_dict(checkpoint["TextDataModule"])
