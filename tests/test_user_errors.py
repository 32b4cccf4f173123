"""User errors: no tokenizer replaced silently (eval and export: tests/test_eval_export_outputs.py);
messages name the file and the fix."""

import json
import random
from pathlib import Path

import pytest

from fixed_embed.cli import main
from fixed_embed.data.corpus_check import HEAD_BYTES, check_corpus
from fixed_embed.data.sources import DocumentSource
from fixed_embed.data.tokenizer import load_tokenizer, train_bpe
from fixed_embed.errors import (
    ConfigError,
    DataError,
    MissingFileError,
    UserError,
)


def cli(argv, capsys, expected=UserError):
    """Run ``fixed-embed ARGV`` in-process; the message of the user error it must end with.

    The top-level handler turns a ``UserError`` into a message on stderr and exit status 2 (no
    traceback; with ``--debug`` or ``FIXED_EMBED_DEBUG=1`` the error propagates, also accepted
    here).
    """
    try:
        code = main(argv)
    except UserError as error:
        assert isinstance(error, expected), type(error)
        return str(error)
    assert code == 2, "a user error exits with status 2"
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err
    return captured.err


def write_corpus(path, words, docs=40, seed=0):
    rng = random.Random(seed)
    texts = [" ".join(rng.choice(words) for _ in range(rng.randint(50, 200))) for _ in range(docs)]
    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    return path


