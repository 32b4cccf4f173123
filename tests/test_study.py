"""The study (`make study`): its local-file benchmark tasks, its plan, its configs and its report."""

import json
import sys
from pathlib import Path

import pytest

import experiments.study as study
import experiments.study_report as study_report
from fixed_embed.tasks import offline_data
from tests.cli import run_cli

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


SIZES = ("s", "m", "l")


def _configs(scale, variant="binary16", size="m"):
    return study.merged_config(scale.configs(variant, size, scale.tokenizer))


@pytest.mark.parametrize("gpu", [False, True])
def test_every_size_trains_the_same_tokens_per_parameter_and_the_sizes_span_8x(gpu):
    scale = study.Scale(gpu)
    ratio = 20.0 if gpu else 0.5
    params = {}
    for size in SIZES:
        configs = scale.configs("binary16", size, scale.tokenizer)
        assert study.tokens_per_param(configs) == pytest.approx(ratio, rel=0.005)  # whole updates
        config = study.merged_config(configs)
        params[size] = study.non_embedding_params(config["model"]["decoder"])
        assert config["model"]["schedule"]["warmup_steps"] == round(config["trainer"]["max_steps"] / 10)
    assert params["l"] / params["s"] >= 8
    if gpu:  # ~20M to ~300M
        assert 20e6 <= params["s"] <= 30e6 and 250e6 <= params["l"] <= 350e6


def test_the_non_embedding_count_is_the_models(shared_data):
    from fixed_embed.experiment import build_model

    model = build_model(_configs(study.Scale(False))["model"])
    blocks = sum(p.numel() for n, p in model.decoder.named_parameters() if n.startswith(("layers", "norm")))
    assert study.non_embedding_params(_configs(study.Scale(False))["model"]["decoder"]) == blocks


@pytest.mark.parametrize("gpu", [False, True])
def test_the_matched_baseline_has_the_learned_models_trainable_parameters(gpu):
    from fixed_embed.experiment import build_model

    scale = study.Scale(gpu)
    name, configs, flags = study.step(scale, scale.tune, "matched", 1e-3, 1)
    decoder = study.merged_config(configs)["model"]["decoder"]
    matched = study.merged_config(configs)["model"]
    matched["decoder"]["ffn_dim"] = int(next(f for f in flags if "ffn_dim" in f).split("=")[1])

    def trainable(model):
        return sum(p.numel() for p in build_model(model).parameters() if p.requires_grad)

    learned = trainable(_configs(scale, "learned", scale.tune)["model"])
    assert abs(trainable(matched) - learned) <= 1.5 * decoder["d_model"] * decoder["n_layers"]
    assert name == f"{scale.tokenizer}-{scale.tune}/matched-lr0.001-seed1"


def test_the_plan_names_every_run_and_sets_its_seed_and_rate():
    scale = study.Scale(False)
    sweep = study.sweep_plan(scale, [3e-4, 1e-3])
    assert [n for n, _, _ in sweep][:3] == ["bpe8k-m/learned-lr0.0003-seed1", "bpe8k-m/binary16-lr0.0003-seed1",
                                            "bpe8k-m/gf2-lr0.0003-seed1"]  # fmt: skip
    best = {"learned": 3e-3, "binary16": 1e-3, "gf2": 1e-3}
    later = study.later_plan(scale, ["sizes", "controls"], best, [1, 2])
    names = [n for n, _, _ in later]
    assert len(names) == 2 * (9 + len(study.CONTROLS)) and names[0] == "bpe8k-s/learned-lr0.003-seed1"
    assert names[9 + len(study.CONTROLS)].endswith("-seed2")  # seeds outermost: whole seeds first
    for name, configs, flags in later:
        meta = study_report.parse({"name": name})
        assert f"--seed_everything={meta['seed']}" in flags and f"--model.optimizer.lr={meta['lr']:g}" in flags
        assert configs[0].name == f"{meta['variant']}.yaml" and configs[1].name == f"size-{meta['size']}.yaml"
        like = study.CONTROLS.get(meta["variant"], meta["variant"])
        assert meta["lr"] == best[like]
    with pytest.raises(ValueError, match="TOKENIZER-SIZE"):
        study_report.parse({"name": "bpe8k/gf2-seed1"})


