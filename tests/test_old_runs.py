"""Runs written before the layered tree (main at 1c25064): their checkpoint resumes and
evaluates, and their saved config, which names classes by the old module paths, is refused in
one line naming each class's new path."""

import importlib
import re
import shutil
from pathlib import Path

import pytest
import torch
import yaml

from fixed_embed.config import PUBLIC_PACKAGES, load_experiment
from fixed_embed.errors import ConfigError
from fixed_embed.evaluation.lm_eval_model import FixedEmbedLM
from fixed_embed.evaluation.loading import load_checkpoint
from tests.cli import run_cli

# tiny binary16, V 512, d 32, one block, update 2
OLD_RUN = Path(__file__).parent / "fixtures" / "main-1c25064"
CHECKPOINT = OLD_RUN / "step=00000002.ckpt"


def small_config(tmp_path: Path) -> Path:
    """The experiment that wrote the checkpoint, named by today's paths."""
    saved = yaml.safe_load((OLD_RUN / "config.yaml").read_text())
    callbacks = {"benchmarks": None, "checkpointing": {"init_args": {"every_n_steps": 3}}}
    logger = {"init_args": {"save_dir": str(tmp_path)}}
    data = ("tokenizer_vocab_size", "seq_len", "batch_size", "val_sequences")
    experiment = {
        "__base__": str(Path(__file__).parents[1] / "experiments" / "tiny" / "binary16.yaml"),
        "trainer": {
            "max_steps": 3,
            "val_check_interval": 3,
            "logger": logger,
            "callbacks": callbacks,
        },
        "model": {"decoder": saved["model"]["decoder"]},
        "data": {key: saved["data"][key] for key in data},
    }
    config = tmp_path / "small.yaml"
    config.write_text(yaml.safe_dump(experiment))
    return config


def test_a_checkpoint_written_before_the_move_resumes_to_its_next_update(tmp_path):
    ckpt = tmp_path / "old.ckpt"
    shutil.copy(CHECKPOINT, ckpt)
    result = run_cli("fit", "--config", small_config(tmp_path), "--ckpt_path", ckpt)
    assert result.returncode == 0, result.stderr[-3000:]
    written = sorted(tmp_path.rglob("step=00000003.ckpt"))
    assert written, result.stderr[-3000:]
    state = torch.load(written[0], map_location="cpu", weights_only=True)
    assert state["global_step"] == 3 and state["hyper_parameters"]["interface"][
        "class_path"
    ].endswith("BinaryCodeInput")


def test_a_checkpoint_written_before_the_move_evaluates():
    model, tokenizer = load_checkpoint(CHECKPOINT)
    assert model.provenance["update"] == 2
    lm = FixedEmbedLM(module=model, tokenizer_object=tokenizer, batch_size=2)
    [(score, _)] = lm._loglikelihood_tokens([(None, [1, 2, 3], [4, 5])], disable_tqdm=True)
    assert -50 < score < 0


def test_a_saved_config_naming_a_moved_class_is_refused_in_one_line_naming_its_new_path(tmp_path):
    result = run_cli("fit", "--config", OLD_RUN / "config.yaml")
    assert result.returncode == 2
    [line] = [line for line in result.stderr.splitlines() if "has moved" in line]
    assert (
        "fixed_embed.checkpoint_io.AtomicCheckpointIO has moved to "
        "fixed_embed.distributed.AtomicCheckpointIO" in line
    )
    assert "Traceback" not in result.stderr


def public_classes(package: str) -> list[str]:
    module = importlib.import_module(package)
    return list(
        getattr(module, "_HOMES", None)
        or [n for n, v in vars(module).items() if isinstance(v, type)]
    )


@pytest.mark.parametrize("package", PUBLIC_PACKAGES)
def test_every_public_class_named_by_a_module_that_is_gone_is_refused_naming_its_package_path(
    tmp_path, package
):
    names = public_classes(package)
    assert len(names) >= 2
    for name in names:
        config = tmp_path / f"{name}.yaml"
        config.write_text(
            yaml.safe_dump({"model": {"interface": {"class_path": f"{package}.moved_away.{name}"}}})
        )
        with pytest.raises(
            ConfigError, match=rf"has moved to {re.escape(package)}\.{name}; change it in the file"
        ):
            load_experiment(config)


def test_a_config_naming_two_moved_classes_is_refused_in_one_line_naming_both(tmp_path):
    # experiments/strategies/fsdp.yaml and a base as main wrote them before the move
    config = tmp_path / "fsdp.yaml"
    config.write_text(
        "trainer:\n  strategy:\n    class_path: fixed_embed.fsdp.FSDP2Strategy\n"
        "  plugins:\n  - class_path: fixed_embed.checkpoint_io.AtomicCheckpointIO\n"
    )
    with pytest.raises(ConfigError) as refused:
        load_experiment(config)
    [line] = str(refused.value).splitlines()
    assert (
        "fixed_embed.fsdp.FSDP2Strategy has moved to fixed_embed.distributed.FSDP2Strategy; "
        in line
    )
    assert (
        "fixed_embed.checkpoint_io.AtomicCheckpointIO has moved to "
        "fixed_embed.distributed.AtomicCheckpointIO" in line
    )
