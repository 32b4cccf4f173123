"""Datasets of the offline tasks (see ``__init__``), from the default corpus's validation split."""

from __future__ import annotations

import json
import random
import re
from typing import Any

from datasets import Dataset

from fixed_embed.data.corpus import default_corpus

SEED = 20261130
_SENTENCE = re.compile(r"(?<=[.!?])\s+")


def _documents() -> list[str]:
    with open(default_corpus() / "valid.jsonl") as f:
        return [json.loads(line)["text"] for line in f]


def _sentences() -> list[str]:
    out = []
    for text in _documents():
        for sentence in _SENTENCE.split(" ".join(text.split())):
            words = sentence.split()
            if 10 <= len(words) <= 30 and sentence[:1].isupper() and not any(c in sentence for c in "|>{}"):
                out.append(sentence)
    return out


def word_order(n_items: int = 200, **_: Any) -> dict[str, Dataset]:
    rng = random.Random(SEED)
    sentences = _sentences()
    rng.shuffle(sentences)
    rows = []
    for sentence in sentences:
        words = sentence.split()
        half = len(words) // 2
        tail = words[half:]
        shuffled = tail[:]
        for _ in range(10):  # a permutation that differs from the original
            rng.shuffle(shuffled)
            if shuffled != tail:
                break
        else:
            continue
        gold = rng.randrange(2)
        choices = [" " + " ".join(tail), " " + " ".join(shuffled)] if gold == 0 else [
            " " + " ".join(shuffled), " " + " ".join(tail)]  # fmt: skip
        rows.append({"query": " ".join(words[:half]), "choices": choices, "gold": gold})
        if len(rows) == n_items:
            break
    return {"test": Dataset.from_list(rows)}


def docs_ppl(n_docs: int = 20, max_chars: int = 4000, **_: Any) -> dict[str, Dataset]:
    docs = [text[:max_chars] for text in _documents() if len(text) >= 500][:n_docs]
    return {"test": Dataset.from_list([{"text": text} for text in docs])}