def test_a_best_rate_at_the_edge_of_the_sweep_asks_for_the_next_rung():
    scale = study.Scale(False)
    lrs = [3e-4, 1e-3, 3e-3]
    bpb = {"learned": [2.0, 1.9, 1.8], "binary16": [2.1, 2.0, 2.05], "gf2": [2.1, 2.0, 2.05]}
    rows = {
        study.name("bpe8k", "m", v, lr, 1): {"val_bpb": x}
        for v, xs in bpb.items()
        for lr, x in zip(lrs, xs, strict=True)
    }
    best, more = study.best_lrs(scale, rows, lrs)
    assert best == {"learned": 3e-3, "binary16": 1e-3, "gf2": 1e-3} and more == [1e-2]


def test_every_study_config_composes_at_both_scales():
    """Every variant and control at the tuning size, and every GPU size, parses as one `fit` config."""
    cpu, gpu = study.Scale(False), study.Scale(True)
    steps = [study.step(cpu, cpu.tune, v, 1e-3, 1) for v in (*study.PAPER, *study.CONTROLS)]
    steps += [study.step(gpu, size, "lowrank_normal", 1e-3, 1) for size in SIZES]
    for name, configs, flags in steps:
        args = [a for c in configs for a in ("--config", str(c))]
        result = run_cli("fit", *args, *flags, "--print_config")
        assert result.returncode == 0, (name, result.stderr[-1500:])
        config = result.config()
        meta = study_report.parse({"name": name})
        decoder = study.merged_config(configs)["model"]["decoder"]
        assert config["model"]["decoder"]["d_model"] == decoder["d_model"]
        if meta["variant"].startswith("lowrank"):  # the control's own optimizer settings survive the merges
            assert config["model"]["optimizer"]["input_lr_scale"] == 10.0
            assert config["model"]["optimizer"]["decay_input"] is False


def _row(name, bpb, seed_shift=0.0):
    meta = study_report.parse({"name": name})
    variant, size = meta["variant"], meta["size"]
    return {"name": name, "config": f"experiments/study/{variant}.yaml + experiments/study/size-{size}.yaml",
            "commit": "0123456789abcdef", "extra": [f"--seed_everything={meta['seed']}"], "val_loss": bpb * 2.6,
            "val_bpb": bpb, "wall_seconds": 600.0, "trainable_params": 1, "tokens_seen": 884736,
            "scores": {"gutenberg_word_order|acc|0": {"value": 0.8, "stderr": 0.03}},
            "curves": {"val/bits_per_byte": [[107, bpb + 1], [431, bpb]]}}  # fmt: skip


def test_the_report_pairs_seeds_and_draws_the_gap_by_size(tmp_path):
    rows = []
    gap = {"s": 0.30, "m": 0.20, "l": 0.10}
    for seed, noise in ((1, 0.0), (2, 0.01), (3, -0.01)):
        for size in SIZES:
            rows.append(_row(f"bpe8k-{size}/learned-lr0.001-seed{seed}", 2.0 + noise))
            rows.append(_row(f"bpe8k-{size}/binary16-lr0.001-seed{seed}", 2.0 + noise + gap[size] + seed / 100))
            rows.append(_row(f"bpe8k-{size}/gf2-lr0.001-seed{seed}", 2.0 + noise + gap[size]))
        rows.append(_row(f"bpe8k-m/matched-lr0.001-seed{seed}", 2.1 + noise))
    rows += [_row("bpe8k-m/learned-lr0.003-seed1", 2.5), _row("bpe8k-m/binary16-lr0.003-seed1", 2.6),
             _row("bpe8k-m/gf2-lr0.003-seed1", 2.7)]  # fmt: skip
    study_report.render({"title": "Study v2: x, y", "runs": rows}, tmp_path / "study-v2")
    text = (tmp_path / "study-v2.md").read_text()
    assert "| learned | **2.0000** | 2.5000 | 0.001 |" in text  # the sweep, best in bold
    assert "lr 0.003: learned < binary16 < gf2" in text
    assert "| S | 443,040 | +0.3200 ± 0.0100 | +0.3000 ± 0.0000 | -0.0200 ± 0.0100 |" in text
    assert "| L | 4,196,608 | +0.1200 ± 0.0100 |" in text
    assert "| M | learned | 0.001 | 3 |" in text  # the comparison uses the rate with all seeds
    assert "| matched: binary16, SwiGLU widened" in text and "+0.1000 ± 0.0000" in text
    for suffix in ("gap", "val-bpb", "controls"):
        assert (tmp_path / f"study-v2-{suffix}.png").stat().st_size > 10_000


def test_the_committed_report_is_drawn_from_the_committed_runs(tmp_path):
    runs_file = ROOT / "docs" / "results" / "study-v2-runs.json"
    if not runs_file.is_file():
        pytest.skip("the study has not been run")
    study_report.render(json.loads(runs_file.read_text()), tmp_path / "study-v2")
    assert (tmp_path / "study-v2.md").read_text() == (ROOT / "docs" / "results" / "study-v2.md").read_text()


