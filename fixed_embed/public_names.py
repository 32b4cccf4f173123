"""A package's public names, imported from their modules on first use (PEP 562): configs and
checkpoints name a class by its package, whichever module defines it (a move breaks none), and
importing the package stays cheap."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any


def exports(package: str, homes: dict[str, str]) -> Callable[[str], Any]:
    """The package's ``__getattr__``: each public name -> the module (relative to ``package``)
    that defines it."""

    def __getattr__(name: str) -> Any:
        if name not in homes:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(f"{package}.{homes[name]}"), name)

    return __getattr__
