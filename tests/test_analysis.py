"""Analysis: identity probes find the bits where they are; ablations change the loss only when they ablate."""

import json

import pytest
import torch

from fixed_embed.analysis import identity_probe, layer_ablation, text_blocks
from fixed_embed.analysis.ablation import _loss
from fixed_embed.data.tokenizer import load_tokenizer
from fixed_embed.interfaces import BinaryCodeInput, LearnedInput
from fixed_embed.model import Decoder, DecoderConfig
from tests.cli import run_cli
from tests.helpers import fit_tiny

CONFIG = DecoderConfig(vocab_size=300, d_model=32, n_layers=2, n_heads=4, ffn_dim=64, max_seq_len=16)


@pytest.fixture(scope="module")
def blocks(corpus):
    return text_blocks(load_tokenizer(corpus[1]), 96, 16)


def test_text_blocks_are_packed_token_blocks(corpus, blocks):
    assert blocks.shape == (96, 17) and blocks.dtype == torch.int64 and blocks.max() < 300
    with pytest.raises(ValueError, match="blocks of 17 need"):
        text_blocks(load_tokenizer(corpus[1]), 10**6, 16)


def test_probe_reads_the_bits_off_a_binary_code_input(blocks):
    torch.manual_seed(0)
    result = identity_probe(Decoder(CONFIG, BinaryCodeInput(300, 32)), blocks)
    assert [row["layer"] for row in result["layers"]] == [0, 1, 2] and result["code_bits"] == 9
    assert result["layers"][0]["bit_accuracy"] > 0.99 and result["layers"][0]["id_accuracy"] > 0.9
    assert result["test_tokens"] == 24 * 16
    assert result["layers"][0]["bit_accuracy_unseen_types"] > 0.99  # the bits read off ids never trained on


def test_only_a_code_generalises_to_token_types_the_probe_never_saw(blocks):
    """A learned random table is recognisable per type (the position split) but its rows carry no
    bit layout, so on held-out types the probe is near chance; the binary code is read exactly."""
    torch.manual_seed(0)
    learned = identity_probe(Decoder(CONFIG, LearnedInput(300, 32)), blocks)["layers"][0]
    assert learned["bit_accuracy"] > 0.8 and learned["bit_accuracy_unseen_types"] < 0.7
    assert learned["id_accuracy_unseen_types"] < 0.05


def test_ablating_nothing_changes_nothing_and_ablating_a_block_changes_the_loss(blocks):
    torch.manual_seed(0)
    decoder = Decoder(CONFIG, LearnedInput(300, 32))
    before = decoder(blocks[:2, :-1])
    result = layer_ablation(decoder, blocks)
    assert result["loss"] == pytest.approx(_loss(decoder, blocks, 8))
    assert len(result["blocks"]) == 2 and all(abs(row["increase"]) > 1e-6 for row in result["blocks"])
    assert torch.equal(decoder(blocks[:2, :-1]), before)  # hooks removed
    assert layer_ablation(decoder, blocks, mode="mean")["loss"] == pytest.approx(result["loss"])


def test_cli_analyze_writes_json_and_png(tmp_path, corpus):
    fit_tiny(tmp_path / "run", corpus, 2, max_steps=2, interface=BinaryCodeInput)
    checkpoint = tmp_path / "run" / "ckpt" / "last.ckpt"
    for analysis in ("probe", "ablate"):
        run = run_cli(
            "analyze", analysis, checkpoint, "--labels", "binary", "--blocks", "16", "--out", tmp_path / "out"
        )
        assert run.returncode == 0, run.stderr[-2000:]
        assert (tmp_path / "out" / f"{analysis}.png").stat().st_size > 1000
    assert json.loads((tmp_path / "out" / "probe.json").read_text())["binary"]["interface"] == "BinaryCodeInput"
