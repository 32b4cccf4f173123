"""A tokenizer is what its JSON says, not its path or its vocabulary: changed in place, it is
another tokenizer wherever it meets ids made with the first one; loaded and saved again, it is
the same one everywhere.

Generated, not listed: every section of a real tokenizer's JSON (the top level's and the
model's, discovered from the file) gets a change (:data:`CHANGES`; a section without one fails
:func:`test_every_section_has_a_change`), written over the same file (the same size where the
change allows, the old modification time kept). Each change is tried at every place that meets
saved state (:data:`PLACES`, each naming the library modules it exercises; a module using the
identity that no place exercises fails :func:`test_every_module_using_the_identity_is_a_place`):
refused in one line naming both fingerprints. The tokenizers: the conftest corpus's BPE, and
SmolLM2's (``../shared/data/smollm2-tokenizer``, skipped when absent).
"""

from __future__ import annotations

import json
import os
import re
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch

from fixed_embed.data import TextDataModule
from fixed_embed.data.loader_state import LOADER_STATES
from fixed_embed.data.pretokenize import pretokenize
from fixed_embed.data.sources import DocumentSource
from fixed_embed.data.tokenizer import load_tokenizer, tokenizer_fingerprint
from fixed_embed.errors import UserError
from fixed_embed.evaluation.lm_eval_model import FixedEmbedLM
from fixed_embed.evaluation.loading import load_checkpoint
from tests.conftest import SHARED_DATA

ROOT = Path(__file__).resolve().parents[1]
SMOLLM2 = SHARED_DATA / "smollm2-tokenizer" / "tokenizer.json"


def _swap_two_ids(vocab: dict[str, int]) -> dict[str, int]:
    (a, i), (b, j) = sorted(vocab.items(), key=lambda item: item[1])[-2:]
    return {**vocab, a: j, b: i}


def _either(value: Any, other: Any) -> Any:
    return other if value is None else None


# A change per section: what a user editing the file (or a tool writing it) might do. Keyed
# "section" for the top level and "model.field" for the model's own fields.
CHANGES: dict[str, Callable[[Any], Any]] = {
    "normalizer": lambda v: _either(v, {"type": "NFKC"}),
    "pre_tokenizer": lambda v: {
        "type": "Sequence",
        "pretokenizers": [{"type": "Digits", "individual_digits": True}, v],
    },
    "post_processor": lambda v: _either(
        v, {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True}
    ),
    "decoder": lambda v: {"type": "Fuse"},
    "truncation": lambda v: _either(
        v, {"direction": "Right", "max_length": 8, "strategy": "LongestFirst", "stride": 0}
    ),
    "padding": lambda v: _either(
        v,
        {
            "strategy": "BatchLongest",
            "direction": "Right",
            "pad_to_multiple_of": None,
            "pad_id": 0,
            "pad_type_id": 0,
            "pad_token": "<|endoftext|>",
        },
    ),
    "added_tokens": lambda v: [{**v[0], "lstrip": not v[0]["lstrip"]}, *v[1:]],
    "model.vocab": _swap_two_ids,  # the same size: two ids trade places
    "model.merges": lambda v: [v[1], v[0], *v[2:]],  # the same size: two merges trade ranks
    "model.dropout": lambda v: _either(v, 0.5),
    "model.unk_token": lambda v: _either(v, "<|endoftext|>"),
    # a longer one panics: no merge has it
    "model.continuing_subword_prefix": lambda v: _either(v, ""),
    "model.end_of_word_suffix": lambda v: _either(v, "</w>"),
    "model.fuse_unk": lambda v: not v,
    "model.byte_fallback": lambda v: not v,
    "model.ignore_merges": lambda v: not v,
}
SAME_SIZE = {"model.vocab", "model.merges"}
# SmolLM2's (each at one place): the reported change and the same-size ones
# the corpus BPE tries every section everywhere
ONE_PLACE_EACH = [
    "normalizer",
    "model.vocab",
    "model.merges",
]
UNCHANGEABLE = {
    "version": "the format's version: another is no tokenizer this library reads (load_tokenizer "
    "refuses it)",
    "model.type": "another model type reads none of this model's fields: no tokenizer",
}


def sections(path: Path) -> list[str]:
    """The sections of the tokenizer JSON at ``path``: the top level's and the model's fields."""
    data = json.loads(path.read_text())
    return [key for key in data if key != "model"] + [f"model.{key}" for key in data["model"]]


def write_changed(path: Path, section: str, baseline: str) -> None:
    """``baseline`` (the tokenizer's text) with ``section`` changed, written over ``path``, its
    mtime kept."""
    data, stat = json.loads(baseline), path.stat()
    owner, key = (data["model"], section[6:]) if section.startswith("model.") else (data, section)
    owner[key] = CHANGES[section](owner[key])
    path.write_text(json.dumps(data, indent=2, ensure_ascii=False))
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))


