"""The study's summary: tables and plots from its runs file (see study.py)."""

from __future__ import annotations

from pathlib import Path


def render(data: dict, out: Path) -> None:
    raise NotImplementedError
