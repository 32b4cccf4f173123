"""The study (`make study`): its local-file benchmark tasks, its plan and its configs (the
runner's launches: tests/test_study_launch.py)."""

from pathlib import Path

import pytest

import experiments.plan.stages as stages
import experiments.study as study
from experiments.launch.record import record, resolve
from experiments.plan.names import CONTROLS, PAPER, run_name
from experiments.report.results import parse
from fixed_embed.evaluation.tasks import offline_data
from tests.cli import run_cli

ROOT = Path(__file__).resolve().parents[1]

LONG = " The sea is wide , and it is deep . " * 20  # articles under 500 characters are left out
WIKITEXT = "\n".join(
    [  # the file's own layout: " = Title = " lines, spaced-out tokens, " " blank lines
        " = Lobster = ",
        " ",
        f" The lobster is a 3 @-@ metre animal . It lives in the sea ( mostly ) . {LONG}",
        " ",
        " = = Description = = ",
        " ",
        ' Its shell is hard , and it has " claws " . ',
        " ",
        " = Crab = ",
        " ",
        f" A crab walks sideways . {LONG}",
        " ",
        " = Stub = ",
        " ",
        " Too short . ",
        "",
    ]
)


def test_wikitext_articles_split_at_titles_and_are_detokenized(tmp_path, monkeypatch):
    (tmp_path / "wiki").mkdir()
    (tmp_path / "wiki" / "valid.tokens").write_text(WIKITEXT)
    monkeypatch.setenv("FIXED_EMBED_DATA", str(tmp_path))
    docs = offline_data.docs_ppl(n_docs=None, max_chars=None, path="wiki/valid.tokens")["test"][
        "text"
    ]
    # "= = Description = =" is a section, not an article; the stub is too short
    assert len(docs) == 2
    assert (
        docs[0].startswith(" = Lobster =")
        and "3-metre animal. It lives in the sea (mostly)." in docs[0]
    )
    assert 'it has "claws".' in docs[0] and "Description" in docs[0]
    assert docs[1].startswith(" = Crab =")
    cut = offline_data.docs_ppl(n_docs=1, max_chars=30, path="wiki/valid.tokens")["test"]["text"]
    assert cut == [docs[0][:30]]


def test_a_missing_local_file_names_the_path_and_the_variable(tmp_path, monkeypatch):
    monkeypatch.setenv("FIXED_EMBED_DATA", str(tmp_path))
    with pytest.raises(FileNotFoundError, match=r"gutenberg-prose/valid.jsonl.*FIXED_EMBED_DATA"):
        offline_data.word_order(path="gutenberg-prose/valid.jsonl")


def test_the_study_tasks_build_from_the_shared_data(shared_data, monkeypatch):
    from fixed_embed.evaluation.suite import STUDY, check_tasks

    monkeypatch.setenv("FIXED_EMBED_DATA", str(shared_data))
    check_tasks({c.task for c in STUDY})  # lm-eval finds all three YAMLs
    items = offline_data.word_order(200, path="gutenberg-prose/valid.jsonl")["test"]
    assert len(items) == 200
    for item in items:  # the two continuations hold the same words in a different order
        true, shuffled = item["choices"][item["gold"]], item["choices"][1 - item["gold"]]
        assert sorted(true.split()) == sorted(shuffled.split()) and true != shuffled
    books = offline_data.docs_ppl(None, 20000, path="gutenberg-prose/valid.jsonl")["test"]["text"]
    assert len(books) == 9 and all(len(b) == 20000 for b in books)
    articles = offline_data.docs_ppl(None, None, path="wikitext-2/wiki.valid.tokens")["test"][
        "text"
    ]
    assert len(articles) == 60  # WikiText-2's validation split has 60 articles


SIZES = ("s", "m", "l")


def _configs(scale, variant="binary16", size="m"):
    return resolve(scale.configs(variant, size, scale.tokenizer))


@pytest.mark.parametrize("gpu", [False, True])
def test_every_size_trains_the_same_tokens_per_parameter_and_the_sizes_span_8x(gpu):
    scale = stages.Scale(gpu)
    ratio = 20.0 if gpu else 0.5
    params = {}
    for size in SIZES:
        configs = scale.configs("binary16", size, scale.tokenizer)
        run = record(resolve(configs))
        config = run.config
        assert run.tokens / run.non_embedding == pytest.approx(ratio, rel=0.005)  # whole updates
        params[size] = run.non_embedding
        assert config["model"]["schedule"]["warmup_steps"] == round(
            config["trainer"]["max_steps"] / 10
        )
    assert params["l"] / params["s"] >= 8
    if gpu:  # ~20M to ~300M
        assert 20e6 <= params["s"] <= 30e6 and 250e6 <= params["l"] <= 350e6