def write_reserialized(path: Path) -> None:
    """The same tokenizer loaded and saved again: keys in another order, other whitespace and
    escapes."""
    data = json.loads(load_tokenizer(path).to_str())
    path.write_text(
        json.dumps(data, sort_keys=True, separators=(", ", ": "), ensure_ascii=True) + "\n\n"
    )


# -- the state saved with the baseline tokenizer, before any change
# --------------------------------------------


@dataclass
class Saved:
    tokenizer: Path  # data.tokenizer and --tokenizer: the file each change is written over
    corpus: Path
    resume_state: dict  # a checkpoint's data: the data module's state and a text-stream position
    shards: Path
    checkpoint: Path
    validation_cache: Path
    fingerprint: str
    held: list[str]  # its sections
    every_place: (
        bool  # each change at every place; else ONE_PLACE_EACH (SmolLM2's 49k tokens: ~1 s a place)
    )


def _datamodule(saved: Saved, **options: Any) -> TextDataModule:
    options = {
        "train": str(saved.corpus),
        "tokenizer": str(saved.tokenizer),
        "seq_len": 16,
        **options,
    }
    return TextDataModule(val_sequences=4, holdout_per_mille=300, **options)


# 49k tokens
@pytest.fixture(
    scope="module", params=["corpus-bpe", pytest.param("smollm2", marks=pytest.mark.slow)]
)
def saved(request, corpus, tmp_path_factory):
    if request.param == "smollm2" and not SMOLLM2.is_file():
        pytest.skip(f"the SmolLM2 tokenizer is not at {SMOLLM2}")
    folder = tmp_path_factory.mktemp(f"identity-{request.param}")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("FIXED_EMBED_CACHE", str(folder / "cache"))
        tokenizer = folder / "tokenizer.json"
        baseline = load_tokenizer(SMOLLM2 if request.param == "smollm2" else corpus[1])
        tokenizer.write_text(
            json.dumps(json.loads(baseline.to_str()), indent=2, ensure_ascii=False)
        )
        saved = Saved(
            tokenizer,
            corpus[0],
            {},
            folder / "shards",
            folder / "tiny.ckpt",
            Path(),
            "",
            sections(tokenizer),
            every_place=request.param != "smollm2",
        )
        datamodule = _datamodule(saved)
        next(iter(stream := datamodule.train_source.training_stream()))
        saved.resume_state = {
            LOADER_STATES: [[stream.state_dict()]],
            "datamodule_hyper_parameters": {"num_workers": 0},
            "TextDataModule": datamodule.state_dict(),
        }
        pretokenize(
            DocumentSource(str(corpus[0])),
            str(tokenizer),
            saved.shards,
            shards=2,
            holdout_per_mille=100,
        )
        write_checkpoint(saved.checkpoint, saved.resume_state["TextDataModule"])
        saved.validation_cache = (
            _datamodule(saved).train_source.validation_cache(held_out=True).path
        )
        saved.fingerprint = tokenizer_fingerprint(baseline)
        yield saved


def write_checkpoint(path: Path, datamodule_state: dict) -> None:
    from fixed_embed.train.module import LanguageModel
    from tests.helpers import TINY_DECODER

    model = LanguageModel(decoder=TINY_DECODER)
    torch.save(
        {
            "state_dict": model.state_dict(),
            "hyper_parameters": dict(model.hparams),
            "global_step": 0,
            "TextDataModule": datamodule_state,
        },
        path,
    )


# -- the places a tokenizer meets saved state: each raises a UserError to refuse
# ----------------------------------


@dataclass
class Place:
    meet: Callable[[Saved], Any]
    modules: tuple[str, ...]  # the library modules whose check it exercises
    file: Callable[[Saved], Path] = lambda saved: saved.tokenizer  # the tokenizer file it reads


def _resume(saved: Saved) -> None:
    datamodule = _datamodule(saved)
    refusals = datamodule.resume_refusals(saved.resume_state, 1)
    assert len(refusals) <= 1, refusals
    # validate, test: the same check at load
    datamodule.load_state_dict(saved.resume_state["TextDataModule"])
    if refusals:  # the load above refused too, or this fails
        raise AssertionError(f"load_state_dict accepted what resume_refusals refused: {refusals}")


def _shards(given: bool) -> Callable[[Saved], None]:
    """``data.tokenizer`` given (the file changed), or null: the shards' own copy (that file
    changed)."""

    def meet(saved: Saved) -> None:
        TextDataModule(
            train=str(saved.shards),
            tokenizer=str(saved.tokenizer) if given else None,
            seq_len=16,
            holdout_per_mille=100,
        ).setup("fit")

    return meet


