"""The offline default corpus (docs/data.md, "No data configured"); read in sorted order,
deterministic per Python."""

from __future__ import annotations

import ast
import hashlib
import json
import os
import sys
import sysconfig
import warnings
from collections.abc import Iterator
from pathlib import Path

from fixed_embed.atomic import atomic_write
from fixed_embed.data.sharding import is_held_out

VALID_PER_MILLE = 50
_DOCUMENTED = (
    ast.Module,
    ast.ClassDef,
    ast.FunctionDef,
    ast.AsyncFunctionDef,
)  # what ast.get_docstring reads
_SKIP_DIRS = {
    "test",
    "tests",
    "idlelib",
    "site-packages",
    "dist-packages",
    "__pycache__",
    "lib2to3",
    "turtledemo",
}


def cache_root() -> Path:
    """``$FIXED_EMBED_CACHE`` or ``$XDG_CACHE_HOME/fixed-embed`` (default
    ``~/.cache/fixed-embed``)."""
    default = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "fixed-embed"
    return Path(os.environ.get("FIXED_EMBED_CACHE", default))


def shared_data_root() -> Path:
    """Local datasets (gutenberg-prose, ...): ``$FIXED_EMBED_DATA``, else ``../shared/data``
    from the checkout."""
    return Path(
        os.environ.get("FIXED_EMBED_DATA", Path(__file__).resolve().parents[3] / "shared" / "data")
    )


def _documents() -> Iterator[tuple[str, str]]:
    import pydoc_data.topics

    for name in sorted(pydoc_data.topics.topics):
        yield f"topic:{name}", pydoc_data.topics.topics[name].strip()
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    for path in sorted(stdlib.rglob("*.py")):
        if _SKIP_DIRS & set(path.relative_to(stdlib).parts):
            continue
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError, ValueError):
            continue
        docs = [
            doc
            for node in ast.walk(tree)
            if isinstance(node, _DOCUMENTED) and (doc := ast.get_docstring(node))
        ]
        if docs:
            yield f"module:{path.relative_to(stdlib).as_posix()}", "\n\n".join(docs)


def default_corpus() -> Path:
    """The folder holding ``train.jsonl`` and ``valid.jsonl``, built on first use, and rebuilt
    (with a warning) when their bytes no longer match the SHA-256 written with them (2 MB:
    hashed on every use)."""
    folder = cache_root() / f"default-corpus-py{sys.version_info.major}.{sys.version_info.minor}"
    if (sums := folder / "sha256.json").is_file():
        try:
            written = json.loads(sums.read_text())
            changed = [
                folder / name
                for name, digest in _digests(folder).items()
                if written[name] != digest
            ]
        except (ValueError, KeyError, TypeError):  # the sums file itself changed
            changed = [sums]
        if not changed:
            return folder
        warnings.warn(
            "the cached offline corpus changed since it was written "
            f"({', '.join(map(str, changed))}); "
            "rebuilding it",
            stacklevel=2,
        )
        sums.unlink(
            missing_ok=True
        )  # a rebuild cut short must not look like a changed corpus next time
    with (
        atomic_write(folder / "train.jsonl") as train,
        atomic_write(folder / "valid.jsonl") as valid,
    ):
        for doc_id, text in _documents():
            file = valid if is_held_out(doc_id, VALID_PER_MILLE) else train
            file.write(json.dumps({"id": doc_id, "text": text}) + "\n")
    with atomic_write(sums, "w") as file:  # last: its presence means the corpus is complete
        json.dump(_digests(folder), file)
    return folder


def _digests(folder: Path) -> dict[str, str | None]:
    paths = {name: folder / name for name in ("train.jsonl", "valid.jsonl")}
    return {
        name: hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else None
        for name, p in paths.items()
    }
