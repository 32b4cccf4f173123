"""Evaluation: the export equals the model, our lm-eval scores equal lm-eval's hf backend, the
CLI and its errors."""

import json
from pathlib import Path

import pytest
import torch

from fixed_embed.cli import main
from fixed_embed.data.tokenizer import load_tokenizer
from fixed_embed.evaluation.export import export_llama
from fixed_embed.evaluation.lm_eval_model import FixedEmbedLM
from fixed_embed.evaluation.loading import load_checkpoint
from fixed_embed.evaluation.suite import TABLE_NOTES, Column, markdown_table, run_suite
from fixed_embed.interfaces import BinaryCodeInput, GF2CodeInput, LearnedInput
from fixed_embed.train.module import LanguageModel
from tests.cli import run_cli
from tests.helpers import TINY_DECODER, fit_tiny

ROOT = Path(__file__).resolve().parents[1]
TASKS = ["fixed_embed_word_order", "fixed_embed_docs_ppl"]


@pytest.fixture(autouse=True)
def datasets_cache_in_tmp(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "hf-datasets"))


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory, corpus):
    """A briefly trained GF(2) model with a 256-token context (long enough for the offline
    tasks)."""
    folder = tmp_path_factory.mktemp("trained")
    fit_tiny(folder, corpus, 3, max_steps=3, decoder={"max_seq_len": 256})
    return folder / "ckpt" / "last.ckpt"


@pytest.mark.parametrize("interface", [LearnedInput, BinaryCodeInput, GF2CodeInput])
def test_exported_llama_gives_the_same_logits(tmp_path, corpus, interface):
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    model = LanguageModel(decoder={**TINY_DECODER, "n_kv_heads": 2}, interface=interface).eval()
    out = export_llama(model, load_tokenizer(corpus[1]), tmp_path / "hf")
    hf = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    ids = torch.randint(0, 300, (2, 16))
    ids[0, :5] = 0  # token 0: the all-zero code
    with torch.no_grad():
        assert (hf(ids).logits - model(ids)).abs().max() < 1e-4
    assert json.loads((out / "fixed_embed.json").read_text())["interface"] == model.interface.spec()
    with pytest.raises(FileExistsError, match="not empty"):
        export_llama(model, load_tokenizer(corpus[1]), out)


def _leaves(value):
    if isinstance(value, (list, tuple)):
        return [leaf for item in value for leaf in _leaves(item)]
    return [value]


def _samples(results, task):
    """Every per-request score (floats) and greedy flag (bools), in lm-eval's sample order."""
    leaves = _leaves([s["resps"] for s in results["samples"][task]])
    return [x for x in leaves if not isinstance(x, bool)], [
        x for x in leaves if isinstance(x, bool)
    ]


def test_scores_equal_lm_eval_hf_backend_on_the_export(tmp_path, checkpoint):
    import lm_eval
    from lm_eval.tasks import TaskManager

    from fixed_embed.evaluation.tasks import tasks_dir

    model, tokenizer = load_checkpoint(checkpoint)
    export_llama(model, tokenizer, tmp_path / "hf")
    manager = TaskManager(include_path=str(tasks_dir()))
    common = {"tasks": TASKS, "task_manager": manager, "limit": 8, "log_samples": True}
    ours = lm_eval.simple_evaluate(
        model=FixedEmbedLM(str(checkpoint), batch_size=3, device="cpu"), **common
    )
    hf = lm_eval.simple_evaluate(
        model="hf",
        model_args=f"pretrained={tmp_path / 'hf'},dtype=float32",
        batch_size=3,
        device="cpu",
        **common,
    )
    for task in TASKS:
        (scores, greedy), (hf_scores, hf_greedy) = _samples(ours, task), _samples(hf, task)
        assert len(scores) == len(hf_scores) >= 8 and greedy == hf_greedy
        assert scores == pytest.approx(hf_scores, rel=1e-5), task


class _Request:
    def __init__(self, *args):
        self.args = args


def test_batching_limits_and_token_zero(checkpoint):
    lm = FixedEmbedLM(str(checkpoint), batch_size=3, device="cpu")
    sizes = []
    forward = lm._logits
    lm._logits = lambda inputs: sizes.append(len(inputs)) or forward(inputs)
    requests = [_Request("alpha beta", f" gamma{' delta' * i}") for i in range(7)]
    scores = lm.loglikelihood(requests, disable_tqdm=True)
    assert sizes == [3, 3, 1] and len(scores) == 7
    # Sorting for batching must not reorder the answers: each equals its own single-request score.
    assert [s for s, _ in scores] == pytest.approx(
        [lm.loglikelihood([r], disable_tqdm=True)[0][0] for r in requests]
    )
    eos = "<|endoftext|>"
    ((score, _),) = lm.loglikelihood([_Request(eos * 40, eos * 5)], disable_tqdm=True)
    assert torch.isfinite(torch.tensor(score))
    long_context = " ".join(["alpha"] * 400)  # > 256 tokens: truncated from the left, still scored
    assert torch.isfinite(
        torch.tensor(lm.loglikelihood([_Request(long_context, " beta")], disable_tqdm=True)[0][0])
    )


