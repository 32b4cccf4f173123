"""Token shards: pretokenize (same blocks as streaming, resumable, never overwriting), the
TextDataModule source, and bad input refused in one line (resumes at other world sizes:
tests/test_shard_resume.py)."""

import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch

from fixed_embed.cli import main
from fixed_embed.data import DocumentSource, PackedBlocks, TextDataModule
from fixed_embed.data.pretokenize import pretokenize
from fixed_embed.data.token_shards import INDEX, TokenShards
from fixed_embed.data.tokenizer import train_bpe
from fixed_embed.errors import ConfigError, DataError, MissingFileError
from tests.cli import run_cli

SEQ, WIDTH = 16, 17


def _files(out: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(out.iterdir())}


# -- pretokenize
# ------------------------------------------------------------------------------------


def test_shards_hold_exactly_the_blocks_the_stream_packs(corpus, tmp_path):
    data, tok = corpus
    source = DocumentSource(str(data))
    pretokenize(source, str(tok), tmp_path / "one", shards=1, holdout_per_mille=100)
    for keep in ("train", "held_out"):
        stored = TokenShards(tmp_path / "one", keep)
        mine = torch.from_numpy(stored.blocks(np.arange(stored.block_count(WIDTH)), WIDTH))
        stream = PackedBlocks(
            source,
            str(tok),
            SEQ,
            eos_id=0,
            num_shards=1,
            shuffle_buffer=0,
            epochs=1,
            holdout_per_mille=100,
            keep=keep,
        )
        assert torch.equal(mine, torch.stack(list(stream))), keep
    index = json.loads((tmp_path / "one" / INDEX).read_text())
    assert (
        index["dtype"] == "uint16" and index["holdout"]["per_mille"] == 100 and index["eos_id"] == 0
    )
    assert index["totals"]["train"]["documents"] + index["totals"]["held_out"]["documents"] == 60
    assert index["source"]["fingerprint"] == source.fingerprint()


def test_pretokenize_resumes_keeps_finished_shards_and_never_overwrites(corpus, tmp_path):
    data, tok = corpus
    lines = data.read_text().splitlines(keepends=True)
    files = tmp_path / "files"
    files.mkdir()
    for i in range(4):  # 4 source files: each output shard is finished as soon as its file is read
        (files / f"part{i}.jsonl").write_text("".join(lines[i * 15 : (i + 1) * 15]))
    source = DocumentSource(str(files))
    clean = pretokenize(source, str(tok), tmp_path / "clean", shards=4, holdout_per_mille=100)
    seen = []

    def interrupt(update):
        seen.append(update)
        if len(seen) == 4:  # inside the third file: shards 0 and 1 are finished
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        pretokenize(
            source, str(tok), tmp_path / "cut", shards=4, holdout_per_mille=100, progress=interrupt
        )
    left = sorted(p.name for p in (tmp_path / "cut").iterdir())
    assert (
        INDEX not in left
        and "part-00000.json" in left
        and not any(".tmp-" in name for name in left)
    )
    with pytest.raises(ConfigError, match=r"unfinished pretokenize of other inputs .*holdout"):
        pretokenize(source, str(tok), tmp_path / "cut", shards=4, holdout_per_mille=50)
    resumed = pretokenize(source, str(tok), tmp_path / "cut", shards=4, holdout_per_mille=100)
    assert resumed["resumed_shards"] == 2 and resumed["tokens"] == clean["tokens"]
    assert _files(tmp_path / "cut") == _files(tmp_path / "clean")
    with pytest.raises(ConfigError, match=r"already holds token shards .*--overwrite"):
        pretokenize(source, str(tok), tmp_path / "cut", shards=4, holdout_per_mille=100)
    again = pretokenize(
        source, str(tok), tmp_path / "cut", shards=2, holdout_per_mille=100, overwrite=True
    )
    assert (
        again["tokens"] == clean["tokens"]
        and len(list((tmp_path / "cut").glob("train-*.bin"))) == 2
    )
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "notes.txt").write_text("mine")
    with pytest.raises(ConfigError, match="is not empty"):
        pretokenize(source, str(tok), tmp_path / "busy", shards=2)


def test_pretokenize_command_prints_the_totals_and_exits_2_on_bad_paths(corpus, tmp_path, capsys):
    data, tok = corpus
    argv = [
        "pretokenize",
        "--data",
        str(data),
        "--tokenizer",
        str(tok),
        "--out",
        str(tmp_path / "o"),
        "--shards",
        "3",
    ]
    assert main([*argv, "--no-progress"]) == 0
    line = capsys.readouterr().out.strip().splitlines()[-1]
    assert (
        line.startswith("pretokenize: 60 documents") and "tokens/s" in line and " bytes in " in line
    )
    for bad, named in (
        (["--data", str(tmp_path / "nope.jsonl")], "nope.jsonl"),
        (["--tokenizer", str(tmp_path / "nope.json")], "nope.json"),
        ([], "already holds token shards"),
    ):
        args = [*argv, *bad, "--no-progress"]
        assert main(args) == 2, bad
        assert named in capsys.readouterr().err


@pytest.mark.slow
def test_pretokenize_workers_write_the_same_shards(corpus, tmp_path, shards):
    data, tok = corpus
    pretokenize(
        DocumentSource(str(data)),
        str(tok),
        tmp_path / "w2",
        shards=4,
        workers=2,
        holdout_per_mille=100,
    )
    assert _files(tmp_path / "w2") == _files(shards)


