"""Data: packing, validation set, errors (readers and exact resume: tests/test_stream_resume.py)."""

import json
import random
import subprocess
import sys

import datasets
import pytest
import torch

from fixed_embed.data import DocumentSource, PackedBlocks, TextDataModule
from fixed_embed.data.tokenizer import load_tokenizer, train_bpe
from fixed_embed.errors import DataError


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """Two jsonl files of synthetic prose: 40 documents of varied length, one empty."""
    folder = tmp_path_factory.mktemp("corpus")
    words = [
        "the",
        "of",
        "and",
        "a",
        "to",
        "in",
        "is",
        "was",
        "that",
        "for",
        "it",
        "with",
        "as",
        "his",
        "on",
        "be",
        "at",
        "by",
        "had",
        "are",
        "but",
        "from",
        "or",
    ]
    rng = random.Random(0)
    for part in range(2):
        with open(folder / f"part{part}.jsonl", "w") as f:
            for i in range(20):
                text = " ".join(rng.choice(words) for _ in range(rng.randint(30, 400)))
                f.write(
                    json.dumps({"text": "" if (part, i) == (0, 5) else f"Doc {part}-{i}. {text}"})
                    + "\n"
                )
    return folder


@pytest.fixture(scope="module")
def tokenizer(corpus, tmp_path_factory):
    texts = [
        json.loads(line)["text"]
        for p in sorted(corpus.glob("*.jsonl"))
        for line in p.read_text().splitlines()
    ]
    return str(train_bpe(texts, 300, tmp_path_factory.mktemp("tok"), "test-corpus"))


def stream(corpus, tokenizer, **kw):
    kw = {"seq_len": 16, "eos_id": 0, "num_shards": 8, "shuffle_buffer": 0, **kw}
    return PackedBlocks(DocumentSource(str(corpus / "*.jsonl")), tokenizer, **kw)


def test_packing_concatenates_documents_with_eos_and_no_padding(corpus, tokenizer):
    tok = load_tokenizer(tokenizer)
    blocks = list(stream(corpus, tokenizer, num_shards=1, epochs=1))
    assert all(b.shape == (17,) for b in blocks)
    flat = torch.cat(blocks).tolist()
    expected = []
    for p in sorted(corpus.glob("*.jsonl")):
        for line in p.read_text().splitlines():
            text = json.loads(line)["text"]
            if text:
                expected += [*tok.encode(text, add_special_tokens=False).ids, 0]
    n = len(expected) // 17 * 17
    assert flat == expected[:n]  # exact stream; the last partial block waits for more text
    stats = stream(corpus, tokenizer, num_shards=1, epochs=1)
    list(stats)
    assert stats.stats.empty_documents == 1 and stats.stats.documents == 39


def test_the_saved_stream_state_keeps_its_keys(corpus, tokenizer):
    """Checkpoints hold these keys: renaming or dropping one would stop every saved run resuming."""
    ds = stream(corpus, tokenizer, shuffle_buffer=4)
    next(iter(ds))
    state = ds.state_dict()
    assert set(state) == {
        "fingerprint",
        "layout",
        "reader",
        "epoch",
        "source_shards",
        "source_shard",
        "source_state",
        "source_doc_index",
        "doc_in_batch",
        "blocks_from_doc",
        "carry_at_doc",
        "carries",
        "buffer",
        "rng_state",
        "blocks_delivered",
        "flushing",
    }
    assert json.loads(state["fingerprint"])["bos_id"] is None and state["layout"] == 2


