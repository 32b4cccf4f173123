"""The study (`make study`): its local-file benchmark tasks, its plan, its configs and its report."""

import json
import math
import statistics
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "experiments"))

import study
import study_report

from fixed_embed.tasks import offline_data

ROOT = Path(__file__).resolve().parents[1]

LONG = " The sea is wide , and it is deep . " * 20  # articles under 500 characters are left out
WIKITEXT = "\n".join([  # the file's own layout: " = Title = " lines, spaced-out tokens, " " blank lines
    " = Lobster = ", " ", f" The lobster is a 3 @-@ metre animal . It lives in the sea ( mostly ) . {LONG}", " ",
    " = = Description = = ", " ", ' Its shell is hard , and it has " claws " . ', " ",
    " = Crab = ", " ", f" A crab walks sideways . {LONG}", " ",
    " = Stub = ", " ", " Too short . ", "",
])  # fmt: skip


def test_wikitext_articles_split_at_titles_and_are_detokenized(tmp_path, monkeypatch):
    (tmp_path / "wiki").mkdir()
    (tmp_path / "wiki" / "valid.tokens").write_text(WIKITEXT)
    monkeypatch.setenv("FIXED_EMBED_DATA", str(tmp_path))
    docs = offline_data.docs_ppl(n_docs=None, max_chars=None, path="wiki/valid.tokens")["test"]["text"]
    assert len(docs) == 2  # "= = Description = =" is a section, not an article; the stub is too short
    assert docs[0].startswith(" = Lobster =") and "3-metre animal. It lives in the sea (mostly)." in docs[0]
    assert 'it has "claws".' in docs[0] and "Description" in docs[0]
    assert docs[1].startswith(" = Crab =")
    cut = offline_data.docs_ppl(n_docs=1, max_chars=30, path="wiki/valid.tokens")["test"]["text"]
    assert cut == [docs[0][:30]]


def test_a_missing_local_file_names_the_path_and_the_variable(tmp_path, monkeypatch):
    monkeypatch.setenv("FIXED_EMBED_DATA", str(tmp_path))
    with pytest.raises(FileNotFoundError, match=r"gutenberg-prose/valid.jsonl.*FIXED_EMBED_DATA"):
        offline_data.word_order(path="gutenberg-prose/valid.jsonl")


def test_the_study_tasks_build_from_the_shared_data(shared_data, monkeypatch):
    from fixed_embed.suite import STUDY, check_tasks

    monkeypatch.setenv("FIXED_EMBED_DATA", str(shared_data))
    check_tasks({c.task for c in STUDY})  # lm-eval finds all three YAMLs
    items = offline_data.word_order(200, path="gutenberg-prose/valid.jsonl")["test"]
    assert len(items) == 200
    for item in items:  # the two continuations hold the same words in a different order
        true, shuffled = item["choices"][item["gold"]], item["choices"][1 - item["gold"]]
        assert sorted(true.split()) == sorted(shuffled.split()) and true != shuffled
    books = offline_data.docs_ppl(None, 20000, path="gutenberg-prose/valid.jsonl")["test"]["text"]
    assert len(books) == 9 and all(len(b) == 20000 for b in books)
    articles = offline_data.docs_ppl(None, None, path="wikitext-2/wiki.valid.tokens")["test"]["text"]
    assert len(articles) == 60  # WikiText-2's validation split has 60 articles


def test_the_plan_runs_whole_seeds_first_and_names_every_run():
    steps = study.plan(["bpe8k", "smollm2"], [1, 2], [7], ["bpe8k"])
    names = [name for name, _, _ in steps]
    assert names[:3] == ["bpe8k/learned-seed1", "bpe8k/binary16-seed1", "bpe8k/gf2-seed1"]
    assert names[6] == "bpe8k/gf2-code7-seed1" and len(names) == 13
    assert not any("code" in n for n in names if n.startswith("smollm2"))
    for name, configs, flags in steps:
        meta = study_report.parse({"name": name})
        assert configs[0].name == f"{meta['variant']}.yaml"
        assert (configs[-1].name == "smollm2.yaml") == (meta["part"] == "smollm2")
        assert f"--seed_everything={meta['seed']}" in flags
        assert (f"--model.interface.init_args.code_seed={meta['code']}" in flags) == (meta["code"] == 7)
    with pytest.raises(ValueError, match="PART/VARIANT"):
        study_report.parse({"name": "bpe8k/gf2"})


