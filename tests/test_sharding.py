"""Sharding at any scale (readers read only their share of the source) and the validation cache.

Readers are simulated without processes: ``PackedBlocks(rank=r, world_size=R)`` in the main
process is reader ``r`` of ``R``. A fake tokenizer (one id per document, a length that varies with
it) makes 128 readers over 1,024 documents fast and lets blocks name their documents.
"""

import json
import logging
import math
import warnings
from dataclasses import dataclass
from types import SimpleNamespace

import datasets
import pytest
import torch

import fixed_embed.data.packing as packing
from fixed_embed.data import DocumentSource, PackedBlocks, TextDataModule
from fixed_embed.data.sharding import document_cycle, is_held_out, reader_plan, virtual_shard_of
from fixed_embed.data.tokenizer import train_bpe

FILES, DOCS_PER_FILE = 16, 64
WORDS = [
    "alpha",
    "beta",
    "gamma",
    "delta",
    "epsilon",
    "zeta",
    "eta",
    "theta",
    "iota",
    "kappa",
    "lambda",
    "mu",
]


def _doc(n: int) -> str:
    return f"doc-{n} " + " ".join(WORDS[(n * 7 + k) % len(WORDS)] for k in range(3 + n % 11))


class FakeTokenizer:
    """Document ``doc-n ...`` becomes ``[n + 1] * (1 + n % 13)``; every text encoded is recorded."""

    def __init__(self):
        self.seen: list[str] = []

    def encode_batch(self, texts, add_special_tokens=False):
        self.seen += texts
        out = []
        for text in texts:
            n = int(text.split(" ", 1)[0].removeprefix("doc-"))
            out.append(SimpleNamespace(ids=[n + 1] * (1 + n % 13)))
        return out


@pytest.fixture
def fake_tokenizer(monkeypatch):
    tokenizer = FakeTokenizer()
    monkeypatch.setattr(packing, "load_tokenizer", lambda spec: tokenizer)
    return tokenizer


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """16 jsonl files of 64 documents each; document n is ``doc-n ...``."""
    folder = tmp_path_factory.mktemp("sharded")
    for f in range(FILES):
        docs = range(f * DOCS_PER_FILE, (f + 1) * DOCS_PER_FILE)
        (folder / f"part{f:02d}.jsonl").write_text(
            "".join(json.dumps({"text": _doc(n)}) + "\n" for n in docs)
        )
    return folder


def blocks_of(source, rank=0, world=1, **kw):
    kw = {"seq_len": 7, "eos_id": 0, "num_shards": None, "shuffle_buffer": 0, "epochs": 1, **kw}
    return PackedBlocks(source, "fake", rank=rank, world_size=world, **kw)


def local(files):
    return DocumentSource(str(files / "*.jsonl"))


def test_reader_plan_gives_every_document_to_one_reader_and_opens_few_files():
    for s in range(1, 18):
        for v in range(1, 34):
            cycle = document_cycle(s, v)
            for readers in {1, 2, 3, v}:
                if readers > v:
                    continue
                owners = {}
                for r in range(readers):
                    plan = reader_plan(s, v, r, readers)
                    # files' worth of its virtual shards
                    per_reader = math.ceil(v / readers) * s / v
                    assert len(plan) <= math.ceil(per_reader) + 1
                    for f, lo, hi in plan:
                        for j in range(lo, hi):  # a document in each of its parts of the file
                            assert (f, j) not in owners
                            owners[f, j] = r
                            assert (
                                r * v // readers
                                <= virtual_shard_of(s, v, f, j)
                                < (r + 1) * v // readers
                            )
                assert len(owners) == s * cycle
    # whole files, no other file
    assert reader_plan(16, 2, 1, 2) == [(f, 0, 1) for f in range(8, 16)]
    assert reader_plan(16, 128, 9, 128) == [(1, 1, 2)]  # one file, documents j % 8 == 1 of it


@pytest.mark.parametrize("readers", [1, 2, 32, 128])
def test_each_document_is_read_by_one_reader_and_each_reader_reads_its_share(
    files, fake_tokenizer, readers
):
    total = FILES * DOCS_PER_FILE
    owner = {}
    for r in range(readers):
        stream = blocks_of(local(files), r, readers)
        fake_tokenizer.seen.clear()
        assert list(stream)  # every reader gets blocks
        for text in fake_tokenizer.seen:
            assert text not in owner, f"{text[:10]} read by readers {owner[text]} and {r}"
            owner[text] = r
        # the rows it pulled from the source: its 1/readers of the corpus, or the one file it shares
        assert stream.stats.rows_read == total // min(readers, FILES)
        assert stream.stats.documents == total // readers
    assert set(owner) == {_doc(n) for n in range(total)}


