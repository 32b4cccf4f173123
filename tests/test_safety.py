"""Safe by default: files the project did not write never run code, and TensorBoard binds loopback.

Each test fails if a load turns unsafe: a pickled callable in a checkpoint (file or sharded
folder) must be refused with an error naming the file, a Python tag in a YAML config must be
refused, and a marker file that the payload would create must never appear.
"""

import ast
import os
import pickle
import re
import shutil
import subprocess
import warnings
from pathlib import Path

import pytest
import torch
import yaml

from fixed_embed.distributed.checkpoint import UnsafeCheckpointError, consolidate
from fixed_embed.evaluation.loading import load_checkpoint

ROOT = Path(__file__).resolve().parents[1]
SOURCES = ("fixed_embed", "callbacks", "experiments", "benchmarks")


class Payload:
    """Unpickling this runs ``touch marker``: what a hostile checkpoint would do."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


class Plain:
    """A harmless custom class: still not tensors and plain data, so refused too."""

    def __init__(self) -> None:
        self.value = 1


def payloads(marker: Path) -> dict:
    return {"reduce": Payload(marker), "callable": os.system, "instance": Plain()}


def assert_refused(error: pytest.ExceptionInfo, path: Path) -> None:
    message = str(error.value)
    assert str(path) in message
    assert "refused for safety" in message and "other than tensors and plain data" in message
    assert "weights_only=False" not in message and "set to `False`" not in message


def dcp_folder(folder: Path, state: dict, meta: dict | None = None) -> Path:
    """A sharded checkpoint folder as FSDP2 writes it: torch.distributed.checkpoint shards plus
    ``meta.pt``."""
    import torch.distributed.checkpoint as dcp

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "assuming the intent is to save in a single process"
        dcp.save(state, checkpoint_id=folder, no_dist=True)
    torch.save(
        {"global_step": 3, "hyper_parameters": {}} if meta is None else meta, folder / "meta.pt"
    )
    return folder


# -- (a) checkpoints ----------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["reduce", "callable", "instance"])
def test_a_checkpoint_file_with_pickled_objects_is_refused_and_runs_nothing(tmp_path, kind):
    marker = tmp_path / "marker"
    path = tmp_path / "hostile.ckpt"
    torch.save({"state_dict": {}, "hyper_parameters": {}, "x": payloads(marker)[kind]}, path)
    with pytest.raises(UnsafeCheckpointError) as error:
        load_checkpoint(path)
    assert_refused(error, path)
    assert not marker.exists()


def test_the_lm_eval_model_refuses_a_hostile_checkpoint_too(tmp_path):
    from fixed_embed.evaluation.lm_eval_model import FixedEmbedLM

    marker = tmp_path / "marker"
    path = tmp_path / "hostile.ckpt"
    torch.save({"state_dict": {}, "x": Payload(marker)}, path)
    with pytest.raises(UnsafeCheckpointError) as error:
        FixedEmbedLM(checkpoint=str(path), device="cpu")
    assert_refused(error, path)
    assert not marker.exists()


def test_a_good_sharded_folder_still_consolidates(tmp_path):
    weights = {"w": torch.randn(3, 4), "b": torch.zeros(2, dtype=torch.bfloat16)}
    optimizer = {
        "state": {0: {"step": torch.tensor(3.0)}},
        "param_groups": [{"lr": 0.1, "betas": (0.9, 0.95)}],
    }
    folder = dcp_folder(tmp_path / "last.ckpt", {"state_dict": weights, "optimizer_0": optimizer})
    checkpoint = consolidate(folder)
    assert checkpoint["global_step"] == 3 and "optimizer_0" not in checkpoint
    assert all(torch.equal(checkpoint["state_dict"][k], v) for k, v in weights.items())


@pytest.mark.parametrize("where", ["metadata", "meta.pt", "item"])
@pytest.mark.parametrize("entry", ["load_checkpoint", "consolidate"])
def test_a_sharded_folder_with_pickled_objects_is_refused_and_runs_nothing(tmp_path, where, entry):
    marker = tmp_path / "marker"
    state = {"state_dict": {"w": torch.ones(2)}}
    # a non-tensor item: torch's planner would torch.load it with weights_only=False
    if where == "item":
        state["evil"] = Payload(marker)
    folder = dcp_folder(tmp_path / "last.ckpt", state)
    # the DCP index, a plain pickle that torch.distributed.checkpoint would pickle.load
    if where == "metadata":
        (folder / ".metadata").write_bytes(pickle.dumps(Payload(marker)))
    if where == "meta.pt":
        torch.save({"global_step": 3, "x": Payload(marker)}, folder / "meta.pt")
    assert not marker.exists()  # saving ran nothing
    with pytest.raises(UnsafeCheckpointError) as error:
        load_checkpoint(folder) if entry == "load_checkpoint" else consolidate(
            folder, tmp_path / "one.ckpt"
        )
    named = {"metadata": folder / ".metadata", "meta.pt": folder / "meta.pt", "item": folder}[where]
    assert_refused(error, named)
    assert not marker.exists()
    assert not (tmp_path / "one.ckpt").exists()


# -- (b) YAML -----------------------------------------------------------------------------------

HOSTILE_YAML = 'model: !!python/object/apply:os.system ["touch {marker}"]\n'
TAG = re.escape("python/object/apply:os.system")


def test_the_experiment_yaml_loader_refuses_python_tags(tmp_path):
    from fixed_embed.config import expand_config_args, load_experiment

    marker = tmp_path / "marker"
    config = tmp_path / "hostile.yaml"
    config.write_text(HOSTILE_YAML.format(marker=marker))
    with pytest.raises(yaml.YAMLError, match=TAG):
        load_experiment(config)
    child = tmp_path / "child.yaml"  # the tag in a __base__, reached through the CLI's expansion
    child.write_text("__base__: hostile.yaml\n")
    with pytest.raises(yaml.YAMLError, match=TAG):
        expand_config_args(["--config", str(child)])
    assert not marker.exists()


def test_the_cli_yaml_loader_refuses_python_tags(tmp_path):
    import jsonargparse

    marker = tmp_path / "marker"
    with pytest.raises(yaml.YAMLError):
        jsonargparse.get_loader("yaml")(HOSTILE_YAML.format(marker=marker))
    assert not marker.exists()


def test_fit_refuses_a_config_with_python_tags(tmp_path, capsys, monkeypatch):
    from fixed_embed.cli import main

    monkeypatch.setattr("sys.argv", ["fixed-embed"])
    marker = tmp_path / "marker"
    config = tmp_path / "hostile.yaml"
    config.write_text(HOSTILE_YAML.format(marker=marker))
    with pytest.raises(SystemExit) as exit_:
        main(["fit", "--config", str(config)])
    assert exit_.value.code not in (0, None)
    assert "python/object/apply:os.system" in capsys.readouterr().err
    assert not marker.exists()


# -- (c) static: every load in the source tree stays safe ---------------------------------------


def python_files() -> list[Path]:
    return sorted(
        p for folder in SOURCES for p in (ROOT / folder).rglob("*.py") if ".venv" not in p.parts
    )


def dotted(node: ast.AST) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return f"{dotted(node.value)}.{node.attr}"
    return ""


def test_every_load_in_the_source_tree_is_safe():
    files = python_files()
    assert len(files) > 20 and ROOT / "fixed_embed" / "evaluation" / "loading.py" in files
    problems, torch_loads = [], 0
    for path in files:
        where = path.relative_to(ROOT)
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom):
                names = {alias.name for alias in node.names}
                if node.module == "torch" and "load" in names:
                    problems.append(f"{where}:{node.lineno}: from torch import load")
                if node.module == "yaml" and names & {
                    "load",
                    "unsafe_load",
                    "full_load",
                    "Loader",
                    "UnsafeLoader",
                }:
                    problems.append(f"{where}:{node.lineno}: unsafe yaml import {sorted(names)}")
                if "dcp_to_torch_save" in names:
                    problems.append(
                        f"{where}:{node.lineno}: dcp_to_torch_save unpickles .metadata (use "
                        "consolidate)"
                    )
            if not isinstance(node, ast.Call):
                continue
            name = dotted(node.func)
            keywords = {k.arg: k.value for k in node.keywords}
            if name == "torch.load":
                torch_loads += 1
                value = keywords.get("weights_only")
                if not (isinstance(value, ast.Constant) and value.value is True):
                    problems.append(f"{where}:{node.lineno}: torch.load without weights_only=True")
            if name in (
                "yaml.load",
                "yaml.unsafe_load",
                "yaml.full_load",
                "yaml.load_all",
                "yaml.unsafe_load_all",
            ):
                problems.append(f"{where}:{node.lineno}: {name} (use yaml.safe_load)")
            if name in ("pickle.load", "pickle.loads", "dill.load", "dill.loads", "marshal.loads"):
                problems.append(f"{where}:{node.lineno}: {name} on a file")
            remote = keywords.get("trust_remote_code")
            if remote is not None and not (
                isinstance(remote, ast.Constant) and remote.value is False
            ):
                problems.append(f"{where}:{node.lineno}: trust_remote_code not False")
    # data/block_cache.py and distributed/checkpoint.py: the checker still sees them
    assert torch_loads >= 3
    texts = {p.relative_to(ROOT): p.read_text() for p in files}
    texts |= {
        p.relative_to(ROOT): p.read_text()
        for folder in SOURCES
        for p in (ROOT / folder).rglob("*.yaml")
    }
    for where, text in texts.items():
        for pattern in (
            r"trust_remote_code\s*[=:]\s*[Tt]rue",
            r"weights_only\s*=\s*False",
            r"yaml\.unsafe_load",
        ):
            problems += [f"{where}: {m.group(0)}" for m in re.finditer(pattern, text)]
    assert not problems, "\n".join(problems)


def test_eval_hf_builds_the_model_without_remote_code(tmp_path, monkeypatch):
    import lm_eval.api.registry
    from lm_eval.utils import simple_parse_args_string

    from fixed_embed.cli import eval as eval_cli

    seen = []

    class Stop(Exception):
        pass

    class FakeHF:
        @classmethod
        def create_from_arg_string(cls, arg_string, additional_config=None):
            seen.append(arg_string)
            raise Stop

    monkeypatch.setattr(lm_eval.api.registry, "get_model", lambda name: FakeHF)
    # offline here: hellaswag's data is absent
    monkeypatch.setattr(eval_cli, "check_task_data", lambda *args: None)
    with pytest.raises(Stop):
        eval_cli.run(
            [
                "eval",
                "--hf",
                "someone/model",
                "--tasks",
                "hellaswag",
                "--output",
                str(tmp_path / "out"),
            ]
        )
    assert simple_parse_args_string(seen[0])["trust_remote_code"] is False


# -- (d) TensorBoard binds loopback by default --------------------------------------------------


def make_n(*args: str) -> list[str]:
    if shutil.which("make") is None:
        pytest.skip("make not installed")
    # the environment must not widen the bind
    env = {
        **os.environ,
        "HOST": "0.0.0.0",
        "PORT": "6999",
    }
    run = subprocess.run(
        ["make", "-n", "tensorboard", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 0, run.stderr
    return run.stdout.splitlines()


def tensorboard_line(lines: list[str]) -> str:
    found = [line for line in lines if re.search(r"tensorboard\s+--logdir", line)]
    assert len(found) == 1, lines
    return found[0]


def warning_of(lines: list[str]) -> str:
    """What the target's loopback check prints on stderr (only the ``case`` line runs: nothing
    else)."""
    check = [line for line in lines if line.startswith("case ")]
    assert len(check) == 1, lines
    return subprocess.run(["sh", "-c", check[0]], capture_output=True, text=True, timeout=30).stderr


@pytest.mark.slow
def test_make_tensorboard_binds_loopback_by_default():
    lines = make_n()
    command = tensorboard_line(lines)
    assert "--bind_all" not in command
    assert re.search(r"--host 127\.0\.0\.1 --port 6006\s*$", command), command
    assert warning_of(lines) == ""


@pytest.mark.slow
@pytest.mark.parametrize("host", ["127.0.0.1", "127.0.1.1", "localhost", "::1"])
def test_make_tensorboard_is_quiet_on_loopback(host):
    assert warning_of(make_n(f"HOST={host}")) == ""


@pytest.mark.slow
def test_make_tensorboard_serves_others_only_on_request_and_warns():
    lines = make_n("HOST=0.0.0.0", "PORT=6010")
    command = tensorboard_line(lines)
    assert "--bind_all" not in command and re.search(
        r"--host 0\.0\.0\.0 --port 6010\s*$", command
    ), command
    warning = warning_of(lines)
    assert len(warning.strip().splitlines()) == 1
    assert (
        "0.0.0.0" in warning
        and "unauthenticated" in warning
        and "logs, configs and benchmark outputs" in warning
    )