def test_the_non_embedding_count_is_the_models(shared_data):
    from fixed_embed.train.experiment import build_model

    model = build_model(_configs(stages.Scale(False))["model"])
    blocks = sum(
        p.numel() for n, p in model.decoder.named_parameters() if n.startswith(("layers", "norm"))
    )
    assert record(_configs(stages.Scale(False))).non_embedding == blocks


@pytest.mark.parametrize("gpu", [False, True])
def test_the_matched_baseline_has_the_learned_models_trainable_parameters(gpu):
    from fixed_embed.train.experiment import build_model

    scale = stages.Scale(gpu)
    name, configs, flags = stages.step(scale, scale.tune, "matched", 1e-3, 1)
    decoder = resolve(configs)["model"]["decoder"]
    matched = resolve(configs)["model"]
    matched["decoder"]["ffn_dim"] = int(next(f for f in flags if "ffn_dim" in f).split("=")[1])

    def trainable(model):
        return sum(p.numel() for p in build_model(model).parameters() if p.requires_grad)

    learned = trainable(_configs(scale, "learned", scale.tune)["model"])
    assert abs(trainable(matched) - learned) <= 1.5 * decoder["d_model"] * decoder["n_layers"]
    assert name == f"{scale.tokenizer}-{scale.tune}/matched-lr0.001-seed1"


def test_the_plan_names_every_run_and_sets_its_seed_and_rate():
    scale = stages.Scale(False)
    sweep = stages.sweep_plan(scale, stages.initial_rates(scale))
    assert [n for n, _, _ in sweep][:3] == [
        "bpe8k-s/learned-lr0.001-seed1",
        "bpe8k-s/learned-lr0.002-seed1",
        "bpe8k-s/learned-lr0.003-seed1",
    ]
    assert len(sweep) == 3 * sum(map(len, scale.sweep.values()))
    best = {size: {"learned": 3e-3, "binary16": 1e-3, "gf2": 2e-3} for size in ("s", "m")}
    best["l"] = {"learned": 5e-3, "binary16": 2e-3, "gf2": 2e-3}  # a size's own rates serve it
    later = stages.later_plan(scale, ["sizes", "length", "codebooks", "controls"], best, [1, 2])
    names = [n for n, _, _ in later]
    assert (
        len(names)
        == len(set(names))
        == 2 * 9 + 2 * 3 * 4 + len(scale.codebooks) + 2 * len(CONTROLS)
    )
    # whole seeds first
    assert names[0] == "bpe8k-s/learned-lr0.003-seed1" and names[9].endswith("-seed2")
    assert (
        "bpe8k-l/learned-lr0.005-seed2" in names and "bpe8k-s/gf2-lr0.002-seed1-steps1728" in names
    )
    assert "bpe8k-m/binary16-lr0.001-seed2-steps1024" in names
    assert (
        "bpe8k-l/gf2-lr0.002-seed2-code2" in names
        and "bpe8k-m/random_full-lr0.001-seed2-code2" in names
    )
    # seed 1 keeps the config's codebook
    assert not [n for n in names if "-code" in n and "-seed1" in n]
    for name, configs, flags in later:
        meta = parse({"name": name})
        assert (
            f"--seed_everything={meta['seed']}" in flags
            and f"--model.optimizer.lr={meta['lr']:g}" in flags
        )
        assert (
            configs[0].name == f"{meta['variant']}.yaml"
            and configs[1].name == f"size-{meta['size']}.yaml"
        )
        assert meta["lr"] == best[meta["size"]][CONTROLS.get(meta["variant"], meta["variant"])]
        if meta["steps"]:
            n = meta["steps"]
            assert {
                f"--trainer.max_steps={n}",
                f"--trainer.val_check_interval={n // 4}",
                f"--model.schedule.warmup_steps={round(n / 10)}",
            } <= set(flags)
        code = [f for f in flags if "code_seed" in f]
        assert code == (
            [f"--model.interface.init_args.code_seed={meta['code']}"] if meta["code"] else []
        )
    with pytest.raises(ValueError, match="TOKENIZER-SIZE"):
        parse({"name": "bpe8k/gf2-seed1"})
    with pytest.raises(ValueError, match="multiple of 4"):
        stages.step(scale, "s", "learned", 1e-3, 1, steps=430)


