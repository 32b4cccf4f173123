"""``fixed-embed table RESULTS.json...``: merge results files into one paper-format Markdown
table, with the notes on how to read it that every ``table.md`` carries."""

from __future__ import annotations

import json
from pathlib import Path

from fixed_embed.atomic import atomic_write_text, check_output
from fixed_embed.cli import CommandParser
from fixed_embed.evaluation.suite import TABLE_NOTES, markdown_table


def run(argv: list[str]) -> int:
    parser = CommandParser(prog="fixed-embed table", description=__doc__)
    parser.add_argument("results", nargs="+", help="results.json files written by fixed-embed eval")
    parser.add_argument("--output", help="also write the table to this file")
    args = parser.parse_args(argv[1:])
    loaded = []
    for path in map(Path, args.results):
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError) as error:  # ValueError: not JSON, or not UTF-8
            parser.error(f"cannot read results file {path}: {error}")
        if not (
            isinstance(data, dict)
            and "model" in data
            and isinstance(data.get("columns"), list)
            and isinstance(data.get("scores"), dict)
        ):
            parser.error(
                f"{path} is not a fixed-embed eval results file (model, a columns list, a scores "
                "mapping)"
            )
        loaded.append(data)
    table = markdown_table(loaded) + TABLE_NOTES
    if args.output:
        check_output(args.output, "--output")
        atomic_write_text(args.output, table)
    print(table, end="")
    return 0
