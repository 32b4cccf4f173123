"""Tokenizers: load one (hub id, tokenizer.json, or a folder holding one), or train a byte-level BPE."""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

__all__ = ["load_tokenizer", "special_token_id", "train_bpe"]

EOS = "<|endoftext|>"


def load_tokenizer(spec: str | os.PathLike) -> Tokenizer:
    """A ``tokenizers.Tokenizer`` from a local ``tokenizer.json``, a folder with one, or a hub id."""
    path = Path(spec).expanduser()
    if path.is_dir():
        path = path / "tokenizer.json"
        if not path.is_file():
            raise FileNotFoundError(f"tokenizer folder {spec} has no tokenizer.json")
    if path.is_file():
        return Tokenizer.from_file(str(path))
    if _looks_local(str(spec)):
        raise FileNotFoundError(f"tokenizer file or folder not found: {spec}")
    try:
        return Tokenizer.from_pretrained(str(spec))
    except Exception as error:  # the hub client raises several unrelated types
        raise OSError(
            f"could not load tokenizer {spec!r} from the Hugging Face hub ({type(error).__name__}: {error}). "
            "Without network access, pass a local tokenizer.json or a folder holding one, "
            "e.g. ../shared/data/smollm2-tokenizer/tokenizer.json"
        ) from error


def _looks_local(spec: str) -> bool:
    """A hub id is ``owner/name``; anything else that does not exist is a missing local path."""
    return spec.endswith(".json") or spec.startswith((".", "/", "~")) or spec.count("/") != 1


def special_token_id(tokenizer: Tokenizer, token: str) -> int:
    token_id = tokenizer.token_to_id(token)
    if token_id is None:
        raise ValueError(f"the tokenizer has no {token!r} token (vocab size {tokenizer.get_vocab_size()})")
    return token_id


def train_bpe(texts: Iterable[str], vocab_size: int, out_dir: str | os.PathLike, fingerprint: str) -> Path:
    """Train a byte-level BPE with EOS = ``<|endoftext|>`` at id 0; cached by ``fingerprint``.

    Returns the path of ``tokenizer.json``. A folder whose ``fingerprint.json`` matches is
    reused without retraining.
    """
    if vocab_size < 257 + 1:
        raise ValueError(f"a byte-level BPE needs vocab_size > 257 (256 bytes + EOS), got {vocab_size}")
    out = Path(out_dir)
    key = hashlib.sha256(f"{fingerprint}|{vocab_size}".encode()).hexdigest()
    stamp = out / "fingerprint.json"
    if stamp.is_file() and json.loads(stamp.read_text()).get("key") == key and (out / "tokenizer.json").is_file():
        return out / "tokenizer.json"
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[EOS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer=trainer)
    out.mkdir(parents=True, exist_ok=True)
    tmp = out / f".tokenizer.json.{os.getpid()}"
    tokenizer.save(str(tmp))
    os.replace(tmp, out / "tokenizer.json")
    stamp.write_text(json.dumps({"key": key, "vocab_size": tokenizer.get_vocab_size(), "source": fingerprint}))
    return out / "tokenizer.json"