@pytest.mark.slow  # a fresh interpreter: the test process has Lightning loaded already
def test_data_modules_import_without_lightning():
    """Only the datamodule needs Lightning: the packer, sharding, tokenizer and corpus load
    without it."""
    code = (
        "import sys\n"
        "import fixed_embed.data.packing, fixed_embed.data.sharding, "
        "fixed_embed.data.reader_state\n"
        "import fixed_embed.data.block_cache, fixed_embed.data.tokenizer, fixed_embed.data.corpus\n"
        "from fixed_embed.data import DocumentSource, PackedBlocks\n"
        "loaded = sorted(m for m in sys.modules if m.split('.')[0] in ('lightning', "
        "'pytorch_lightning'))\n"
        "assert not loaded, loaded\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr[-2000:]
    from fixed_embed.data import TextDataModule as lazy
    from fixed_embed.data.datamodule import TextDataModule as direct

    assert lazy is direct


def test_hub_splits_choose_what_training_and_validation_read(
    corpus, tokenizer, tmp_path, monkeypatch
):
    """A hub ``train`` / ``valid`` is read from ``train_split`` / ``valid_split``: the blocks
    equal those of local files holding the same documents (the hub is faked: no network)."""
    lines = (corpus / "part1.jsonl").read_text().splitlines(keepends=True)
    (tmp_path / "web.jsonl").write_text("".join(lines[:12]))
    (tmp_path / "heldout.jsonl").write_text("".join(lines[12:]))
    splits = {
        name: [
            json.loads(line)["text"]
            for line in (tmp_path / f"{name}.jsonl").read_text().splitlines()
        ]
        for name in ("web", "heldout")
    }
    real_load, opened = datasets.load_dataset, []

    def load_dataset(path, name=None, split=None, streaming=False, **kw):
        if path != "owner/corpus":  # the local files go through the real builder
            return real_load(path, name, split=split, streaming=streaming, **kw)
        opened.append((name, split))
        return datasets.Dataset.from_dict({"text": splits[split]}).to_iterable_dataset()

    monkeypatch.setattr(datasets, "load_dataset", load_dataset)
    monkeypatch.setenv("FIXED_EMBED_CACHE", str(tmp_path / "cache"))
    kw = {
        "tokenizer": tokenizer,
        "seq_len": 16,
        "batch_size": 4,
        "val_sequences": 6,
        "shuffle_buffer": 8,
    }
    hub = TextDataModule(
        train="owner/corpus",
        valid="owner/corpus",
        hub_name="cfg",
        train_split="web",
        valid_split="heldout",
        **kw,
    )
    files = TextDataModule(
        train=str(tmp_path / "web.jsonl"), valid=str(tmp_path / "heldout.jsonl"), **kw
    )
    assert torch.equal(hub.validation_blocks(), files.validation_blocks())
    assert opened == [("cfg", "heldout")]
    assert torch.equal(next(iter(hub.train_dataloader())), next(iter(files.train_dataloader())))
    assert opened[-1] == ("cfg", "web")


def test_datamodule_vocab_and_validation(corpus, tokenizer):
    dm = TextDataModule(
        train=str(corpus / "*.jsonl"),
        tokenizer=tokenizer,
        seq_len=16,
        batch_size=4,
        val_sequences=10,
        holdout_per_mille=300,
    )
    assert dm.tokenizer.get_vocab_size() == 300
    val = dm.validation_blocks()
    assert val.shape == (10, 17)
    again = TextDataModule(
        train=str(corpus / "*.jsonl"),
        tokenizer=tokenizer,
        seq_len=16,
        batch_size=2,
        val_sequences=10,
        holdout_per_mille=300,
    )
    assert torch.equal(again.validation_blocks(), val)
    train_blocks = {
        tuple(b.tolist()) for b in stream(corpus, tokenizer, epochs=1, holdout_per_mille=300)
    }
    assert not train_blocks & {tuple(b.tolist()) for b in val}


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_training_batches_are_pinned_on_cuda_only(corpus, tokenizer, device):
    from types import SimpleNamespace

    dm = TextDataModule(
        train=str(corpus / "*.jsonl"), tokenizer=tokenizer, seq_len=16, batch_size=4
    )
    dm.trainer = SimpleNamespace(
        global_rank=0,
        world_size=1,
        max_steps=4,
        accumulate_grad_batches=1,
        strategy=SimpleNamespace(root_device=torch.device(device)),
    )
    assert dm.train_dataloader().pin_memory == (device == "cuda")


@pytest.mark.parametrize(
    ("path", "error", "message"),
    [
        (
            "/nonexistent/data.jsonl",
            FileNotFoundError,
            "data file not found: /nonexistent/data.jsonl",
        ),
        ("/tmp/*.nothing-matches-this", FileNotFoundError, "matches no file"),
    ],
)
def test_bad_paths(path, error, message):
    with pytest.raises(error, match=message):
        DocumentSource(path).open()


def test_missing_text_field_lists_fields(corpus, tokenizer):
    source = DocumentSource(str(corpus / "*.jsonl"), text_field="body")
    with pytest.raises(KeyError, match=r"'body' not found .* fields are \['text'\]"):
        source.open()


def test_hub_id_without_network_says_so():
    with pytest.raises(OSError, match=r"could not open hub dataset .*local files"):
        DocumentSource("nobody-here/no-such-dataset-xyz").open()


def test_tokenizer_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="tokenizer file or folder not found"):
        load_tokenizer(tmp_path / "missing" / "tokenizer.json")
    with pytest.raises(FileNotFoundError, match=r"has no tokenizer\.json"):
        load_tokenizer(tmp_path)


