"""Tokenizers: load one (hub id, tokenizer.json, or a folder holding one), or train a byte-level
BPE."""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

from tokenizers import Tokenizer
from tokenizers.implementations import ByteLevelBPETokenizer

from fixed_embed.atomic import atomic_path, atomic_write_text
from fixed_embed.data.corpus import cache_root
from fixed_embed.errors import ConfigError, DataError, MissingFileError

if (
    TYPE_CHECKING
):  # sources imports datasets, which loading a tokenizer (evaluation, export) does not need
    from fixed_embed.data.sources import DocumentSource

EOS = "<|endoftext|>"
ACCEPTED = "a hub id (owner/name), a tokenizer.json, or a folder holding one"
MIN_VOCAB_FRACTION = 0.5  # a trained BPE smaller than this share of the size asked is refused


def load_tokenizer(spec: str | os.PathLike) -> Tokenizer:
    """A ``tokenizers.Tokenizer`` from a local ``tokenizer.json``, a folder with one, or a hub
    id."""
    name, path = str(spec), Path(spec).expanduser()
    if path.is_dir():
        path = path / "tokenizer.json"
        if not path.is_file():
            raise MissingFileError(
                f"tokenizer folder {spec} has no tokenizer.json; give {ACCEPTED}"
            )
    if path.is_file():
        try:
            return Tokenizer.from_file(str(path))
        except Exception as error:  # the Rust side raises a bare Exception
            raise DataError(
                f"{path} is not a valid tokenizers JSON ({str(error).splitlines()[0][:200]}); "
                f"re-create it (fixed-embed tokenizer) or point to another: {ACCEPTED}"
            ) from error
    if name.endswith(".json") or name.startswith((".", "/", "~")) or name.count("/") != 1:
        # not a hub id (owner/name): a local path that does not exist
        raise MissingFileError(f"tokenizer file or folder not found: {spec}; give {ACCEPTED}")
    try:
        return Tokenizer.from_pretrained(name)
    except Exception as error:  # the hub client raises several unrelated types
        raise MissingFileError(
            f"could not load tokenizer {spec!r} from the Hugging Face hub ({type(error).__name__}: "
            f"{error}). "
            "Without network access, pass a local tokenizer.json or a folder holding one, "
            "e.g. ../shared/data/smollm2-tokenizer/tokenizer.json"
        ) from error


def special_token_id(tokenizer: Tokenizer, token: str) -> int:
    token_id = tokenizer.token_to_id(token)
    if token_id is None:
        raise ConfigError(
            f"the tokenizer has no {token!r} token (vocab size {tokenizer.get_vocab_size()}); "
            "training, evaluation and export end every document with it: use a tokenizer that has "
            "it"
        )
    return token_id


