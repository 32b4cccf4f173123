"""lm-eval tasks that run offline, built from held-out documents of the default corpus or local files.

``tasks_dir()`` is what to pass as lm-eval's ``include_path`` (``fixed-embed eval --include-path``
adds it by default). The datasets are made at load time, deterministically, by ``offline_data.py``:

- ``fixed_embed_word_order``: a held-out sentence's first half, then two continuations -- its true
  second half and the same words shuffled. Chance is 50 %; any model that learned word order
  prefers the true one. A quick, noisy, but real in-training signal for tiny models.
- ``fixed_embed_docs_ppl``: rolling word/byte perplexity over held-out documents (WikiText-style).
- ``gutenberg_word_order``, ``gutenberg_ppl``: the same two on gutenberg-prose's held-out books.
- ``wikitext2_local``: rolling perplexity over WikiText-2's validation articles (local file).

The last three read ``shared_data_root()`` (``$FIXED_EMBED_DATA``, default ``../shared/data``).
"""

from pathlib import Path

__all__ = ["tasks_dir"]


def tasks_dir() -> Path:
    return Path(__file__).resolve().parent