def test_txt_files_and_invalid_utf8(tmp_path, tokenizer):
    (tmp_path / "a.txt").write_bytes(b"caf\xe9 au lait " * 50)
    ds = PackedBlocks(
        DocumentSource(str(tmp_path / "a.txt")),
        tokenizer,
        seq_len=8,
        eos_id=0,
        num_shards=1,
        shuffle_buffer=0,
        epochs=1,
    )
    assert len(list(ds)) > 0
    assert ds.stats.replaced_characters == 50


@pytest.mark.slow  # the real corpus and tokenizer: 20 s
def test_gutenberg_with_smollm2_tokenizer(shared_data):
    tok = str(shared_data / "smollm2-tokenizer" / "tokenizer.json")
    dm = TextDataModule(
        train=str(shared_data / "gutenberg-prose" / "train.jsonl"),
        valid=str(shared_data / "gutenberg-prose" / "valid.jsonl"),
        tokenizer=tok,
        seq_len=128,
        batch_size=2,
        val_sequences=4,
    )
    assert dm.tokenizer.get_vocab_size() == 49152
    assert dm.validation_blocks().shape == (4, 129)
    batch = next(iter(dm.train_dataloader()))
    assert batch.shape == (2, 129) and batch.max() < 49152


@pytest.mark.slow  # builds the offline corpus and its BPE twice: 15 s
def test_default_corpus_is_deterministic_and_cached(tmp_path, monkeypatch):
    from fixed_embed.data.corpus import default_corpus

    monkeypatch.setenv("FIXED_EMBED_CACHE", str(tmp_path / "a"))
    first = default_corpus()
    train = (first / "train.jsonl").read_bytes()
    assert len(train) > 1_000_000 and (first / "valid.jsonl").stat().st_size > 10_000
    mtime = (first / "train.jsonl").stat().st_mtime_ns
    # cached
    assert default_corpus() == first and (first / "train.jsonl").stat().st_mtime_ns == mtime
    monkeypatch.setenv("FIXED_EMBED_CACHE", str(tmp_path / "b"))
    assert (default_corpus() / "train.jsonl").read_bytes() == train
    train_ids = {json.loads(line)["id"] for line in train.decode().splitlines()}
    valid_ids = {
        json.loads(line)["id"] for line in (first / "valid.jsonl").read_text().splitlines()
    }
    assert not train_ids & valid_ids


def test_a_stream_saved_right_after_a_pass_resumes_into_the_next(corpus, tokenizer):
    """A checkpoint can fall exactly on the last block of a pass: the resumed remainder is empty."""
    per_pass = sum(1 for _ in stream(corpus, tokenizer, epochs=1, num_shards=1))
    reference = stream(corpus, tokenizer, num_shards=1)
    expected = [b for _, b in zip(range(per_pass + 3), reference, strict=False)]
    first = stream(corpus, tokenizer, num_shards=1)
    it = iter(first)
    for _ in range(per_pass):
        next(it)
    resumed = stream(corpus, tokenizer, num_shards=1)
    resumed.load_state_dict(first.state_dict())
    after = [b for _, b in zip(range(3), resumed, strict=False)]
    assert all(torch.equal(a, b) for a, b in zip(expected[per_pass:], after, strict=True))


def test_a_hold_out_too_small_for_a_block_says_it_is_validation(tmp_path, tokenizer, monkeypatch):
    """A few short held-out documents, fragmented over validation's fixed shards: the error
    names validation and its options, not the training readers."""
    monkeypatch.setenv("FIXED_EMBED_CACHE", str(tmp_path / "cache"))
    short = tmp_path / "short.jsonl"
    short.write_text(
        "".join(json.dumps({"text": f"the river {i} and the hill"}) + "\n" for i in range(300))
    )
    dm = TextDataModule(
        train=str(short), tokenizer=tokenizer, seq_len=64, batch_size=2, holdout_per_mille=50
    )
    with pytest.raises(
        DataError, match=r"^validation: the documents of .*short\.jsonl \(50 per mille held out"
    ):
        dm.validation_blocks()