@pytest.mark.parametrize("keep", ["train", "held_out"])
def test_hold_out_is_per_document_whatever_the_readers(files, fake_tokenizer, keep):
    texts = []
    for r in range(4):
        fake_tokenizer.seen.clear()
        list(blocks_of(local(files), r, 4, holdout_per_mille=300, keep=keep))
        texts += fake_tokenizer.seen
    expected = {
        _doc(n)
        for n in range(FILES * DOCS_PER_FILE)
        if is_held_out(_doc(n), 300) == (keep == "held_out")
    }
    assert len(texts) == len(set(texts)) and set(texts) == expected


def _block_set(source, readers, **kw):
    return sorted(
        tuple(b.tolist()) for r in range(readers) for b in blocks_of(source, r, readers, **kw)
    )


def test_blocks_depend_on_num_shards_not_on_the_world(files, fake_tokenizer):
    one = _block_set(local(files), 1, num_shards=8)
    for readers in (2, 4, 8):
        assert _block_set(local(files), readers, num_shards=8) == one
    # more readers than num_shards: one virtual shard per reader, as num_shards=None does
    assert _block_set(local(files), 32, num_shards=8) == _block_set(local(files), 1, num_shards=32)
    assert _block_set(local(files), 32) == _block_set(local(files), 1, num_shards=32)
    # num_shards=None: per readers
    assert _block_set(local(files), 1) != _block_set(local(files), 2)


def _resume_in_steps(make, stops):
    """Blocks of one pass taken with a fresh stream (state_dict -> load_state_dict) at each stop."""
    out, state = [], None
    for stop in [*stops, None]:
        stream = make()
        if state is not None:
            stream.load_state_dict(state)
        it = iter(stream)
        while stop is None or len(out) < stop:
            block = next(it, None)
            if block is None:
                return out
            out.append(block)
        state = stream.state_dict()
    return out


