"""eval and export never replace earlier outputs silently: a default eval folder per checkpoint
and evaluation, refusals before any model is loaded, ``--overwrite`` replacing an export whole."""

from pathlib import Path

import pytest

from fixed_embed.cli import main
from fixed_embed.data.tokenizer import load_tokenizer
from fixed_embed.errors import ConfigError, DataError, OutputExistsError
from fixed_embed.evaluation.suite import default_eval_dir
from tests.test_user_errors import cli

# -- 4. eval and export never replace earlier outputs silently
# ------------------------------------------------


def test_default_eval_folder_is_unique_per_checkpoint_and_evaluation(tmp_path):
    run0 = tmp_path / "logs" / "tiny" / "gf2" / "version_0" / "checkpoints" / "last.ckpt"
    run1 = tmp_path / "logs" / "tiny" / "gf2" / "version_1" / "checkpoints" / "last.ckpt"
    other_root = (
        tmp_path / "elsewhere" / "logs" / "tiny" / "gf2" / "version_0" / "checkpoints" / "last.ckpt"
    )
    a = default_eval_dir(run0, "offline")
    assert a.parent.as_posix() == "logs/eval" and a.name.startswith(
        "tiny-gf2-version_0-last-offline-"
    )
    assert len({a, default_eval_dir(run1, "offline"), default_eval_dir(other_root, "offline")}) == 3
    # stable: the same evaluation finds its folder again
    assert default_eval_dir(run0, "offline") == a
    assert default_eval_dir(run0, "paper") != a
    assert "-limit4-" in default_eval_dir(run0, "offline", limit=4).name
    assert "piqa+arc_easy-5shot" in default_eval_dir(run0, None, ["piqa", "arc_easy"], 5).name
    hub = default_eval_dir("HuggingFaceTB/SmolLM2-135M", "paper", hub=True)
    assert hub.name.startswith("HuggingFaceTB_SmolLM2-135M-paper-")


def test_two_runs_of_one_name_in_different_folders_get_different_labels(tmp_path, monkeypatch):
    from fixed_embed.evaluation.suite import run_label

    monkeypatch.chdir(tmp_path)
    demo, own = (
        tmp_path / "logs" / run / "default" / "checkpoints" / "step=00000300.ckpt"
        for run in ("demo/tiny/gf2", "tiny/gf2")
    )
    assert run_label(demo) == "logs/demo/tiny/gf2/default/step=00000300.ckpt"
    assert run_label(own) == "logs/tiny/gf2/default/step=00000300.ckpt"
    assert (
        run_label("/elsewhere/logs/tiny/gf2/default/checkpoints/last.ckpt")
        == "tiny/gf2/default/last.ckpt"
    )


def test_eval_refuses_tasks_whose_data_cannot_be_loaded_before_loading_the_model(tmp_path, capsys):
    from tests.test_offline_tasks import MISSING_TASK

    tasks = tmp_path / "tasks"
    tasks.mkdir()
    (tasks / "gone.yaml").write_text(
        MISSING_TASK.format(name="gone_local_task", path=tmp_path / "missing.jsonl")
    )
    missing = tmp_path / "missing.ckpt"  # never read: the refusal comes first
    message = cli(
        [
            "eval",
            str(missing),
            "--tasks",
            "gone_local_task",
            "--include-path",
            str(tasks),
            "--output",
            str(tmp_path / "out"),
        ],
        capsys,
        DataError,
    )
    assert "gone_local_task: " in message and "--suite offline" in message
    assert (
        "fixed-embed prefetch --tasks gone_local_task" in message
        and "checkpoint not found" not in message
    )
    assert len(message.strip().splitlines()) <= 2  # the line, and where --debug shows more


def test_fit_of_a_gpu_config_is_refused_on_a_machine_without_one_before_any_work(
    tmp_path, capsys, monkeypatch
):
    from fixed_embed.cli import train

    monkeypatch.setattr(train, "num_cuda_devices", lambda: 0)
    monkeypatch.chdir(tmp_path)
    config = Path(__file__).resolve().parents[1] / "experiments" / "paper" / "gf2.yaml"
    message = cli(["fit", "--config", str(config)], capsys, ConfigError)
    assert (
        "error: trainer.accelerator gpu needs a CUDA GPU, none is visible here"
        in message.splitlines()[0]
    )
    assert (
        "experiments/tiny/*.yaml or --trainer.accelerator cpu --trainer.precision 32-true"
        in message
    )
    assert not list(tmp_path.iterdir())  # no run folder, no logs/


def test_eval_refuses_to_replace_results(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    ckpt = tmp_path / "logs" / "tiny" / "gf2" / "version_0" / "checkpoints" / "last.ckpt"
    out = tmp_path / "eval"
    out.mkdir()
    (out / "results.json").write_text("{}")
    message = cli(
        ["eval", str(ckpt), "--suite", "offline", "--output", str(out)], capsys, OutputExistsError
    )
    assert f"{out / 'results.json'} already exists" in message and "--output DIR" in message
    assert "--overwrite" in message and len(message.strip().splitlines()) <= 2
    default = default_eval_dir(ckpt, "offline")
    default.mkdir(parents=True)
    (default / "results.json").write_text("{}")
    message = cli(["eval", str(ckpt), "--suite", "offline"], capsys, OutputExistsError)
    assert str(default / "results.json") in message
    assert (default / "results.json").read_text() == "{}"  # untouched
    # --overwrite gets past the check (and then fails on the missing checkpoint, not on the folder)
    try:
        main(["eval", str(ckpt), "--suite", "offline", "--output", str(out), "--overwrite"])
        message = capsys.readouterr().err
    except Exception as error:  # a FileNotFoundError, unless loading raises a user error
        message = str(error)
    assert "checkpoint not found" in message and "already exists" not in message


def test_export_refuses_non_empty_folder(tmp_path, capsys):
    out = tmp_path / "hf"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    message = cli(["export", str(tmp_path / "missing.ckpt"), str(out)], capsys, OutputExistsError)
    assert f"export folder {out} exists and is not empty" in message and "--overwrite" in message
    message = cli(["export", str(tmp_path / "missing.ckpt"), str(out), "--overwrite"], capsys)
    # --overwrite never deletes a folder that is not an export
    assert "is not an earlier export" in message
    assert (out / "notes.txt").read_text() == "mine"


def test_export_overwrite_replaces_an_earlier_export_whole(tmp_path, corpus):
    pytest.importorskip("transformers")
    from fixed_embed.evaluation.export import export_llama
    from fixed_embed.train.module import LanguageModel
    from tests.helpers import TINY_DECODER

    model = LanguageModel(decoder=TINY_DECODER).eval()
    tokenizer = load_tokenizer(corpus[1])
    out = export_llama(model, tokenizer, tmp_path / "hf")
    (out / "stale.bin").write_bytes(b"old")
    with pytest.raises(OutputExistsError, match="--overwrite"):
        export_llama(model, tokenizer, out)
    export_llama(model, tokenizer, out, overwrite=True)
    assert (out / "fixed_embed.json").is_file() and not (out / "stale.bin").exists()
    # no temporary folders left
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".hf.")]