def test_a_best_rate_at_the_edge_of_the_sweep_asks_for_the_next_rung():
    scale = stages.Scale(False)
    lrs = [1e-3, 2e-3, 3e-3]
    bpb = {"learned": [2.0, 1.9, 1.8], "binary16": [2.1, 2.0, 2.05], "gf2": [1.9, 2.0, 2.05]}
    rows = {
        run_name("bpe8k", "m", v, lr, 1): {"val_bpb": x}
        for v, xs in bpb.items()
        for lr, x in zip(lrs, xs, strict=True)
    }
    best, more = stages.best_lrs(scale, rows, {("m", v): lrs for v in PAPER})
    assert best == {"m": {"learned": 3e-3, "binary16": 2e-3, "gf2": 1e-3}}
    # the ladder's neighbours, per variant
    assert more == {
        ("m", "learned"): [5e-3],
        ("m", "gf2"): [5e-4],
    }
    # an unswept size borrows the tuning size's rate
    assert stages.rate_at(scale, best, "s", "gf2") == 1e-3


def test_the_resweep_starts_around_each_own_length_best_and_serves_the_lengths_nearer_it():
    scale = stages.Scale(False)
    best = {"s": {"learned": 3e-3, "binary16": 2e-3, "gf2": 1e-3}, "m": {v: 3e-3 for v in PAPER}}
    rates = stages.resweep_rates(scale, best, {})
    assert rates == {
        ("s", "learned"): [2e-3, 3e-3, 5e-3],
        ("s", "binary16"): [1e-3, 2e-3, 3e-3],
        ("s", "gf2"): [5e-4, 1e-3, 2e-3],
    }
    own = {
        run_name("bpe8k", "s", v, lr, 1): {"val_bpb": x}
        for v, lr, x in (
            ("learned", 3e-3, 2.0),
            ("learned", 2e-3, 2.1),
            ("gf2", 1e-3, 2.0),
            ("gf2", 2e-3, 2.001),
        )
    }
    assert list(stages.resweep_rates(scale, best, own)) == [
        ("s", "gf2"),
        ("s", "learned"),
        ("s", "binary16"),
    ]
    plan = [n for n, _, _ in stages.sweep_plan(scale, rates, scale.resweep)]
    assert len(plan) == 9 and all(n.endswith("-seed1-steps1024") for n in plan)
    # seed 1 at the resweep's length: gf2's best at its lowest rung asks for the next one down
    bpb = {"learned": [1.9, 1.8, 1.85], "binary16": [2.0, 1.9, 1.95], "gf2": [1.9, 2.0, 2.1]}
    rows = {
        run_name("bpe8k", "s", v, lr, 1, steps=1024): {"val_bpb": x}
        for v, xs in bpb.items()
        for lr, x in zip(rates[("s", v)], xs, strict=True)
    }
    found, more = stages.best_lrs(scale, rows, rates, scale.resweep)
    assert found == {"s": {"learned": 3e-3, "binary16": 2e-3, "gf2": 5e-4}} and more == {
        ("s", "gf2"): [3e-4]
    }
    # not finished: the length stage keeps S's own rates
    assert study.resweep_best(scale, rows, rates) == {}
    rows[run_name("bpe8k", "s", "gf2", 3e-4, 1, steps=1024)] = {"val_bpb": 2.0}
    rates[("s", "gf2")] = [3e-4, *rates[("s", "gf2")]]
    assert stages.swept(scale, rows, scale.resweep)[("s", "gf2")] == rates[("s", "gf2")]
    again = study.resweep_best(scale, rows, rates)
    assert again == {"s": {"learned": 3e-3, "binary16": 2e-3, "gf2": 5e-4}}
    # 108 updates keep the own-length sweep's rate; 432 (2.4x from 1,024, 4x from 108) and longer
    # take the resweep's
    assert stages.length_rate(scale, best, again, "s", "gf2", 108) == 1e-3
    assert all(
        stages.length_rate(scale, best, again, "s", "gf2", n) == 5e-4 for n in (432, 1024, 1728)
    )
    assert stages.length_rate(scale, best, again, "m", "gf2", 1024) == 3e-3  # M was not swept again
    names = [n for n, _, _ in stages.later_plan(scale, ["length"], best, [1, 2, 3], again)]
    # whole cells first
    assert names[:3] == [f"bpe8k-m/learned-lr0.003-seed{s}-steps1024" for s in (1, 2, 3)]
    assert names[3:6] == [f"bpe8k-m/binary16-lr0.003-seed{s}-steps1024" for s in (1, 2, 3)]
    assert names[9] == "bpe8k-s/learned-lr0.003-seed1-steps1024"  # S: the equal-token length first
    assert (
        "bpe8k-s/gf2-lr0.0005-seed3-steps432" in names
        and "bpe8k-s/gf2-lr0.001-seed3-steps432" not in names
    )


