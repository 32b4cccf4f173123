"""Code tokens: the size measure of the library's and ``experiments/``'s budgets (pyproject.toml
``[tool.fixed-embed]``, checked by ``make lint`` and tests/test_layout.py).

A code token is a Python token of the source less its comments, docstrings and layout (newlines,
indentation), so that how the formatter lays a statement out never changes the count: an implicitly
concatenated string is one token however many lines it is wrapped over, and a comma just before a
closing bracket (the formatter's trailing comma) is none. ``python -m tests.code_tokens [PATH ...]``
prints the count per package.
"""

from __future__ import annotations

import ast
import io
import sys
import tokenize
from collections.abc import Iterable
from pathlib import Path

LAYOUT = {
    tokenize.COMMENT,
    tokenize.NL,
    tokenize.NEWLINE,
    tokenize.INDENT,
    tokenize.DEDENT,
    tokenize.ENCODING,
    tokenize.ENDMARKER,
}


def _docstrings(tree: ast.AST) -> set[tuple[int, int]]:
    starts = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            first = node.body[0] if node.body else None
            value = first.value if isinstance(first, ast.Expr) else None
            if isinstance(value, ast.Constant) and isinstance(value.value, str):
                starts.add((first.lineno, first.col_offset))
    return starts


def code_tokens(source: str) -> int:
    """The code tokens of one module's source."""
    docstrings = _docstrings(ast.parse(source))
    tokens = [
        t for t in tokenize.generate_tokens(io.StringIO(source).readline) if t.type not in LAYOUT
    ]
    count = 0
    for i, token in enumerate(tokens):
        after = tokens[i + 1] if i + 1 < len(tokens) else None
        if token.type == tokenize.STRING and (
            token.start in docstrings or (after is not None and after.type == tokenize.STRING)
        ):
            continue  # a docstring, or not the last piece of a concatenated string
        if token.string == "," and after is not None and after.string in ")]}":
            continue
        count += 1
    return count


def tree_tokens(paths: Iterable[Path]) -> int:
    return sum(code_tokens(p.read_text()) for root in paths for p in sorted(root.rglob("*.py")))


def main(argv: list[str]) -> int:
    root = Path(__file__).resolve().parents[1]
    folders = [Path(a).resolve() for a in argv] or [
        root / "fixed_embed",
        root / "callbacks",
        root / "experiments",
    ]
    for folder in folders:
        for package in sorted(p for p in folder.iterdir() if p.suffix == ".py" or p.is_dir()):
            files = [package] if package.is_file() else sorted(package.rglob("*.py"))
            if files:
                lines = sum(len(f.read_text().splitlines()) for f in files)
                tokens = sum(code_tokens(f.read_text()) for f in files)
                print(f"{tokens:8,} tokens {lines:7,} lines  {package.relative_to(root)}")
        print(f"{tree_tokens([folder]):8,} tokens in all  {folder.relative_to(root)}/")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