@pytest.mark.parametrize(("readers", "reader"), [(1, 0), (2, 1), (32, 13), (5, 3)])
def test_a_reader_resumes_exactly_mid_file(files, fake_tokenizer, readers, reader):
    def make():
        return blocks_of(
            local(files),
            reader,
            readers,
            num_shards=None,
            shuffle_buffer=4,
            tokenize_batch=5,
            epochs=2,
        )

    reference = list(make())
    n = len(reference)
    out = _resume_in_steps(make, [n // 7, n // 7 + 1, n // 2, n - 3])
    assert len(out) == n and all(torch.equal(a, b) for a, b in zip(reference, out, strict=True))


def test_a_state_from_before_per_file_sharding_resumes_a_single_file_source(files, fake_tokenizer):
    def make(path):
        return blocks_of(
            DocumentSource(str(path)), num_shards=4, shuffle_buffer=3, tokenize_batch=5
        )

    single = files / "part03.jsonl"
    reference = list(make(single))
    first = make(single)
    it = iter(first)
    head = [next(it) for _ in range(20)]
    state = first.state_dict()
    for key in ("layout", "source_shard", "source_shards"):
        del state[key]  # what an older checkpoint holds
    second = make(single)
    second.load_state_dict(state)
    rest = list(second)
    assert all(torch.equal(a, b) for a, b in zip(reference, head + rest, strict=True))
    many = make(files / "*.jsonl")
    it = iter(many)
    next(it)
    old = many.state_dict()
    del old["layout"]
    again = make(files / "*.jsonl")
    again.load_state_dict(old)
    with pytest.raises(ValueError, match="predates per-file sharding"):
        next(iter(again))


def _generate(shard):
    for s in shard:
        for j in range(40):
            yield {"text": _doc(s * 40 + j)}


@dataclass(frozen=True)
class GeneratedSource(DocumentSource):
    """Stands in for a hub stream: its own shards (``num_shards``), not files."""

    shards: int = 6

    def fingerprint(self):
        return {"generated": self.shards}

    def open(self):
        return datasets.IterableDataset.from_generator(
            _generate, gen_kwargs={"shard": list(range(self.shards))}
        )


@pytest.mark.parametrize("readers", [4, 12])
def test_a_stream_with_its_own_shards_is_split_at_them(fake_tokenizer, readers):
    source = GeneratedSource("generated")
    assert source.open().num_shards == 6
    owner = {}
    for r in range(readers):
        stream = blocks_of(source, r, readers)
        fake_tokenizer.seen.clear()
        list(stream)
        # at most two of the six shards, never the whole stream
        assert stream.stats.rows_read <= 2 * 40
        for text in fake_tokenizer.seen:
            assert text not in owner
            owner[text] = r
    assert set(owner) == {_doc(n) for n in range(6 * 40)}

    def make():
        return blocks_of(source, 1, readers, shuffle_buffer=2, tokenize_batch=3, epochs=2)

    reference = list(make())
    out = _resume_in_steps(make, [3, 4, len(reference) // 2])
    assert all(torch.equal(a, b) for a, b in zip(reference, out, strict=True))


# -- validation cache
# ---------------------------------------------------------------------------------


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("FIXED_EMBED_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache" / "validation"


def _dm(corpus, **kw):
    data, tok = corpus
    kw = {
        "tokenizer": str(tok),
        "seq_len": 16,
        "batch_size": 2,
        "val_sequences": 4,
        "holdout_per_mille": 100,
        **kw,
    }
    return TextDataModule(train=str(data), **kw)


def _forbid_reading(monkeypatch):
    def refuse(self):
        raise AssertionError("the data was read")

    monkeypatch.setattr(DocumentSource, "open", refuse)


def test_validation_is_built_once_then_read_from_the_cache(corpus, cache, monkeypatch, caplog):
    caplog.set_level(logging.INFO)
    built = _dm(corpus).validation_blocks()
    assert built.shape == (4, 17)
    assert "validation: built 4 blocks in" in caplog.text and str(cache) in caplog.text
    # no temporary file left
    assert len(list(cache.glob("*.pt"))) == 1 and not list(cache.glob(".*"))
    _forbid_reading(monkeypatch)
    caplog.clear()
    # another start: the file
    assert torch.equal(_dm(corpus, batch_size=4).validation_blocks(), built)
    assert "validation: 4 blocks from cache" in caplog.text


def test_validation_cache_key_follows_what_the_blocks_depend_on(corpus, cache, tmp_path):
    data, tok = corpus
    base = _dm(corpus).validation_blocks()
    assert _dm(corpus, seq_len=8).validation_blocks().shape == (4, 9)
    assert len(_dm(corpus, val_sequences=6).validation_blocks()) == 6
    assert len(list(cache.glob("*.pt"))) == 3
    copy = tmp_path / "copy" / "tokenizer.json"
    copy.parent.mkdir()
    copy.write_bytes(tok.read_bytes())
    # content, not the name
    assert torch.equal(_dm(corpus, tokenizer=str(copy)).validation_blocks(), base)
    assert len(list(cache.glob("*.pt"))) == 3
    texts = [json.loads(line)["text"] for line in data.read_text().splitlines()]
    other = train_bpe(texts, 280, tmp_path / "other-tok", "other")
    _dm(corpus, tokenizer=str(other)).validation_blocks()
    assert len(list(cache.glob("*.pt"))) == 4


@pytest.mark.parametrize("damage", ["truncate", "garbage", "other-shape"])
def test_a_damaged_validation_cache_is_rebuilt(corpus, cache, damage):
    built = _dm(corpus).validation_blocks()
    (path,) = cache.glob("*.pt")
    if damage == "truncate":
        path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    elif damage == "garbage":
        path.write_bytes(b"not a checkpoint")
    else:
        saved = torch.load(path, weights_only=True)
        torch.save({**saved, "blocks": saved["blocks"][:, :5]}, path)
    with pytest.warns(UserWarning, match="block cache .* rebuilding"):
        again = _dm(corpus).validation_blocks()
    assert torch.equal(again, built)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the rebuilt entry is sound
        entry = _dm(corpus).train_source.validation_cache(held_out=True)
        assert torch.equal(entry.load(), built)


class _Strategy:
    def __init__(self, sent):
        self.sent, self.calls = sent, []

    def broadcast(self, obj, src=0):
        self.calls.append((obj, src))
        return self.sent if obj is None else obj


def test_only_rank_zero_builds_validation_and_the_others_receive_it(corpus, cache, monkeypatch):
    built = _dm(corpus, val_sequences=4).validation_blocks()
    zero = _dm(corpus)
    zero.trainer = SimpleNamespace(world_size=2, global_rank=0, strategy=_Strategy(None))
    first = [b.clone() for b in zero.val_dataloader()]
    assert zero.trainer.strategy.calls[0][1] == 0 and torch.equal(
        zero.trainer.strategy.calls[0][0], built
    )
    _forbid_reading(monkeypatch)  # rank 1 (another node, no cache there) never touches the data
    one = _dm(corpus)
    one.trainer = SimpleNamespace(world_size=2, global_rank=1, strategy=_Strategy(built))
    second = [b.clone() for b in one.val_dataloader()]
    assert one.trainer.strategy.calls == [(None, 0)]
    assert torch.equal(torch.cat(first + second), built)  # each rank its half
    one.val_dataloader()
    assert len(one.trainer.strategy.calls) == 1  # broadcast once per module