def tokenizer_fingerprint(tokenizer: Tokenizer) -> str:
    """A tokenizer's identity (resume, shards, eval, caches): SHA-256 of all its sorted-key
    JSON, not its path."""
    canonical = json.dumps(json.loads(tokenizer.to_str()), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


def tokenizer_mismatch(
    then: Tokenizer, then_name: str, now: Tokenizer, now_name: str
) -> str | None:
    """``None`` for the same tokenizer, else both named with their fingerprints and the JSON
    sections that differ."""
    if (old := tokenizer_fingerprint(then)) == (new := tokenizer_fingerprint(now)):
        return None
    a, b = (
        {**d["model"], **d} for d in (json.loads(t.to_str()) for t in (then, now))
    )  # the model's vocab, merges
    differ = ", ".join(
        sorted(key for key in (a.keys() | b.keys()) - {"model"} if a.get(key) != b.get(key))
    )
    return f"{then_name} (fingerprint {old[:12]}) and {now_name} ({new[:12]}) differ in {differ}"


def kept_copy(tokenizer: Tokenizer) -> str:
    """``tokenizer`` as a file in the cache, named by its fingerprint: what a refusal can offer
    as data.tokenizer (where the cache cannot take it, a word saying so: the refusal is not to
    become a write error)."""
    path = cache_root() / "tokenizers" / f"fingerprint-{tokenizer_fingerprint(tokenizer)[:16]}.json"
    try:
        return str(atomic_write_text(path, tokenizer.to_str()))
    except OSError as error:
        return f"the checkpoint's tokenizer, which could not be copied to {path}: {error.strerror}"


def bpe_for_source(
    source: DocumentSource,
    vocab_size: int,
    out_dir: str | os.PathLike | None = None,
    *,
    overwrite: bool = True,
) -> Path:
    """The ``tokenizer.json`` of a byte-level BPE of ``vocab_size`` on ``source``, trained once;
    without ``out_dir`` in the cache, named by the corpus and the size, so the CLI and
    ``TextDataModule`` find the same file and corpora never share one."""
    fingerprint = repr(source.fingerprint())
    digest = hashlib.sha256(fingerprint.encode()).hexdigest()[:16]
    out = Path(out_dir or cache_root() / "tokenizers" / f"bpe-{vocab_size}-{digest}")
    texts = (row[source.text_field] for row in source.open())
    return train_bpe(texts, vocab_size, out, fingerprint, corpus=source.path, overwrite=overwrite)


def train_bpe(
    texts: Iterable[str],
    vocab_size: int,
    out_dir: str | os.PathLike,
    fingerprint: str,
    *,
    corpus: str | None = None,
    overwrite: bool = True,
) -> Path:
    """Train a byte-level BPE (EOS at id 0); returns its ``tokenizer.json``, reused when
    ``fingerprint.json`` matches; another is replaced if ``overwrite``, else refused. Under
    ``MIN_VOCAB_FRACTION`` of the size: DataError, no file."""
    if vocab_size <= 257:
        raise ConfigError(
            f"a byte-level BPE needs vocab_size > 257 (256 bytes + EOS), got {vocab_size}; "
            "ask for more (--vocab-size, data.tokenizer_vocab_size)"
        )
    out = Path(out_dir)
    key = hashlib.sha256(f"{fingerprint}|{vocab_size}".encode()).hexdigest()
    stamp, target = out / "fingerprint.json", out / "tokenizer.json"
    if target.is_file():
        # the stamp and the tokenizer.json it describes (the Rust side raises a bare Exception):
        # else made anew
        try:
            stored = dict(json.loads(stamp.read_text()))
            identity = tokenizer_fingerprint(Tokenizer.from_file(str(target)))
        except Exception:
            stored, identity = {}, None
        stamped = stored.get("tokenizer_fingerprint", identity) == identity  # of this file
        if stored.get("key") == key and stamped:
            return target
        if not overwrite:
            made = "by unknown inputs: no matching fingerprint.json"
            if stamped and "source" in stored:
                made = f"from {stored.get('source')}, vocab {stored.get('vocab_size')}"
            raise ConfigError(
                f"{target} already exists, made {made}, not from {corpus or fingerprint} at vocab "
                f"{vocab_size}; pass --overwrite to replace it, or choose another --out"
            )
    tokenizer, counts = _train(texts, vocab_size)
    if (got := tokenizer.get_vocab_size()) < MIN_VOCAB_FRACTION * vocab_size:
        raise DataError(
            f"the BPE trained on {corpus or fingerprint} learned only {got} of the {vocab_size} "
            f"tokens asked: too little text ({counts['documents']} documents, {counts['blank']} "
            "empty or whitespace-only). Give more text or ask for a smaller vocabulary "
            "(data.tokenizer_vocab_size, --vocab-size); nothing was written."
        )
    # never a stamp describing another tokenizer.json, even after a crash
    stamp.unlink(missing_ok=True)
    with atomic_path(target) as tmp:
        tokenizer.save(str(tmp))
    record = {
        "key": key,
        "vocab_size": got,
        "source": corpus or fingerprint,
        "tokenizer_fingerprint": tokenizer_fingerprint(tokenizer),
        "fingerprint": fingerprint,
    }
    atomic_write_text(stamp, json.dumps(record))
    return target


def _train(texts: Iterable[str], vocab_size: int) -> tuple[ByteLevelBPETokenizer, dict[str, int]]:
    """A byte-level BPE trained on ``texts``, and how many documents (and blank ones) it read."""
    tokenizer = ByteLevelBPETokenizer(add_prefix_space=False, trim_offsets=False)
    counts = {"documents": 0, "blank": 0}

    def counted(texts: Iterable[str]) -> Iterable[str]:
        for text in texts:
            counts["documents"] += 1
            counts["blank"] += not text.strip()
            yield text

    tokenizer.train_from_iterator(
        counted(texts), vocab_size, min_frequency=0, special_tokens=[EOS], show_progress=False
    )
    return tokenizer, counts