def test_every_study_config_composes_at_both_scales():
    """Every variant and control at the tuning size, and every GPU size, parses as one `fit`
    config."""
    cpu, gpu = stages.Scale(False), stages.Scale(True)
    steps = [stages.step(cpu, cpu.tune, v, 1e-3, 1) for v in (*PAPER, *CONTROLS)]
    steps += [stages.step(gpu, size, "lowrank_normal", 1e-3, 1) for size in SIZES]
    for name, configs, flags in steps:
        args = [a for c in configs for a in ("--config", str(c))]
        result = run_cli("fit", *args, *flags, "--print_config")
        assert result.returncode == 0, (name, result.stderr[-1500:])
        config = result.config()
        meta = parse({"name": name})
        decoder = resolve(configs)["model"]["decoder"]
        assert config["model"]["decoder"]["d_model"] == decoder["d_model"]
        # the control's own optimizer settings survive the merges
        if meta["variant"].startswith("lowrank"):
            assert config["model"]["optimizer"]["input_lr_scale"] == 10.0
            assert config["model"]["optimizer"]["decay_input"] is False


def test_the_best_rate_is_chosen_among_finished_runs_only():
    scale = stages.Scale(False)
    rows = {
        run_name("bpe8k", "m", v, lr, 1): {"val_bpb": x}
        for v in PAPER
        for lr, x in ((1e-3, 2.0), (3e-3, 1.9))
    }
    rows[run_name("bpe8k", "m", "gf2", 1e-2, 1)] = {"val_bpb": 1.0}  # a rung only gf2 finished
    rows[run_name("bpe8k", "m", "learned", 3e-3, 1)] = {"val_bpb": float("nan")}  # diverged
    # another length: not the sweep
    rows[run_name("bpe8k", "m", "gf2", 2e-3, 1, steps=1024)] = {"val_bpb": 0.5}
    # another seed and codebook
    rows[run_name("bpe8k", "m", "gf2", 2e-3, 2, code=2)] = {"val_bpb": 0.5}
    swept = stages.swept(scale, rows)
    assert swept[("m", "learned")] == swept[("m", "binary16")] == [1e-3, 3e-3] and swept[
        ("m", "gf2")
    ] == [
        1e-3,
        3e-3,
        1e-2,
    ]
    assert swept[("s", "learned")] == []
    best, _ = stages.best_lrs(scale, rows, {key: lrs for key, lrs in swept.items() if lrs})
    assert best == {"m": {"learned": 1e-3, "binary16": 3e-3, "gf2": 1e-2}}
    with pytest.raises(SystemExit, match="no finished sweep run of learned at size m"):
        stages.best_lrs(scale, {}, {("m", "learned"): [1e-3]})


@pytest.mark.slow
def test_the_gpu_plan_smoke_runs_its_smallest_size_on_cpu(tmp_path, shared_data):
    """`make study-gpu ARGS=--smoke` on one config: the GPU plan's size S, 2 updates on this CPU."""
    name, configs, flags = stages.smoke_plan(stages.Scale(True))[0]
    assert name == "smollm2-s/learned-lr0.001-seed1"
    args = [a for c in configs for a in ("--config", str(c))]
    logger = [
        f"--trainer.logger.init_args.save_dir={tmp_path}",
        "--trainer.logger.init_args.name=smoke",
    ]
    result = run_cli("fit", *args, *flags, *stages.SMOKE, *logger)
    assert result.returncode == 0, result.stderr[-2000:]
    assert (tmp_path / "smoke" / "default" / "checkpoints" / "step=00000002.ckpt").is_file()
