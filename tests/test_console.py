"""The console: this project's lines and a progress bar counting updates; the rest in the run's
console.log."""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import lightning as L
import pytest

from callbacks.progress import UpdateProgressBar
from fixed_embed.data import TextDataModule
from fixed_embed.train.module import LanguageModel
from tests.helpers import TINY_DECODER

ROOT = Path(__file__).resolve().parents[1]

ROUTING = """
import logging, sys, warnings
from pathlib import Path
from tqdm import tqdm
from fixed_embed.run import console

console.setup("fit")
import lightning  # adds its own stderr handler when imported: refused
from lightning.pytorch.utilities import rank_zero_info

def ours(code):  # code that runs from a file of this project, as its callbacks do
    path = str(Path(console.__file__).with_name("some_module.py"))
    exec(compile(code, path, "exec"), {"rank_zero_info": rank_zero_info})

ours("rank_zero_info('Training length: 6 updates')")
# Lightning's own notice (not this project's code)
rank_zero_info("GPU available: False, used: False")
library = logging.getLogger("transformers")
library.addHandler(logging.StreamHandler())  # as transformers does on import
library.propagate = False
library.warning("a transformers notice")
logging.getLogger("lm_eval.evaluator").warning("Overwriting default num_fewshot")
logging.getLogger("lm_eval").error("an lm-eval error")
for module, category, _ in console.HARMLESS_WARNINGS[:3]:
    text = {
        "torchdata.stateful_dataloader.stateful_dataloader":
            "'set_vital' is deprecated, please do not call",
        "lightning.pytorch.utilities._pytree": "`isinstance(treespec, LeafSpec)` is deprecated, "
            "use `isinstance(treespec, TreeSpec) and treespec.is_leaf()` instead.",
        "lightning.pytorch.utilities.data": "Your `IterableDataset` has `__len__` defined. In "
            "combination with multi-process data loading (when num_workers > 1), `__len__` could "
            "be inaccurate if each worker is not configured independently to avoid having "
            "duplicate data."}[module]
    file = module.replace(".", "/") + ".py"
    warnings.warn_explicit(text, category, file, 1, module=module)  # dropped
    warnings.warn_explicit(text + " (and more)", category, file, 2, module=module)
    warnings.warn_explicit(text, category, "elsewhere.py", 3, module="elsewhere")
ours("import warnings; warnings.warn('the checkpoint policy may need 9 GB')")
for _ in tqdm(range(3), desc="lm-eval bar"):
    pass
print("stdout untouched")
console.attach_run_folder(sys.argv[1])
rank_zero_info("`Trainer.fit` stopped: `max_steps=6` reached.")
"""