WORDS_A = [
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
WORDS_B = [
    "north",
    "south",
    "east",
    "west",
    "river",
    "mountain",
    "valley",
    "forest",
    "ocean",
    "desert",
    "lake",
    "hill",
]


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("FIXED_EMBED_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "hf-datasets"))
    return tmp_path / "cache"


# -- 5. tokenizer: one cache folder per corpus, --out never replaced silently
# -------------------------------------


def test_tokenizer_cache_is_keyed_by_corpus_and_shared_with_the_datamodule(tmp_path, cache, capsys):
    from fixed_embed.data import TextDataModule

    a = write_corpus(tmp_path / "a.jsonl", WORDS_A)
    b = write_corpus(tmp_path / "b.jsonl", WORDS_B)
    assert main(["tokenizer", "--data", str(a), "--vocab-size", "300"]) == 0
    path_a = capsys.readouterr().out.strip().splitlines()[-1]
    assert main(["tokenizer", "--data", str(b), "--vocab-size", "300"]) == 0
    path_b = capsys.readouterr().out.strip().splitlines()[-1]
    assert path_a != path_b and path_a.startswith(str(cache / "tokenizers" / "bpe-300-"))
    assert "alpha" in "".join(load_tokenizer(path_a).get_vocab())
    assert "north" in "".join(load_tokenizer(path_b).get_vocab())
    dm = TextDataModule(train=str(a), tokenizer=None, tokenizer_vocab_size=300)
    assert dm.tokenizer_path == path_a  # `fit` with data.tokenizer: null finds the CLI's tokenizer


def test_tokenizer_out_refuses_a_tokenizer_from_other_inputs(tmp_path, cache, capsys):
    a = write_corpus(tmp_path / "a.jsonl", WORDS_A)
    b = write_corpus(tmp_path / "b.jsonl", WORDS_B)
    out = tmp_path / "tok"
    assert main(["tokenizer", "--data", str(a), "--vocab-size", "300", "--out", str(out)]) == 0
    before = (out / "tokenizer.json").read_text()
    # same inputs: reused
    assert main(["tokenizer", "--data", str(a), "--vocab-size", "300", "--out", str(out)]) == 0
    message = cli(
        ["tokenizer", "--data", str(b), "--vocab-size", "300", "--out", str(out)],
        capsys,
        ConfigError,
    )
    assert (
        f"{out / 'tokenizer.json'} already exists, made from {a}, vocab 300, not from {b}"
        in message
    )
    assert "--overwrite" in message and (out / "tokenizer.json").read_text() == before
    message = cli(
        ["tokenizer", "--data", str(a), "--vocab-size", "400", "--out", str(out)],
        capsys,
        ConfigError,
    )
    assert "--overwrite" in message
    assert (
        main(
            ["tokenizer", "--data", str(b), "--vocab-size", "300", "--out", str(out), "--overwrite"]
        )
        == 0
    )
    assert "north" in "".join(load_tokenizer(out).get_vocab())


def test_train_bpe_rebuilds_a_cache_that_does_not_match(tmp_path):
    texts_a = [" ".join(WORDS_A * 20)] * 10
    texts_b = [" ".join(WORDS_B * 20)] * 10
    out = tmp_path / "tok"
    train_bpe(texts_a, 300, out, "corpus-a")
    stamp = json.loads((out / "fingerprint.json").read_text())
    assert stamp["fingerprint"] == "corpus-a" and stamp["vocab_size"] == 300
    train_bpe(texts_b, 300, out, "corpus-b")  # another fingerprint: retrained, not reused
    assert "north" in "".join(load_tokenizer(out).get_vocab())
    # a tokenizer.json replaced behind the stamp's back is not trusted either
    (out / "tokenizer.json").write_text(load_tokenizer(out).to_str().replace("north", "nort"))
    train_bpe(texts_b, 300, out, "corpus-b")
    assert "north" in "".join(load_tokenizer(out).get_vocab())
    with pytest.raises(ConfigError, match="already exists"):
        train_bpe(texts_a, 300, out, "corpus-a", overwrite=False)


# -- 8. messages that do not mislead
# ---------------------------------------------------------------------------


def test_whitespace_corpus_is_refused_and_nothing_is_cached(tmp_path, cache, capsys):
    blank = tmp_path / "blank.jsonl"
    blank.write_text("".join(json.dumps({"text": "   \n\t  "}) + "\n" for _ in range(50)))
    message = cli(["tokenizer", "--data", str(blank)], capsys, DataError)
    assert (
        f"the BPE trained on {blank} learned only" in message
        and "of the 8192 tokens asked" in message
    )
    assert "too little text (50 documents, 50 empty or whitespace-only)" in message
    assert "nothing was written" in message and len(message.strip().splitlines()) <= 2
    assert not (cache / "tokenizers").exists() or not any((cache / "tokenizers").iterdir())


def test_bad_tokenizer_files_name_the_file(tmp_path):
    bad = tmp_path / "tokenizer.json"
    bad.write_text('{"version": "1.0", "model": ')
    with pytest.raises(DataError, match=rf"{bad} is not a valid tokenizers JSON"):
        load_tokenizer(bad)
    with pytest.raises(DataError, match=r"is not a valid tokenizers JSON"):
        load_tokenizer(tmp_path)  # the folder holding it
    missing = tmp_path / "nope" / "tokenizer.json"
    with pytest.raises(
        MissingFileError, match=rf"not found: {missing}; give a hub id .*tokenizer\.json.*folder"
    ):
        load_tokenizer(missing)
    (tmp_path / "nope").mkdir()
    with pytest.raises(MissingFileError, match=r"has no tokenizer\.json; give a hub id"):
        load_tokenizer(tmp_path / "nope")
    with pytest.raises(ConfigError, match="vocab_size > 257"):
        train_bpe(["x"], 100, tmp_path / "small", "f")


@pytest.mark.parametrize(
    "argv",
    [
        ["validate", "--ckpt_path", "best"],
        ["test", "--ckpt_path", "last"],
        ["fit", "--ckpt_path", "last", "--trainer.logger", "false"],
    ],
    ids=["validate-best", "test-last", "fit-last-without-run-folder"],
)
def test_a_checkpoint_name_lightning_cannot_resolve_here_is_refused_in_one_line(
    argv, capsys, tmp_path, monkeypatch
):
    """The checkpoint policy keeps checkpoints by update in the run folder: 'best' means
    nothing, and 'last' needs the run folder; Lightning would look for a ModelCheckpoint and
    warn or start fresh."""
    monkeypatch.chdir(tmp_path)
    # the error itself, not stderr: Lightning's seed logger keeps
    monkeypatch.setenv("FIXED_EMBED_DEBUG", "1")
    # the first in-process call's stderr, which pytest has closed by the second
    config = ["--config", str(Path(__file__).parents[1] / "experiments/tiny/gf2.yaml")]
    message = cli([argv[0], *config, *argv[1:]], capsys, expected=ConfigError)
    assert "--ckpt_path" in message and "checkpoint file" in message


# -- non-UTF-8 text: refused where the check reads (the first MiB), U+FFFD beyond (docs/data.md,
# "Bad input") --

# (where in the file, the bytes there): positions from the check's own read limit, so they follow
# it if it moves
UNDECODABLE = {
    "start": (0, b"\xff"),
    "middle of the first MiB": (HEAD_BYTES // 2, b"\xff"),
    "last byte of the first MiB": (HEAD_BYTES - 1, b"\xff"),
    # valid UTF-8: must pass, unchanged
    "a character cut by the limit": (
        HEAD_BYTES - 1,
        "\u00e9".encode(),
    ),
    "past the first MiB": (HEAD_BYTES + 10, b"\xff"),
}


@pytest.mark.parametrize("case", UNDECODABLE)
def test_undecodable_text_is_refused_in_the_first_mib_and_replaced_beyond(tmp_path, case):
    at, inserted = UNDECODABLE[case]
    body = bytearray(b"a" * (HEAD_BYTES + 64))
    body[at : at + len(inserted)] = inserted
    (file := tmp_path / "corpus.txt").write_bytes(bytes(body))
    bad = inserted == b"\xff"
    if bad and at < HEAD_BYTES:
        with pytest.raises(DataError) as error:
            check_corpus(file, "data.train")
        assert str(error.value) == (
            f"data.train: {file} is not UTF-8 text (byte {at}: invalid start byte); point data at "
            "documents"
        )
        return
    check_corpus(file, "data.train")
    [document] = DocumentSource(str(file)).open()  # one .txt file, one document
    assert (
        document["text"].count("\ufffd") == int(bad)
        and len(document["text"]) == len(body) - len(inserted) + 1
    )


def test_an_error_named_in_one_line_is_its_type_and_its_first_line():
    from fixed_embed.errors import in_one_line

    assert in_one_line(KeyboardInterrupt()) == "KeyboardInterrupt"  # no message: no dangling ": "
    assert in_one_line(RuntimeError("what failed\n  a second line")) == "RuntimeError: what failed"
    assert in_one_line(ValueError("x" * 1000)) == ("ValueError: " + "x" * 1000)[:300]