# -- the TextDataModule source
# --------------------------------------------------------------------------


def test_datamodule_reads_shards_with_their_tokenizer_and_validates_on_the_held_out_ones(shards):
    dm = TextDataModule(
        train=str(shards), seq_len=SEQ, batch_size=4, val_sequences=8, holdout_per_mille=100
    )
    assert (
        dm.tokenizer_path == str(shards / "tokenizer.json") and dm.tokenizer.get_vocab_size() == 300
    )
    dm.setup("fit")
    loader = dm.train_dataloader()
    first = next(iter(loader))
    assert first.shape == (4, WIDTH) and first.dtype == torch.int64
    held = TokenShards(shards, "held_out")
    assert held.documents == 6  # validation: the first blocks of the held-out shards
    assert torch.equal(dm.validation_blocks(), torch.from_numpy(held.blocks(np.arange(8), WIDTH)))
    spread = TextDataModule(
        train=str(shards),
        seq_len=SEQ,
        val_sequences=12,
        val_per_document=True,
        holdout_per_mille=100,
    ).validation_blocks()
    assert spread.shape == (12, WIDTH)
    with pytest.raises(ConfigError, match=r"hold out 100 per mille .*data.holdout_per_mille: 100"):
        TextDataModule(train=str(shards), seq_len=SEQ, holdout_per_mille=10).setup("fit")


# -- bad input: one line each
# ---------------------------------------------------------------------------


def _copy(shards, tmp_path):
    out = tmp_path / "copy"
    out.mkdir(parents=True)
    for path in shards.iterdir():
        (out / path.name).write_bytes(path.read_bytes())
    return out


def _edit_index(folder, change):
    index = json.loads((folder / INDEX).read_text())
    change(index)
    (folder / INDEX).write_text(json.dumps(index))


def test_bad_shards_are_refused_naming_the_file(shards, tmp_path, corpus):
    bad = _copy(shards, tmp_path)
    (bad / INDEX).unlink()
    with pytest.raises(
        DataError, match=r"no index token_shards.json: an unfinished `fixed-embed pretokenize`"
    ):
        TextDataModule(train=str(bad)).check_inputs()
    bad = _copy(shards, tmp_path / "b")
    with open(bad / "train-00001.bin", "r+b") as f:
        f.truncate(100)
    with pytest.raises(DataError, match=r"train-00001.bin is truncated: 100 bytes"):
        TokenShards(bad)
    with open(bad / "train-00001.bin", "r+b") as f:
        f.truncate(0)
    with pytest.raises(DataError, match=r"train-00001.bin is empty"):
        TokenShards(bad)
    bad = _copy(shards, tmp_path / "c")
    _edit_index(bad, lambda index: index["shards"]["train"][2].update(dtype="uint32"))
    with pytest.raises(DataError, match=r"mixes dtypes \['uint16', 'uint32'\]"):
        TokenShards(bad)
    (bad / "train-00003.bin").unlink()
    _edit_index(bad, lambda index: index["shards"]["train"][2].update(dtype="uint16"))
    with pytest.raises(MissingFileError, match=r"train-00003.bin listed in .* is missing"):
        TokenShards(bad)
    (bad / INDEX).write_text("{not json")
    with pytest.raises(DataError, match="not a readable token-shard index"):
        TokenShards(bad)


def test_shards_refuse_another_tokenizer(shards, tmp_path):
    texts = [f"other words number {i} " * 40 for i in range(40)]
    other = train_bpe(texts, 300, tmp_path / "other", "other-corpus")
    dm = TextDataModule(train=str(shards), tokenizer=str(other), seq_len=SEQ, holdout_per_mille=100)
    with pytest.raises(
        DataError,
        match=r"written with another tokenizer: .* differ in merges, vocab: .*set data.tokenizer: "
        r".*tokenizer.json",
    ):
        dm.setup("fit")


def test_a_sigterm_stops_pretokenize_as_ctrl_c_does_and_the_rerun_cleans_up(
    corpus, tmp_path, monkeypatch
):
    import signal

    import fixed_embed.data.pretokenize as writer

    data, tok = corpus
    real = writer._write

    # the scheduler's SIGTERM arrives while a shard is being written
    def killed_mid_write(source, out, plan, mine, progress):
        (Path(out) / f".train-00000.bin.tmp-{os.getpid()}").write_bytes(b"half")
        os.kill(os.getpid(), signal.SIGTERM)

    monkeypatch.setattr(writer, "_write", killed_mid_write)
    args = [
        "pretokenize",
        "--data",
        data,
        "--tokenizer",
        tok,
        "--out",
        tmp_path / "s",
        "--shards",
        "2",
        "--no-progress",
    ]
    handler = signal.getsignal(signal.SIGTERM)
    stopped = run_cli(*args)
    assert stopped.returncode == 130, stopped.stderr[-2000:]
    assert (
        "interrupted (SIGTERM; the same command continues, keeping the finished shards)"
        in stopped.stderr
    )
    assert signal.getsignal(signal.SIGTERM) == handler  # put back
    monkeypatch.setattr(writer, "_write", real)
    assert run_cli(*args).returncode == 0
    assert not list((tmp_path / "s").glob(".*tmp-*"))  # its half shard is gone
