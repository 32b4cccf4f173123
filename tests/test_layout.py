"""The tree's shape: the layers' import contracts (pyproject.toml), the code-token budgets,
files of at most 400 lines; the library never imports the ``fixed-embed`` command, whose modules
are shells of one shape."""

import ast
from pathlib import Path

import pytest
import tomllib
from importlinter import cli  # noqa: F401  (configures import-linter)
from importlinter.application.use_cases import lint_imports

from tests.code_tokens import code_tokens, tree_tokens

ROOT = Path(__file__).resolve().parents[1]
CLI = ROOT / "fixed_embed" / "cli"
SHELLS = {CLI, ROOT / "fixed_embed" / "__main__.py"}  # the command itself may import it


def imported_modules(tree: ast.AST) -> set[str]:
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names |= {node.module, *(f"{node.module}.{alias.name}" for alias in node.names)}
    return names


def test_the_library_never_imports_the_cli():
    offenders = []
    for folder in (ROOT / "fixed_embed", ROOT / "callbacks"):
        for path in sorted(folder.rglob("*.py")):
            if any(path == shell or shell in path.parents for shell in SHELLS):
                continue
            hits = sorted(
                m
                for m in imported_modules(ast.parse(path.read_text()))
                if m.startswith("fixed_embed.cli")
            )
            offenders += [f"{path.relative_to(ROOT)}: {name}" for name in hits]
    assert not offenders, "\n".join(offenders)


def test_every_command_module_exposes_run_argv_and_no_library():
    # entry point, dispatcher, the two parsers
    allowed = {
        "run",
        "main",
        "FixedEmbedCLI",
        "CommandParser",
    }
    for path in sorted(CLI.glob("*.py")):
        tree = ast.parse(path.read_text())
        defined = {n.name: n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
        public = {name for name in defined if not name.startswith("_")}
        assert public <= allowed, (
            f"{path.name} defines {sorted(public - allowed)}: library code belongs outside cli/"
        )
        if path.name != "__init__.py":
            run = defined.get("run")
            assert isinstance(run, ast.FunctionDef), f"{path.name} has no run(argv)"
            assert [a.arg for a in run.args.args] == ["argv"], f"{path.name}: run must take (argv)"


BUDGETS = {  # pyproject.toml [tool.fixed-embed] key -> the folders it holds
    "library_tokens": ("fixed_embed", "callbacks"),
    "experiments_tokens": ("experiments",),
}


@pytest.mark.parametrize("key", BUDGETS)
def test_the_library_and_experiments_stay_within_their_code_token_budgets(key):
    budget = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["fixed-embed"][key]
    tokens = tree_tokens(ROOT / folder for folder in BUDGETS[key])
    assert tokens <= budget, (
        f"{' + '.join(BUDGETS[key])} hold {tokens:,} code tokens, over the budget of {budget:,} "
        f"(pyproject.toml [tool.fixed-embed] {key}): delete before you add"
    )


def test_the_token_count_ignores_layout_comments_and_docstrings():
    packed = 'def f(a, b):\n    """Doc."""\n    return g("x" "y", a, b)  # why\n'
    wrapped = 'def f(\n    a,\n    b,\n):\n    return g(\n        "x"\n        "y",\n'
    wrapped += "        a,\n        b,\n    )\n"
    assert code_tokens(packed) == code_tokens(wrapped) == 17
    assert code_tokens(packed + "x = 1\n") == 20


def test_every_import_keeps_the_layer_contracts(capsys):
    # grimp reads the source; nothing is imported. The output names each broken contract and its
    # import chain. Not importlinter.cli.lint_imports: its logging dictConfig would silence every
    # logger of this process.
    assert lint_imports(
        config_filename=str(ROOT / "pyproject.toml"), cache_dir=None, no_logo=True
    ), capsys.readouterr().out


def test_no_file_in_the_tree_is_over_400_lines():
    ours = [
        p
        for p in ROOT.rglob("*.py")
        if not any(part.startswith(".") for part in p.relative_to(ROOT).parts)
    ]
    long = {
        str(p.relative_to(ROOT)): n for p in ours if (n := len(p.read_text().splitlines())) > 400
    }
    assert not long, f"files over 400 lines (split them by concept): {long}"


@pytest.mark.parametrize("package", ["fixed_embed", "experiments"])
def test_every_package_and_root_module_has_a_layer(package):
    # a module no layer names could import anything, unseen by the layers contracts
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"][
        "contracts"
    ]
    layers = [
        layer for contract in config if contract["type"] == "layers" for layer in contract["layers"]
    ]
    named = {name.strip() for layer in layers for name in layer.split("|")}
    children = {
        f"{package}.{p.stem if p.is_file() else p.name}"
        for p in (ROOT / package).iterdir()
        if (p.suffix == ".py" or (p / "__init__.py").is_file())
        and p.stem not in ("__init__", "__main__")
    }
    assert children <= named, (
        f"in no layer of pyproject.toml [tool.importlinter]: {sorted(children - named)}"
    )


def test_the_readme_is_at_most_300_lines():
    lines = len((ROOT / "README.md").read_text().splitlines())
    assert lines <= 300, f"README.md is {lines} lines: move detail into docs/ (at most 300)"


def test_no_function_of_the_library_or_experiments_is_over_60_lines():
    long = []
    for folder in ("fixed_embed", "callbacks", "experiments"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                    lines = node.end_lineno - node.lineno + 1
                    if lines > 60:
                        long.append(f"{path.relative_to(ROOT)}:{node.name} ({lines} lines)")
    assert not long, f"functions over 60 lines (split them into named steps): {long}"
