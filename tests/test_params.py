"""`fixed-embed params`: the paper's exact parameter counts, built on the meta device."""

from pathlib import Path

import pytest
import yaml

from fixed_embed.train.experiment import parameter_reports
from tests.cli import run_cli

ROOT = Path(__file__).resolve().parents[1]
PAPER = ROOT / "experiments" / "paper"


@pytest.mark.parametrize(
    ("variant", "total", "removed"),
    [
        ("binary16", 1_711_376_384, 100_663_296),
        ("gf2", 1_711_376_384, 100_663_296),
        ("learned", 1_812_039_680, 0),
    ],
)
def test_paper_counts(variant, total, removed):
    _, report, control = parameter_reports(str(PAPER / f"{variant}.yaml"))
    assert report.total == report.trainable == total
    assert control.total == 1_812_039_680
    assert control.total - report.total == removed == 49152 * 2048 * (variant != "learned")
    assert report.head == 49152 * 2048


def test_command_prints_exact_numbers():
    result = run_cli("params", PAPER / "binary16.yaml")
    assert result.returncode == 0, result.stderr[-2000:]
    out = result.stdout
    assert "1,711,376,384" in out and "1,812,039,680" in out
    assert "100,663,296 (5.56 % of the control)" in out


def test_earlier_setting_v65536_d1024(tmp_path):
    decoder = {"vocab_size": 65536, "d_model": 1024, "n_heads": 16, "ffn_dim": 4096}
    interface = {"class_path": "fixed_embed.interfaces.BinaryCodeInput"}
    config = tmp_path / "small.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "__base__": str(PAPER / "base.yaml"),
                "model": {"decoder": decoder, "interface": interface},
            }
        )
    )
    _, report, control = parameter_reports(str(config))
    assert control.total - report.total == 67_108_864


def test_variants_differ_only_in_interface():
    bodies = [
        yaml.safe_load((PAPER / f"{v}.yaml").read_text()) for v in ("learned", "binary16", "gf2")
    ]
    for body in bodies:
        assert body.pop("__base__") == "base.yaml"
        assert list(body["model"]) == ["interface"]
        # besides the interface, only where the variant's logs go
        assert body.get("trainer", {}) in (
            {},
            {"logger": {"init_args": {"name": body["trainer"]["logger"]["init_args"]["name"]}}},
        )
        assert set(body) <= {"model", "trainer"}


@pytest.mark.parametrize(
    ("variant", "interface", "fixed_state"), [("gf2", 0, 16 * 16), ("learned", 49152 * 2048, 0)]
)
def test_module_costs_add_up_to_the_report(variant, interface, fixed_state):
    from fixed_embed.config import load_experiment
    from fixed_embed.model.accounting import module_costs, parameter_report
    from fixed_embed.train.experiment import build_model

    decoder = build_model(load_experiment(str(PAPER / f"{variant}.yaml"))["model"]).decoder
    rows = {row.name: row for row in module_costs(decoder)}
    report = parameter_report(decoder)
    assert list(rows) == ["interface", "layers", "norm", "head"]
    assert rows["interface"].trainable == interface and rows["interface"].fixed_state == fixed_state
    assert rows["interface"].flops_per_token == 0 and rows["layers"].kind == "24 x Block"
    assert sum(r.trainable for r in rows.values()) == report.trainable
    assert sum(r.flops_per_token for r in rows.values()) == report.flops_per_token


def test_model_summary_callback_table_shows_trainable_frozen_and_fixed():
    from rich.console import Console

    from callbacks.model_summary import summary_table
    from fixed_embed.interfaces import GF2CodeInput
    from fixed_embed.train.module import LanguageModel

    model = LanguageModel(
        decoder={
            "vocab_size": 300,
            "d_model": 32,
            "n_layers": 2,
            "n_heads": 4,
            "ffn_dim": 64,
            "max_seq_len": 16,
        },
        interface=GF2CodeInput,
    )
    model.decoder.norm.weight.requires_grad_(False)
    console = Console(width=200, record=True)
    console.print(summary_table(model))
    text = console.export_text()
    assert "GF2CodeInput" in text and "2 x Block" in text
    norm_row = next(line for line in text.splitlines() if " norm " in line)
    # trainable, frozen
    assert norm_row.split("│")[3].strip() == "0" and norm_row.split("│")[4].strip() == "32"
    interface_row = next(line for line in text.splitlines() if " interface " in line)
    # trainable, frozen, fixed state: the GF(2) code has no parameters, only its 9 x 9 matrix (V
    # 300: 9 bits)
    assert [cell.strip() for cell in interface_row.split("│")[3:6]] == ["0", "0", "81"]


@pytest.mark.parametrize(
    ("config", "interface_trainable"),
    [
        ("lowrank_learned", 8192 * 13),
        ("norm_matched_learned", 8192 * 192),
        ("random_full", 0),
        ("permuted", 0),
    ],
)
def test_controls_report_their_trainable_parameters(config, interface_trainable):
    _, report, control = parameter_reports(str(ROOT / "experiments" / "beyond" / f"{config}.yaml"))
    assert report.interface_trainable == interface_trainable
    assert control.total - report.total == 8192 * 192 - interface_trainable
