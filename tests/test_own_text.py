"""Your own text in one try: a model vocabulary larger than the tokenizer's trains, a
one-document .txt says to set
--data.valid (never to lower a data.num_workers that is 0), and ``params`` takes overrides as
fit does."""

import sys
from pathlib import Path

import pytest

from fixed_embed.data import TextDataModule
from fixed_embed.errors import ConfigError, DataError
from tests.cli import run_cli
from tests.helpers import fit_tiny

TINY = Path(__file__).resolve().parents[1] / "experiments" / "tiny" / "gf2.yaml"


def test_a_model_vocabulary_larger_than_the_tokenizers_trains_and_a_smaller_one_names_the_flag(
    tmp_path, corpus
):
    # tokenizer: 300
    fit_tiny(tmp_path / "larger", corpus, stop_at=1, max_steps=1, decoder={"vocab_size": 320})
    with pytest.raises(
        ConfigError,
        match=r"smaller than the tokenizer's 300 .*set --model\.decoder\.vocab_size 300",
    ):
        fit_tiny(tmp_path / "smaller", corpus, stop_at=1, max_steps=1, decoder={"vocab_size": 290})


def test_a_one_document_txt_names_data_valid_and_not_num_workers(tmp_path, corpus):
    text = tmp_path / "mine.txt"
    text.write_text("alpha beta gamma delta " * 400)
    data = TextDataModule(train=str(text), tokenizer=str(corpus[1]), seq_len=16, val_sequences=4)
    with pytest.raises(DataError) as refused:
        data.validation_blocks()
    message = str(refused.value)
    assert "held out of data.train" in message and "set --data.valid FILE" in message
    assert "a .txt file is one" in message and "num_workers" not in message


def test_params_takes_overrides_after_the_config():
    base = run_cli("params", TINY)
    deeper = run_cli(
        "params",
        TINY,
        "--model.decoder.n_layers",
        "12",
        "--data.seq_len=512",
        "--model.decoder.max_seq_len",
        "512",
    )
    assert base.returncode == deeper.returncode == 0, deeper.stderr[-2000:]
    words = " ".join(deeper.stdout.split())  # the title wraps where the checkout's path is long
    assert "--model.decoder.n_layers 12 --data.seq_len=512" in words and "ctx 512" in words
    assert "ctx 512" not in base.stdout and base.stdout != deeper.stdout
    typo = run_cli("params", TINY, "--model.decoder.n_layerz", "12")
    assert (
        typo.returncode == 2
        and "n_layerz" in typo.stderr
        and len(typo.stderr.strip().splitlines()) == 2
    )
    for bad in (["--foo", "1"], ["--model.decoder.n_layers"]):
        result = run_cli("params", TINY, *bad)
        assert result.returncode == 2 and "overrides: --model.KEY VALUE" in result.stderr


def test_lm_eval_runs_on_the_cpu_of_a_machine_without_cuda_unless_told_otherwise(monkeypatch):
    """lm-eval's own default device is cuda: on a CPU machine the README's command ended in a
    CUDA assertion."""
    from fixed_embed.cli import lm_eval

    seen = []
    monkeypatch.setattr(lm_eval, "cli_evaluate", lambda: seen.append(list(sys.argv)))
    monkeypatch.setattr(lm_eval.torch.cuda, "is_available", lambda: False)
    lm_eval.run(["lm-eval", "--model", "fixed_embed", "--tasks", "piqa"])
    lm_eval.run(["lm-eval", "--model", "fixed_embed", "--tasks", "piqa", "--device", "cuda:1"])
    assert seen[0][-2:] == ["--device", "cpu"] and seen[1].count("--device") == 1
