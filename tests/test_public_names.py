"""The Python names a user writes import: every ``from fixed_embed... import ...`` (and
``from callbacks import ...``) in README.md and docs/*.md, so a new example is covered by itself,
and the names that broke when their modules moved (docs/design.md, "Public names")."""

import importlib
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
IMPORT = re.compile(r"\bfrom ((?:fixed_embed|callbacks)(?:\.\w+)*) import ([\w, ]+)")
# once broke: `from fixed_embed.model import Decoder, DecoderConfig`, `fixed_embed.module`
ONCE_BROKEN = {
    ("fixed_embed.model", "Decoder"),
    ("fixed_embed.model", "DecoderConfig"),
    ("fixed_embed.train", "LanguageModel"),
    ("fixed_embed.data", "TextDataModule"),
}


def documented() -> list[tuple[str, str, str]]:
    """(page, module, name) for each name a page of the docs imports."""
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    return [
        (page.name, module, name)
        for page in pages
        for module, names in IMPORT.findall(page.read_text())
        for name in re.findall(r"\w+", names)
    ]


@pytest.mark.parametrize("page, module, name", documented())
def test_every_name_the_docs_import_imports(page, module, name):
    assert hasattr(importlib.import_module(module), name), f"{page}: from {module} import {name}"


def test_the_docs_import_the_names_that_once_broke():
    shown = {(module, name) for _, module, name in documented()}
    assert not ONCE_BROKEN - shown, ONCE_BROKEN - shown
