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

from fixed_embed.errors import ConfigError

__all__ = ["tasks_dir"]


def tasks_dir() -> Path:
    return Path(__file__).resolve().parent


def check_task_folders(folders: list[str], what: str = "--include-path") -> None:
    """Refuse lm-eval task folders that do not exist, hold no task YAML or a YAML that does not parse."""
    import yaml

    class TaskLoader(yaml.SafeLoader):
        """lm-eval's task YAMLs use tags (``!function utils.process``): parsed as plain values, never run."""

    TaskLoader.add_multi_constructor("!", lambda loader, suffix, node: None)
    for include in folders:
        folder = Path(include)
        if not folder.is_dir():
            problem = "does not exist" if not folder.exists() else "is not a folder"
            raise ConfigError(f"{what} {include} {problem}: give a folder of lm-eval task YAMLs")
        files = sorted(folder.rglob("*.yaml"))
        if not files:
            raise ConfigError(f"{what} {include} holds no task YAML (*.yaml): give a folder of lm-eval task YAMLs")
        for task_file in files:
            try:
                loader = TaskLoader(task_file.read_text())
                try:
                    loader.get_single_data()
                finally:
                    loader.dispose()
            except (yaml.YAMLError, UnicodeDecodeError) as error:
                first = str(error).splitlines()[0] if str(error) else type(error).__name__
                raise ConfigError(f"{what} {include}: {task_file} is not valid YAML ({first})") from None
