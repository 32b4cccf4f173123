"""Offline tasks' data: the default corpus's held-out split, or a YAML's ``dataset_kwargs:
{path}`` (.jsonl/.tokens)."""

from __future__ import annotations

import json
import random
import re
from typing import Any

from datasets import Dataset

from fixed_embed.data.corpus import default_corpus, shared_data_root

SEED = 20261130
_SENTENCE = re.compile(r"(?<=[.!?])\s+")
_WIKITEXT_TITLE = re.compile(r"^ = [^=].* = $")


def _documents(path: str | None = None) -> list[str]:
    file = default_corpus() / "valid.jsonl" if path is None else shared_data_root() / path
    if not file.is_file():
        raise FileNotFoundError(
            f"task data {file} not found; set FIXED_EMBED_DATA to the folder holding {path}"
        )
    if file.suffix == ".tokens":
        return _wikitext_articles(file.read_text(encoding="utf-8"))
    with open(file, encoding="utf-8") as f:
        return [json.loads(line)["text"] for line in f]


def _wikitext_articles(text: str) -> list[str]:
    """WikiText's articles, split at their top-level `` = Title = `` lines and detokenized like
    lm-eval's."""
    from lm_eval.tasks.wikitext.preprocess_wikitext import wikitext_detokenizer

    articles: list[list[str]] = []
    for line in text.splitlines(keepends=True):
        if _WIKITEXT_TITLE.match(line.rstrip("\n")) or not articles:
            articles.append([])
        articles[-1].append(line)
    return [wikitext_detokenizer({"page": page}) for page in map("".join, articles) if page.strip()]


def _sentences(path: str | None) -> list[str]:
    sentences = (
        sentence
        for text in _documents(path)
        for sentence in _SENTENCE.split(" ".join(text.split()))
    )
    return [
        s
        for s in sentences
        if 10 <= len(s.split()) <= 30 and s[:1].isupper() and not any(c in s for c in "|>{}")
    ]


def word_order(n_items: int = 200, path: str | None = None, **_: Any) -> dict[str, Dataset]:
    rng = random.Random(SEED)
    sentences = _sentences(path)
    rng.shuffle(sentences)
    rows = []
    for sentence in sentences:
        words = sentence.split()
        head, tail = words[: len(words) // 2], words[len(words) // 2 :]
        shuffled = tail[:]
        for _ in range(10):  # a permutation that differs from the original
            rng.shuffle(shuffled)
            if shuffled != tail:
                break
        else:
            continue
        gold = rng.randrange(2)
        choices = [
            " " + " ".join(part) for part in ((tail, shuffled) if gold == 0 else (shuffled, tail))
        ]
        rows.append({"query": " ".join(head), "choices": choices, "gold": gold})
        if len(rows) == n_items:
            break
    return {"test": Dataset.from_list(rows)}


def docs_ppl(
    n_docs: int | None = 20, max_chars: int | None = 4000, path: str | None = None, **_: Any
) -> dict[str, Dataset]:
    """The first ``n_docs`` documents of at least 500 characters, each cut to ``max_chars``
    (None: all, whole)."""
    docs = [text[:max_chars] for text in _documents(path) if len(text) >= 500][:n_docs]
    return {"test": Dataset.from_list([{"text": text} for text in docs])}