def test_the_best_rate_is_chosen_among_finished_runs_only():
    scale = study.Scale(False)
    rows = {
        study.name("bpe8k", "m", v, lr, 1): {"val_bpb": x} for v in study.PAPER for lr, x in ((1e-3, 2.0), (3e-3, 1.9))
    }
    rows[study.name("bpe8k", "m", "gf2", 1e-2, 1)] = {"val_bpb": 1.0}  # a rung only gf2 finished
    rows[study.name("bpe8k", "m", "learned", 3e-3, 1)] = {"val_bpb": float("nan")}  # diverged
    assert study.swept(scale, rows) == [1e-3, 3e-3]
    best, _ = study.best_lrs(scale, rows, study.swept(scale, rows))
    assert best == {"learned": 1e-3, "binary16": 3e-3, "gf2": 3e-3}
    with pytest.raises(SystemExit, match="no finished sweep run of learned"):
        study.best_lrs(scale, {}, [1e-3])


@pytest.mark.slow
def test_the_gpu_plan_smoke_runs_its_smallest_size_on_cpu(tmp_path, shared_data):
    """`make study-gpu ARGS=--smoke` on one config: the GPU plan's size S, 2 updates on this CPU."""
    name, configs, flags = study.smoke_plan(study.Scale(True))[0]
    assert name == "smollm2-s/learned-lr0.001-seed1"
    args = [a for c in configs for a in ("--config", str(c))]
    logger = [f"--trainer.logger.init_args.save_dir={tmp_path}", "--trainer.logger.init_args.name=smoke"]
    result = run_cli("fit", *args, *flags, *study.SMOKE, *logger)
    assert result.returncode == 0, result.stderr[-2000:]
    assert (tmp_path / "smoke" / "default" / "checkpoints" / "step=00000002.ckpt").is_file()


def test_the_comparison_uses_the_swept_best_rate_before_other_seeds_exist(tmp_path):
    """With seed 1 only (the sweep done, seeds 2-3 not yet), every table compares at the best rate."""
    bpb = {1e-3: 2.4, 3e-3: 2.1, 1e-2: float("nan")}  # 3e-3 best; 1e-2 diverged
    rows = [_row(f"bpe8k-m/{v}-lr{lr:g}-seed1", x + (0.2 if v != "learned" else 0.0))
            for lr, x in bpb.items() for v in study.PAPER]  # fmt: skip
    rows += [_row(f"bpe8k-{size}/{v}-lr0.003-seed1", 2.0) for size in ("s", "l") for v in study.PAPER]
    rows.append(_row("bpe8k-m/norm_matched-lr0.003-seed1", 2.0))
    study_report.render({"title": "Study v2: x, y", "runs": rows}, tmp_path / "study-v2")
    text = (tmp_path / "study-v2.md").read_text()
    assert "| M | learned | 0.003 | 1 |" in text and "| M | 1,770,816 | +0.2000 (1 run) |" in text
    assert "rows at the binary code's norm | 1 | 1 | 2.0000 (1 run) | -0.1000 (1 run) |" in text


def test_the_estimate_lists_every_planned_run_once(monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["experiments/study.py", "--estimate"])
    study.main()
    stdout = capsys.readouterr().out
    names = [line.split()[0] for line in stdout.splitlines() if line.startswith("bpe8k-")]
    # the sweep (3 rates x 3 variants at M, seed 1); 3 sizes x 3 variants x 3 seeds, seed 1 at M from the
    # sweep; 5 controls x 3 seeds
    assert len(names) == len(set(names)) == 9 + (27 - 3) + 15
    assert f"{len(names)} runs:" in stdout


def test_the_gpu_plan_reads_token_shards_and_says_how_to_make_them(tmp_path, monkeypatch):
    scale = study.Scale(True)
    assert study.merged_config(scale.configs("gf2", "m", scale.tokenizer))["data"]["train"].startswith("shards/")
    monkeypatch.setattr(study, "ROOT", tmp_path)
    with pytest.raises(SystemExit, match=r"shards/fineweb-edu-smollm2/.*make shards-fineweb"):
        study._check_gpu_data(scale, [])
    study._check_gpu_data(scale, ["--data.train=/data/other/"])  # DATA= is the user's choice
    (tmp_path / "shards" / "fineweb-edu-smollm2").mkdir(parents=True)
    study._check_gpu_data(scale, [])