def test_generate_until_is_greedy_and_stops(checkpoint):
    lm = FixedEmbedLM(str(checkpoint), batch_size=4, device="cpu")
    context = "alpha beta gamma"
    [text] = lm.generate_until(
        [_Request(context, {"until": ["zzz"], "max_gen_toks": 6})], disable_tqdm=True
    )
    ids = lm.tok_encode(context)
    with torch.no_grad():
        for _ in range(6):
            ids.append(int(lm.module(torch.tensor([ids]))[0, -1].argmax()))
    assert text == lm.tok_decode(ids[-6:]).split("<|endoftext|>")[0]
    if text.strip():
        stop = text.strip().split()[0]
        [cut] = lm.generate_until(
            [_Request(context, {"until": [stop], "max_gen_toks": 6})], disable_tqdm=True
        )
        assert stop not in cut and text.startswith(cut)
    with pytest.raises(ValueError, match="greedily"):
        lm.generate_until(
            [_Request(context, {"do_sample": True, "temperature": 1.0})], disable_tqdm=True
        )


def test_cli_eval_writes_results_and_table_and_merges(tmp_path, checkpoint):
    out = tmp_path / "eval"
    run = run_cli(
        "eval",
        checkpoint,
        "--suite",
        "offline",
        "--limit",
        "4",
        "--batch-size",
        "2",
        "--device",
        "cpu",
        "--output",
        out,
        "--name",
        "tiny-gf2",
    )
    assert run.returncode == 0, run.stderr[-3000:]
    results = json.loads((out / "results.json").read_text())
    assert results["model"] == "tiny-gf2"
    assert results["lm_eval"]["0-shot"]["results"]["fixed_embed_word_order"]["sample_len"] == 4
    assert {"fixed_embed_word_order|acc|0", "fixed_embed_docs_ppl|word_perplexity|0"} <= set(
        results["scores"]
    )
    table = (out / "table.md").read_text()
    assert table.startswith("| model | word order | docs word ppl | docs bits/byte |")
    assert "| tiny-gf2 @ update 3 |" in table  # the row says what it scored
    other = {**results, "model": "other"}
    assert markdown_table([results, other]).count("\n") == 4
    (tmp_path / "other.json").write_text(json.dumps(other))
    merged = tmp_path / "merged.md"
    assert (
        main(
            [
                "table",
                str(out / "results.json"),
                str(tmp_path / "other.json"),
                "--output",
                str(merged),
            ]
        )
        == 0
    )
    # the notes travel with the rows
    assert merged.read_text() == markdown_table([results, other]) + TABLE_NOTES


def test_results_name_the_file_a_moved_last_ckpt_resolved_to_and_its_update(
    tmp_path, checkpoint, monkeypatch
):
    """eval at update 3, last.ckpt moved on to update 5, eval again: two result folders (no
    refusal, nothing overwritten), each naming its file and update, as the merged table and
    export's fixed_embed.json do."""
    monkeypatch.chdir(tmp_path)  # the default folder: logs/eval/<run>-<suite>-<hash> under it
    folder = tmp_path / "logs" / "tiny" / "gf2" / "default" / "checkpoints"
    folder.mkdir(parents=True)
    saved, last, written = torch.load(checkpoint, weights_only=False), folder / "last.ckpt", {}
    for step in (3, 5):
        file = folder / f"step={step:08d}.ckpt"
        torch.save({**saved, "global_step": step}, file)
        last.unlink(missing_ok=True)
        last.symlink_to(file.name)  # as the checkpoint policy moves it
        argv = [
            "eval",
            str(last),
            "--suite",
            "offline",
            "--limit",
            "2",
            "--batch-size",
            "2",
            "--device",
            "cpu",
        ]
        assert main(argv) == 0
        [path] = set(tmp_path.glob("logs/eval/*/results.json")) - set(written)
        written[path] = path.read_text()
        results = json.loads(written[path])
        assert (results["checkpoint"], results["update"]) == (str(file.resolve()), step)
        assert (
            f"step_{step:08d}-offline" in path.parent.name
            and f"step={step:08d}" in results["model"]
        )
    # the first one untouched
    assert all(path.read_text() == text for path, text in written.items())
    assert main(["table", *map(str, written), "--output", str(tmp_path / "table.md")]) == 0
    rows = (tmp_path / "table.md").read_text().splitlines()[2:4]
    assert [" @ update 3 |" in rows[0], " @ update 5 |" in rows[1]] == [True, True], rows
    pytest.importorskip("transformers")
    assert main(["export", str(last), str(tmp_path / "hf")]) == 0
    marker = json.loads((tmp_path / "hf" / "fixed_embed.json").read_text())
    assert (marker["checkpoint"], marker["update"]) == (
        str((folder / "step=00000005.ckpt").resolve()),
        5,
    )


def test_bad_inputs_are_clear_errors(tmp_path, checkpoint):
    with pytest.raises(FileNotFoundError, match="checkpoint not found"):
        load_checkpoint(tmp_path / "missing.ckpt")
    (tmp_path / "junk.ckpt").write_bytes(b"not a checkpoint")
    with pytest.raises(
        ValueError,
        match=r"cannot read checkpoint .*: it is not a checkpoint written by fixed-embed",
    ):
        load_checkpoint(tmp_path / "junk.ckpt")
    torch.save({"weights": torch.zeros(2)}, tmp_path / "other.ckpt")
    with pytest.raises(ValueError, match="not a fixed-embed LanguageModel checkpoint"):
        load_checkpoint(tmp_path / "other.ckpt")
    with pytest.raises(ValueError, match="not a sharded checkpoint"):
        load_checkpoint(tmp_path)
    with pytest.raises(TypeError, match="dtyp"):  # a misspelt model_arg is not silently dropped
        FixedEmbedLM(str(checkpoint), device="cpu", dtyp="bfloat16")
    lm = FixedEmbedLM(str(checkpoint), device="cpu")
    with pytest.raises(ValueError, match=r"lm-eval knows no task \['no_such_task_xyz'\]"):
        run_suite(lm, [Column("no_such_task_xyz", "acc")])