def test_the_smollm2_delta_composes_with_every_variant():
    result = subprocess.run(
        [sys.executable, "-m", "fixed_embed", "fit", "--config", str(ROOT / "experiments/study/gf2.yaml"),
         "--config", str(ROOT / "experiments/study/smollm2.yaml"), "--print_config"],
        capture_output=True, text=True, cwd=ROOT,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    config = yaml.safe_load(result.stdout)
    assert config["model"]["decoder"]["vocab_size"] == 49152 and config["model"]["decoder"]["d_model"] == 256
    assert config["model"]["interface"]["class_path"].endswith("GF2CodeInput")
    assert config["model"]["interface"]["init_args"]["code_seed"] == 12345
    assert config["data"]["tokenizer"].endswith("smollm2-tokenizer/tokenizer.json")
    assert config["trainer"]["max_steps"] == 200 and config["model"]["schedule"]["warmup_steps"] == 20


def _row(name, loss, acc):
    variant = study_report.parse({"name": name})["variant"]
    return {"name": name, "config": f"experiments/study/{variant}.yaml", "commit": "0123456789abcdef", "extra": [],
            "val_loss": loss, "wall_seconds": 600.0, "trainable_params": 1,
            "scores": {"gutenberg_word_order|acc|0": {"value": acc, "stderr": 0.03}},
            "curves": {"val/loss": [[99, loss + 1], [399, loss]], "train/loss": [[9, 9.0], [399, loss]],
                       "input/norm_mean": [[9, 1.0], [399, 2.0]],
                       "perf/tokens_per_sec": [[9, 100.0], [19, 300.0]]}}  # fmt: skip


def test_the_report_summarises_seeds_recodings_and_draws_the_curves(tmp_path):
    losses = {"learned": [5.0, 5.1, 5.2], "binary16": [6.0, 6.1, 6.2], "gf2": [6.05, 6.1, 6.3]}
    rows = [_row(f"bpe8k/{v}-seed{s + 1}", loss, 0.8) for v, ls in losses.items() for s, loss in enumerate(ls)]
    rows += [_row("bpe8k/gf2-code1-seed1", 6.2, 0.7), _row("bpe8k/gf2-code2-seed1", 6.4, 0.6)]
    study_report.render({"title": "Study: x, y", "runs": rows}, tmp_path / "study")
    text = (tmp_path / "study.md").read_text()
    mean_ppl = statistics.mean(math.exp(x) for x in losses["learned"])
    sd_ppl = statistics.stdev(math.exp(x) for x in losses["learned"])
    assert f"| learned | 3 | 2,097,152 / 4,196,608 / 2,097,152 | 5.100 ± 0.100 | {mean_ppl:.1f} ± {sd_ppl:.1f} | " \
           "80.0 ± 0.0 | -- | -- | 200 | 10.0 |" in text  # fmt: skip
    assert "| binary16 | 3 | 0 / 4,196,608 / 2,097,152 | 6.100 ± 0.100 |" in text
    se = math.sqrt(0.01 / 3 + 0.01 / 3)
    assert f"- binary16 − learned: +1.000 nats (standard error of the difference {se:.3f}" in text
    assert "the seed ranges do not overlap" in text and "gf2 − binary16: +0.050" in text
    assert "Paired by training seed: +0.050, +0.000, +0.100 (mean +0.050 ± 0.050; signs differ between seeds)." in text
    assert "seed: +1.000, +1.000, +1.000 (mean +1.000 ± 0.000; the same sign for every seed)." in text
    assert "| 12345 (paper) | 6.050 |" in text and "| 1 | 6.200 | 70.0 |" in text
    assert f"sd {statistics.stdev([6.05, 6.2, 6.4]):.3f}" in text
    assert "\nfixed-embed fit --config experiments/study/binary16.yaml\n" in text
    for suffix in ("val-loss", "loss", "input-norm"):
        assert (tmp_path / f"study-{suffix}.png").stat().st_size > 10_000


def test_the_committed_report_is_drawn_from_the_committed_runs(tmp_path):
    runs_file = ROOT / "docs" / "results" / "study-runs.json"
    if not runs_file.is_file():
        pytest.skip("the study has not been run")
    study_report.render(json.loads(runs_file.read_text()), tmp_path / "study")
    assert (tmp_path / "study.md").read_text() == (ROOT / "docs" / "results" / "study.md").read_text()
