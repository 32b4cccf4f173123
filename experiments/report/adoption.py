"""The adoption check's account: study v3 copied v2's rows of the same flags instead of rerunning
them, which stands only if the code v3 ran at trains them to the same numbers. Two adopted rows
were retrained and compared (the migration is finished: its record,
docs/results/study-v3-adoption.json, is what the report prints, render.py).
"""

from __future__ import annotations


def check_lines(record: dict, source: str) -> list[str]:
    """The report's account of the check (render.py), from ``record`` (the file
    ``source``)."""
    checks = record["checks"]
    lines = [
        "Adopted rows stand for reruns only if this study's code trains them to the same "
        f"numbers: {len(checks)} were retrained at it (`experiments/study_adoption.py`, "
        f"[`{source}`]({source})), every curve but throughput, the validation bits/byte and the "
        "scores both rows hold compared exactly:",
        "",
        "| run | adopted: commit | val bits/byte | retrained: commit | val bits/byte | compared | "
        "same |",
        "|---|---|---:|---|---:|---|---|",
    ]
    for c in checks:
        dirty = " + uncommitted edits" if c["retrained"]["code_changed"] else ""
        compared = f"{len(c['compared']['curves'])} curves, {len(c['compared']['scores'])} scores"
        lines.append(
            f"| {c['name']} | `{c['adopted']['commit'][:10]}` | {c['adopted']['val_bpb']!r} | "
            f"`{c['retrained']['commit'][:10]}`{dirty} | {c['retrained']['val_bpb']!r} | "
            f"{compared} | {'yes' if c['equal'] else 'no'} |"
        )
    differ = sum(not c["equal"] for c in checks)
    verdict = (
        f"{differ} of {len(checks)} differ: an adopted row is not a rerun of this code"
        if differ
        else "every compared number identical, bit for bit"
    )
    return [*lines, "", f"Result: {verdict}."]
