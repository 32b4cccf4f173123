"""Analysis: identity probes find the bits where they are; ablations change the loss only when
they ablate."""

import json

import pytest
import torch

from fixed_embed.data.tokenizer import load_tokenizer
from fixed_embed.evaluation.analysis import identity_probe, layer_ablation, text_blocks
from fixed_embed.evaluation.analysis.ablation import _loss
from fixed_embed.evaluation.analysis.probe import majority_baseline, plot_probe, probe_sample
from fixed_embed.interfaces import BinaryCodeInput, LearnedInput
from fixed_embed.model.decoder import Decoder, DecoderConfig
from tests.cli import run_cli
from tests.helpers import fit_tiny

CONFIG = DecoderConfig(
    vocab_size=300, d_model=32, n_layers=2, n_heads=4, ffn_dim=64, max_seq_len=16
)


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
    # the bits read off ids never trained on
    assert result["layers"][0]["bit_accuracy_unseen_types"] > 0.99
    # the floor, on the probe's own samples
    assert result["majority"] == majority_baseline(*probe_sample(blocks, 300)[1:])
    assert set(result["majority"]) == {"position", "type"}
    assert (
        result["layers"][0]["bit_accuracy"] > result["majority"]["position"]["bit_accuracy"] > 0.5
    )


def test_majority_baseline_guesses_each_bits_most_frequent_training_value():
    """Vocabulary 4 (2 bits, little-endian: 1 = (1, 0), 2 = (0, 1), 3 = (1, 1)); one input per
    block. The type split holds out type 2 (TYPE_SEED's quarter of 4 types)."""
    blocks = torch.tensor([[i, 0] for i in (2, 2, 2, 1, 1, 3, 3, 3, 1, 3)])
    ids, targets, splits = probe_sample(blocks, 4, train_fraction=0.7)
    assert torch.equal(splits["position"], torch.arange(10) < 7) and torch.equal(
        splits["type"], ids != 2
    )
    assert targets[:3].tolist() == [[0.0, 1.0]] * 3
    baseline = majority_baseline(targets, splits)
    # position: trained on 2 2 2 1 1 3 3 -> bit 0 is 1 in 4/7, bit 1 in 5/7: guess (1, 1) = id 3
    # (not the most frequent id, 2); scored on 3 1 3 -> 5 of 6 bits, 2 of 3 ids
    assert baseline["position"] == pytest.approx({"bit_accuracy": 5 / 6, "id_accuracy": 2 / 3})
    # type: trained on 1 1 3 3 3 1 3 -> guess (1, 1); scored on the held-out 2 2 2 = (0, 1), not on
    # the test targets' own majority (which would score 1.0): half the bits, no id
    assert baseline["type"] == pytest.approx({"bit_accuracy": 0.5, "id_accuracy": 0.0})


def test_plot_probe_names_the_seed_draws_integer_layers_and_writes_the_file(tmp_path, monkeypatch):
    from matplotlib.figure import Figure

    seen = {}
    save = Figure.savefig

    def record(fig, *args, **kwargs):
        seen["title"] = fig._suptitle.get_text()
        seen["ticks"] = [tick for ax in fig.axes for tick in ax.get_xticks() if 0 <= tick <= 3]
        seen["legend"] = [text.get_text() for legend in fig.legends for text in legend.get_texts()]
        # data lines vary by layer
        flat = [line for line in fig.axes[0].lines if len(set(line.get_ydata())) == 1]
        seen["floors"] = sorted({round(float(line.get_ydata()[0]), 6) for line in flat})
        return save(fig, *args, **kwargs)

    monkeypatch.setattr(Figure, "savefig", record)
    majority = {
        "position": {"bit_accuracy": 0.65, "id_accuracy": 0.0},
        "type": {"bit_accuracy": 0.61, "id_accuracy": 0.0},
    }
    rows = [
        {
            "layer": i,
            "bit_accuracy": 0.8 + i / 100,
            "id_accuracy": 0.4 + i / 100,
            "bit_accuracy_unseen_types": 0.6 + i / 100,
            "id_accuracy_unseen_types": i / 100,
        }
        for i in range(4)
    ]
    results = {name: {"layers": rows, "majority": majority} for name in ("learned", "binary16")}
    plot_probe(results, str(tmp_path / "probe.png"), seed=1)
    assert (tmp_path / "probe.png").stat().st_size > 1000
    assert "seed 1" in seen["title"]
    assert seen["ticks"] and all(float(tick).is_integer() for tick in seen["ticks"])
    # one shared line
    assert sum("majority" in label for label in seen["legend"]) == 1 and seen["floors"] == [0.65]


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
    assert len(result["blocks"]) == 2 and all(
        abs(row["increase"]) > 1e-6 for row in result["blocks"]
    )
    assert torch.equal(decoder(blocks[:2, :-1]), before)  # hooks removed
    assert layer_ablation(decoder, blocks, mode="mean")["loss"] == pytest.approx(result["loss"])


def test_cli_analyze_writes_json_and_png(tmp_path, corpus):
    fit_tiny(tmp_path / "run", corpus, 2, max_steps=2, interface=BinaryCodeInput)
    checkpoint = tmp_path / "run" / "ckpt" / "last.ckpt"
    for analysis in ("probe", "ablate"):
        args = ("--labels", "binary", "--blocks", "16", "--seed", "1", "--out", tmp_path / "out")
        run = run_cli("analyze", analysis, checkpoint, *args)
        assert run.returncode == 0, run.stderr[-2000:]
        assert (tmp_path / "out" / f"{analysis}.png").stat().st_size > 1000
    probe = json.loads((tmp_path / "out" / "probe.json").read_text())["binary"]
    assert probe["interface"] == "BinaryCodeInput"
    # the file the link resolved to
    assert (probe["checkpoint"], probe["update"]) == (
        str(checkpoint.resolve()),
        2,
    )
    assert (
        set(probe["majority"]) == {"position", "type"}
        and 0 <= probe["majority"]["type"]["bit_accuracy"] <= 1
    )