@pytest.mark.slow
def test_the_console_shows_this_projects_lines_and_the_log_file_has_everything(tmp_path):
    run = subprocess.run(
        [sys.executable, "-c", ROUTING, str(tmp_path)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr
    assert run.stdout == "stdout untouched\n"
    assert run.stderr.splitlines() == [
        "Training length: 6 updates",
        "error: an lm-eval error",
        "UserWarning: the checkpoint policy may need 9 GB",
    ]
    log = (tmp_path / "console.log").read_text()
    for line in (
        "Training length: 6 updates",
        "GPU available: False",
        "a transformers notice",
        "Overwriting default num_fewshot",
        "an lm-eval error",
        "the checkpoint policy may need 9 GB",
        "lm-eval bar: 100%",
        "3/3",
        "`Trainer.fit` stopped",
    ):
        assert line in log, line
    assert log.count("lm-eval bar") == 1  # the bar's final state, once
    # Harmless warnings: dropped by exact text and module; the same text elsewhere, or more text,
    # is logged.
    assert "set_vital' is deprecated, please do not call (torchdata" not in log
    assert (
        log.count("'set_vital' is deprecated") == 2 and log.count("LeafSpec)` is deprecated") == 2
    )
    assert log.count("`__len__` defined") == 2 and "(and more)" in log and "elsewhere.py:3" in log
    assert not list(tmp_path.glob("logs/*"))  # attached: no fallback file


@pytest.mark.slow
def test_a_command_without_a_run_folder_logs_to_logs_command_log(tmp_path):
    code = (
        "import logging, sys; sys.argv[0] = 'fixed-embed'; from fixed_embed.run import console; "
        "console.setup('eval'); logging.getLogger('lm_eval').info('x')"
    )
    run = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, timeout=60
    )
    assert run.returncode == 0 and run.stderr == "", run.stderr
    assert "lm_eval: x" in (tmp_path / "logs" / "eval.log").read_text()


class BarProbe(L.Callback):
    def __init__(self):
        self.seen = []

    def on_train_batch_end(self, trainer, *args):
        task = trainer.progress_bar_callback.train_progress_bar
        self.seen.append((task.description, task.total, task.completed))


def _fit_with_bar(tmp_path, corpus, caplog, watcher: L.Callback, **settings) -> L.Trainer:
    """A tiny fit with the UpdateProgressBar (and ``watcher``), INFO records captured; its
    trainer."""
    data, tok = corpus
    L.seed_everything(0)
    model = LanguageModel(
        decoder=TINY_DECODER, schedule={"warmup_steps": 2}, optimizer={"lr": 1e-2}
    )
    dm = TextDataModule(
        train=str(data),
        tokenizer=str(tok),
        seq_len=16,
        batch_size=4,
        num_shards=4,
        shuffle_buffer=8,
        val_sequences=4,
        holdout_per_mille=100,
    )
    trainer = L.Trainer(
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_model_summary=False,
        default_root_dir=tmp_path,
        check_val_every_n_epoch=None,
        num_sanity_val_steps=0,
        callbacks=[UpdateProgressBar(), watcher],
        **settings,
    )
    with caplog.at_level("INFO"):
        trainer.fit(model, dm)
    return trainer


def test_the_bar_counts_updates_of_max_steps_and_each_validation_is_one_line(
    tmp_path, corpus, caplog
):
    probe = BarProbe()
    _fit_with_bar(
        tmp_path,
        corpus,
        caplog,
        probe,
        max_steps=4,
        accumulate_grad_batches=2,
        val_check_interval=4,
    )
    # micro-batches, updates
    assert probe.seen == [("update", 4, n) for n in (0, 1, 1, 2, 2, 3, 3, 4)]
    lines = [r.getMessage() for r in caplog.records if r.pathname.endswith("progress.py")]
    assert [line.split(":")[0] for line in lines] == [
        "validation at update 2",
        "validation at update 4",
    ]
    assert "val/loss" in lines[0] and "val/ppl" in lines[0]


class LastBar(L.Callback):
    def on_fit_end(self, trainer, *args):  # before the bar's teardown
        self.metrics = trainer.progress_bar_callback.train_progress_bar.fields["metrics"]


def test_off_a_terminal_the_bar_is_a_line_per_logging_interval_and_ends_on_the_last_validation(
    tmp_path, corpus, caplog, monkeypatch
):
    import rich.console

    # a batch job's log
    monkeypatch.setattr(rich.console.Console, "is_terminal", property(lambda self: False))
    last = LastBar()
    trainer = _fit_with_bar(
        tmp_path, corpus, caplog, last, max_steps=6, val_check_interval=3, log_every_n_steps=2
    )
    lines = [r.getMessage() for r in caplog.records if r.pathname.endswith("progress.py")]
    updates = [line for line in lines if line.startswith("update ")]
    assert [line.split(":")[0] for line in updates] == ["update 2/6", "update 4/6", "update 6/6"]
    for line in updates:
        assert all(part in line for part in ("train/loss: ", ", lr ", " tokens/s, ", " left")), line
    assert "val/loss" in updates[1] and lines[-1].startswith("validation at update 6")
    # the last validation ran after update 6's line was read: the bar shows its figures, not update
    # 3's
    assert f"val/loss: {float(trainer.callback_metrics['val/loss']):.3g}" in last.metrics


@pytest.mark.slow
def test_a_tiny_fit_console_is_quiet(tmp_path, corpus):
    data, tok = corpus
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "fixed_embed",
            "fit",
            "--config",
            str(ROOT / "experiments/tiny/binary16.yaml"),
            "--trainer.max_steps",
            "4",
            f"--trainer.logger.init_args.save_dir={tmp_path}/logs",
            "--run",
            "quiet",
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
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=600,
        env={**os.environ, "HF_DATASETS_CACHE": str(tmp_path / "hf")},
    )
    console = run.stdout + run.stderr
    assert run.returncode == 0, console[-3000:]
    for shown in (
        "Training length: trainer.max_steps = 4 updates",
        "LanguageModel with BinaryCodeInput",
        "checkpoint at update 4:",
        "BenchmarkCallback at step 4:",
        "update ",
        "4/4",
    ):
        assert shown in console, shown
    for hidden in (
        "Tip",
        "set_vital",
        "LeafSpec",
        "__len__",
        "Epoch",
        "GPU available",
        "it/s]",
        "num_fewshot",
        "INFO",
        "PossibleUserWarning",
    ):
        assert hidden not in console, hidden
    log = (tmp_path / "logs" / "tiny" / "binary16" / "quiet" / "console.log").read_text()
    for logged in (
        "GPU available",
        "Tip",
        "num_fewshot",
        "loglikelihood: 100%",
        "Tokenizing inputs: 100%",
    ):
        assert logged in log, logged
    assert "set_vital" not in log and "LeafSpec" not in log
    assert textwrap.dedent(console).count("\n") <= 30
