"""A tokenizer changed in place, met outside the data module's places: the BPE cache trains it
again (or, with --out, refuses it), and every command that takes a checkpoint and a tokenizer
exits 2 naming both (the changes: tests/test_tokenizer_identity.py)."""

import json
import re
import shutil
from pathlib import Path

import pytest

from fixed_embed.data.tokenizer import load_tokenizer, tokenizer_fingerprint, train_bpe
from fixed_embed.errors import UserError
from tests.cli import run_cli
from tests.test_tokenizer_identity import write_changed, write_checkpoint, write_reserialized

# -- the BPE cache: a cached tokenizer changed behind its stamp is trained again (or, with --out,
# refused) --------


@pytest.mark.parametrize("section", ["normalizer", "model.vocab", "model.merges", "added_tokens"])
def test_a_cached_bpe_changed_in_place_is_not_reused(corpus, tmp_path, section):
    texts = [json.loads(line)["text"] for line in corpus[0].read_text().splitlines()]
    folder = tmp_path / "bpe"
    shutil.copytree(corpus[1].parent, folder)
    target, baseline = folder / "tokenizer.json", (folder / "tokenizer.json").read_text()
    expected = tokenizer_fingerprint(load_tokenizer(target))
    # the stamp matches: reused
    assert train_bpe(texts, 300, folder, "training-corpus", overwrite=False) == target
    write_reserialized(target)
    reserialized = target.read_text()
    # the same tokenizer
    assert train_bpe(texts, 300, folder, "training-corpus", overwrite=False) == target
    assert target.read_text() == reserialized  # reused, not trained again
    write_changed(target, section, baseline)
    with pytest.raises(
        UserError, match=rf"{re.escape(str(target))} already exists, made by unknown inputs"
    ):
        train_bpe(texts, 300, folder, "training-corpus", overwrite=False)
    train_bpe(texts, 300, folder, "training-corpus")  # the cache's way: trained again
    assert tokenizer_fingerprint(load_tokenizer(target)) == expected


# -- through the command line: one real resume, and each command that takes a checkpoint and
# --tokenizer ---------


def test_a_resume_with_the_tokenizer_changed_in_place_exits_2_naming_both(
    corpus, tmp_path, monkeypatch
):
    from tests.test_lifecycle import fit_args

    # where the refusal keeps the run's tokenizer
    monkeypatch.setenv("FIXED_EMBED_CACHE", str(tmp_path / "cache"))
    tokenizer = tmp_path / "tokenizer.json"
    shutil.copy(corpus[1], tokenizer)
    first = run_cli(
        *fit_args(
            tmp_path,
            (corpus[0], tokenizer),
            "gf2",
            "--trainer.max_steps",
            "1",
            "--ckpt_path",
            "last",
        )
    )
    assert first.returncode == 0, first.stderr[-3000:]
    before = tokenizer_fingerprint(load_tokenizer(tokenizer))
    write_changed(tokenizer, "normalizer", tokenizer.read_text())
    result = run_cli(
        *fit_args(
            tmp_path,
            (corpus[0], tokenizer),
            "gf2",
            "--trainer.max_steps",
            "2",
            "--ckpt_path",
            "last",
        )
    )
    assert result.returncode == 2, result.stderr[-3000:]
    [line] = [line for line in result.stderr.splitlines() if "refusing to resume" in line]
    assert before[:12] in line and tokenizer_fingerprint(load_tokenizer(tokenizer))[:12] in line, (
        line
    )
    assert "differ in normalizer" in line and "set data.tokenizer: " in line, line
    kept = Path(line.split("set data.tokenizer: ")[1].split(")")[0])
    # the fix it names is the run's own tokenizer
    assert tokenizer_fingerprint(load_tokenizer(kept)) == before


def _commands_overriding_a_checkpoints_tokenizer() -> list[str]:
    from tests.test_bad_paths import LIGHTNING, arguments, commands, role

    # fit, validate, test: data.tokenizer against --ckpt_path is the resume place (the data
    # module's check)
    found = [c for c in commands() if c not in LIGHTNING]
    return [
        c
        for c in found
        if {"checkpoint", "tokenizer"} <= {role(flag, c) for flag, _, _ in arguments(c)}
    ]


def test_the_commands_overriding_a_checkpoints_tokenizer_are_found():
    assert {"eval", "export"} <= set(_commands_overriding_a_checkpoints_tokenizer())


@pytest.mark.parametrize("command", _commands_overriding_a_checkpoints_tokenizer())
def test_a_command_given_another_tokenizer_than_its_checkpoints_exits_2_naming_the_flag(
    corpus, tmp_path, command
):
    from tests.test_bad_paths import baseline

    checkpoint = tmp_path / "tiny.ckpt"
    tokenizer = tmp_path / "tokenizer.json"
    shutil.copy(corpus[1], tokenizer)
    state = {"tokenizer": str(tokenizer), "tokenizer_json": load_tokenizer(tokenizer).to_str()}
    write_checkpoint(checkpoint, state)
    write_changed(tokenizer, "normalizer", tokenizer.read_text())
    lead, parts = baseline(command, {"checkpoint": checkpoint}, tmp_path)
    result = run_cli(
        *lead, *[token for part in parts.values() for token in part], "--tokenizer", str(tokenizer)
    )
    assert result.returncode == 2, result.stderr[-3000:]
    [line] = [line for line in result.stderr.splitlines() if "error:" in line]
    assert (
        "differ in normalizer" in line
        and "--tokenizer" in line
        and "Traceback" not in result.stderr
    ), line
