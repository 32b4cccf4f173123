"""Training: every experiment YAML parses, `fixed-embed fit` runs, checkpoints rebuild and
resume exactly."""

import re
from pathlib import Path

import pytest
import torch

from fixed_embed.config import load_experiment
from fixed_embed.interfaces import GF2CodeInput
from fixed_embed.model.recipe import lr_at, steps_for_budget
from fixed_embed.train.module import LanguageModel
from tests.cli import print_config, run_cli
from tests.helpers import fit_tiny as _fit

ROOT = Path(__file__).resolve().parents[1]
# experiments/slurm/ holds SLURM job settings, not fit configs (tests/test_slurm.py parses them)
# experiments/study/plan.yaml holds the study's plans (experiments/plan/stages.py reads it)
EXPERIMENTS = sorted(
    p
    for p in (ROOT / "experiments").rglob("*.yaml")
    if p.parent.name != "slurm" and p != ROOT / "experiments" / "study" / "plan.yaml"
)


@pytest.mark.parametrize("config", EXPERIMENTS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_experiment_yaml_parses(config):
    parsed = print_config("--config", config)
    assert {"model", "data", "trainer"} <= parsed.keys()


def test_every_experiment_takes_its_callbacks_from_the_one_list():
    """experiments/callbacks.yaml names every callback once; each experiment runs them in its
    order, changing only their arguments (the study leaves the in-loop benchmark out), so a new
    monitor there reaches them all."""
    one_list = (ROOT / "experiments" / "callbacks.yaml").read_text()
    classes = re.findall(r"class_path: (callbacks\.\S+)", one_list)
    assert len(classes) >= 9
    for config in EXPERIMENTS:
        assert (
            config.name == "callbacks.yaml" or "class_path: callbacks." not in config.read_text()
        ), config
        callbacks = load_experiment(config).get("trainer", {}).get("callbacks")
        if callbacks is not None:
            study = "study" in config.relative_to(ROOT / "experiments").parts
            expected = [c for c in classes if not (study and c.endswith(".BenchmarkCallback"))]
            assert [c["class_path"] for c in callbacks] == expected, config


def test_a_later_config_changes_one_callback_by_name(tmp_path):
    """`--config VARIANT --config DELTA`: DELTA's named callbacks change or drop those of
    VARIANT, the rest stay."""
    delta = tmp_path / "delta.yaml"
    delta.write_text(
        "trainer:\n  callbacks:\n    benchmarks: null\n    gradients:\n      init_args: "
        "{every_n_steps: 3}\n"
    )
    parsed = print_config("--config", ROOT / "experiments" / "tiny" / "gf2.yaml", "--config", delta)
    callbacks = {
        c["class_path"].rsplit(".", 1)[1]: c.get("init_args", {})
        for c in parsed["trainer"]["callbacks"]
    }
    assert (
        "BenchmarkCallback" not in callbacks and callbacks["GradientMonitor"]["every_n_steps"] == 3
    )
    assert callbacks["CheckpointPolicy"]["every_n_steps"] == 100 and "SpeedMonitor" in callbacks


@pytest.mark.parametrize(
    ("devices", "world"),
    [(2, 4), ("3", 6), ("0,1", 4), ("2,", 2), ([0, 1, 2], 6), (-1, 2), ("-1", 2)],
)
def test_the_world_size_is_counted_as_lightning_counts_devices(devices, world):
    """A token budget resolves at every form of trainer.devices Lightning takes (-1: all, here
    the CPU's one)."""
    from fixed_embed.train.experiment import trainer_world_size

    assert trainer_world_size({"devices": devices, "num_nodes": 2, "accelerator": "cpu"}) == world


def test_paper_budget_gives_381470_updates():
    assert steps_for_budget(100_000_000_000, 2, 8, 8, 2048) == 381_470


def test_lr_schedule_formula():
    assert lr_at(0, 1.5e-4, 2000, 381_470, 0.1) == pytest.approx(1.5e-4 / 2000)
    assert lr_at(2000, 1.5e-4, 2000, 381_470, 0.1) == pytest.approx(1.5e-4)
    assert lr_at(381_470, 1.5e-4, 2000, 381_470, 0.1) == pytest.approx(1.5e-5)


# 2: reader processes
@pytest.mark.parametrize("workers", [0, pytest.param(2, marks=pytest.mark.slow)])
def test_resume_continues_with_the_next_batch_and_same_loss(tmp_path, corpus, workers):
    full, _ = _fit(tmp_path / "full", corpus, 9, workers)
    first, _ = _fit(tmp_path / "run", corpus, 3, workers)
    second, _ = _fit(
        tmp_path / "run", corpus, 6, workers, ckpt_path=str(tmp_path / "run" / "ckpt" / "last.ckpt")
    )
    third, model = _fit(
        tmp_path / "run", corpus, 9, workers, ckpt_path=str(tmp_path / "run" / "ckpt" / "last.ckpt")
    )
    resumed = first.batches + second.batches + third.batches
    assert len(resumed) == len(full.batches) == 9
    assert all(torch.equal(a, b) for a, b in zip(full.batches, resumed, strict=True))
    assert first.losses + second.losses + third.losses == pytest.approx(full.losses, rel=1e-5)
    assert model.tokens_seen == 9 * 4 * 16


def test_load_from_checkpoint_rebuilds_the_exact_interface(tmp_path, corpus):
    _, model = _fit(tmp_path, corpus, 2)
    loaded = LanguageModel.load_from_checkpoint(tmp_path / "ckpt" / "last.ckpt", map_location="cpu")
    assert isinstance(loaded.interface, GF2CodeInput)
    assert torch.equal(loaded.interface.code_matrix, model.interface.code_matrix)
    ids = torch.randint(0, 300, (2, 16))
    assert torch.allclose(loaded(ids), model.cpu()(ids))


def test_fixed_interface_is_not_in_the_optimizer_and_norms_do_not_decay():
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
    from fixed_embed.model.recipe import build_adamw

    optimizer = build_adamw(model, model.optimizer_config)
    decay, no_decay = optimizer.param_groups
    assert decay["weight_decay"] == 0.1 and no_decay["weight_decay"] == 0.0
    assert all(p.dim() == 2 for p in decay["params"]) and all(
        p.dim() == 1 for p in no_decay["params"]
    )
    n_opt = sum(p.numel() for g in optimizer.param_groups for p in g["params"])
    assert n_opt == sum(p.numel() for p in model.parameters()) and not list(
        model.interface.parameters()
    )


@pytest.mark.slow
def test_cli_fit_writes_checkpoint_and_tensorboard(tmp_path, corpus):
    data, tok = corpus
    result = run_cli(
        "fit",
        "--config",
        ROOT / "experiments/tiny/binary16.yaml",
        "--trainer.max_steps",
        "4",
        "--trainer.val_check_interval",
        "2",
        "--trainer.log_every_n_steps",
        "1",
        f"--trainer.logger.init_args.save_dir={tmp_path}/logs",
        "--model.decoder.vocab_size",
        "300",
        "--model.decoder.d_model",
        "32",
        "--model.decoder.n_heads",
        "4",
        "--model.decoder.ffn_dim",
        "64",
        "--model.decoder.max_seq_len",
        "256",
        "--data.seq_len",
        "32",
        f"--data.train={data}",
        f"--data.tokenizer={tok}",
        "--data.num_shards",
        "4",
        "--data.val_sequences",
        "4",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    version = tmp_path / "logs" / "tiny" / "binary16" / "default"
    assert (version / "checkpoints" / "last.ckpt").is_file()
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(version))
    events.Reload()
    losses = [e.value for e in events.Scalars("train/loss")]
    assert len(losses) == 4 and all(torch.isfinite(torch.tensor(losses)))
    assert "val/loss" in events.Tags()["scalars"] and "train/lr" in events.Tags()["scalars"]
    # constants: -1 (default_hp_metric: false), 0
    assert not {"hp_metric", "epoch"} & set(events.Tags()["scalars"])
    # the resolved config, as config.yaml holds it, in the text tab
    text = events.Tensors("config/text_summary")[0].tensor_proto.string_val[0].decode()
    assert "BinaryCodeInput" in text and "max_steps: 4" in text and text.startswith("    ")


@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_paper_config_composes_with_each_strategy(strategy):
    result = run_cli(
        "fit",
        "--config",
        ROOT / "experiments/paper/gf2.yaml",
        "--config",
        ROOT / f"experiments/strategies/{strategy}.yaml",
        "--print_config",
    )
    assert result.returncode == 0, result.stderr[-2000:]
    expected = {"ddp": "DDPStrategy", "fsdp": "FSDP2Strategy"}[strategy]
    assert expected in result.stdout and "GF2CodeInput" in result.stdout
    assert ("precision: 32-true" in result.stdout) == (strategy == "fsdp")