PLACES = {
    "resume (data module)": Place(_resume, ("data.datamodule", "data.text_stream")),
    "token shards, data.tokenizer": Place(
        _shards(True), ("data.token_shards", "data.shard_source", "data.pretokenize")
    ),
    "token shards, their own copy": Place(
        _shards(False), ("data.token_shards",), lambda saved: saved.shards / "tokenizer.json"
    ),
    "eval and export --tokenizer": Place(
        lambda saved: load_checkpoint(saved.checkpoint, str(saved.tokenizer)),
        ("evaluation.loading", "evaluation.export"),
    ),
    "lm-eval tokenizer=": Place(
        lambda saved: FixedEmbedLM(str(saved.checkpoint), str(saved.tokenizer), device="cpu"),
        ("evaluation.lm_eval_model",),
    ),
}


@pytest.fixture
def restored(saved):
    """Every file a place reads, put back as the baseline wrote it (bytes and mtime) after the
    test."""
    files = {place.file(saved) for place in PLACES.values()}
    kept = {path: (path.read_bytes(), path.stat()) for path in files}
    yield
    for path, (data, stat) in kept.items():
        path.write_bytes(data)
        os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))


def test_every_section_has_a_change(corpus):
    found = set(sections(corpus[1])) | (set(sections(SMOLLM2)) if SMOLLM2.is_file() else set())
    missing = found - set(CHANGES) - set(UNCHANGEABLE)
    assert not missing, (
        "tokenizer JSON sections without a change in CHANGES (or a reason in UNCHANGEABLE): "
        f"{missing}"
    )


def test_every_module_using_the_identity_is_a_place():
    """A module that compares tokenizers uses tokenizers' one identity, and some place here
    tries it."""
    users = {
        ".".join(path.relative_to(ROOT / "fixed_embed").with_suffix("").parts)
        for path in (ROOT / "fixed_embed").rglob("*.py")
        if re.search(r"\btokenizer_(fingerprint|mismatch)\b|\bkept_copy\b", path.read_text())
    } - {"data.tokenizer"}
    covered = {module for place in PLACES.values() for module in place.modules}
    assert users <= covered, (
        f"modules using the tokenizer's identity that no place in PLACES tries: {users - covered}"
    )
    for path in (ROOT / "fixed_embed").rglob("*.py"):  # the vocabulary alone is not the identity
        assert not re.search(r"get_vocab\(\)\s*[!=]=", path.read_text()), (
            f"{path} compares vocabularies"
        )


@pytest.mark.parametrize("section", sorted(CHANGES))
def test_a_tokenizer_changed_in_place_is_refused_everywhere_in_one_line_naming_both(
    saved, restored, section
):
    if section not in saved.held:
        pytest.skip(f"this tokenizer has no {section}")
    baseline, places = saved.tokenizer.read_text(), list(PLACES.items())
    if not saved.every_place:  # each of ONE_PLACE_EACH at one place, in turn: every place is tried
        if section not in ONE_PLACE_EACH:
            pytest.skip(f"{section} is tried on the corpus BPE at every place")
        places = [places[ONE_PLACE_EACH.index(section) % len(places)]]
    for name, place in places:
        path = place.file(saved)
        # the same tokenizer, in the form write_changed writes (for the size)
        path.write_text(baseline)
        size = path.stat().st_size
        write_changed(path, section, baseline)
        changed = tokenizer_fingerprint(load_tokenizer(path))
        assert changed != saved.fingerprint, f"{section}: the change did not change the tokenizer"
        assert section not in SAME_SIZE or path.stat().st_size == size, (
            f"{section}: not the same size"
        )
        with pytest.raises(UserError) as refused:
            place.meet(saved)
        message = str(refused.value)
        assert "\n" not in message, f"{name}: {message}"
        assert saved.fingerprint[:12] in message and changed[:12] in message, f"{name}: {message}"
        path.write_text(baseline)


@pytest.mark.parametrize("section", sorted(CHANGES))
def test_a_changed_tokenizer_has_its_own_validation_cache(saved, restored, section):
    if section not in saved.held or not (saved.every_place or section in SAME_SIZE):
        pytest.skip(f"this tokenizer has no {section}, or it is tried on the other one")
    write_changed(saved.tokenizer, section, saved.tokenizer.read_text())
    assert (
        _datamodule(saved).train_source.validation_cache(held_out=True).path
        != saved.validation_cache
    )


def test_the_same_tokenizer_saved_again_is_accepted_everywhere(saved, restored):
    for place in PLACES.values():
        write_reserialized(place.file(saved))
        place.meet(saved)  # no refusal
    assert (
        _datamodule(saved).train_source.validation_cache(held_out=True).path
        == saved.validation_cache
    )


def test_the_same_tokenizer_at_another_path_resumes(saved, tmp_path):
    moved = tmp_path / "elsewhere.json"
    shutil.copy(saved.tokenizer, moved)
    assert _datamodule(saved, tokenizer=str(moved)).resume_refusals(saved.resume_state, 1) == []
