"""The adoption check: study v3 copies v2's rows of the same flags instead of rerunning them
(study.py's ``adopt``), which stands only if the code v3 runs at trains them to the same
numbers. This retrains two adopted rows (S, 108 updates: one fixed code, one learned table; one
from each v2 commit) at the current code and records both rows' numbers and commits in
docs/results/study-v3-adoption.json, which the report prints (render.py). `python
experiments/report/adoption.py` (~1.5 min a run on one core).
"""

from __future__ import annotations

import json
import sys

from experiments.launch.executor import ROOT
from experiments.launch.fit import run

CHECKED = ("bpe8k-s/gf2-lr0.003-seed1", "bpe8k-s/learned-lr0.003-seed2")
RECORD = ROOT / "docs" / "results" / "study-v3-adoption.json"
RUNS = ROOT / "docs" / "results" / "study-v3-runs.json"
# what a rerun must reproduce: every logged curve but throughput (wall-clock), the final scores
COMPARED_CURVES = ("train/loss", "val/loss", "val/bits_per_byte", "input/norm_mean")


def numbers(row: dict) -> dict:
    """The row's numbers a rerun must reproduce: curves, validation and the scores' values."""
    return {
        "val_bpb": row["val_bpb"],
        "val_loss": row["val_loss"],
        "curves": {tag: row["curves"][tag] for tag in COMPARED_CURVES if tag in row["curves"]},
        "scores": {key: score["value"] for key, score in row.get("scores", {}).items()},
    }


def compare(adopted: dict, retrained: dict) -> dict:
    """The two rows' numbers side by side; ``equal`` only where every number both hold is
    exactly the same (the retrained row's extra scores, which v2's suite did not log, are listed
    apart)."""
    old, new = numbers(adopted), numbers(retrained)
    shared = sorted(set(old["scores"]) & set(new["scores"]))
    curves = sorted(set(old["curves"]) & set(new["curves"]))
    equal = (
        old["val_bpb"] == new["val_bpb"]
        and old["val_loss"] == new["val_loss"]
        and all(old["curves"][t] == new["curves"][t] for t in curves)
        and all(old["scores"][k] == new["scores"][k] for k in shared)
    )
    return {
        "name": adopted["name"],
        "adopted": {
            "commit": adopted["commit"],
            "val_bpb": old["val_bpb"],
            "scores": _pick(old, shared),
        },
        "retrained": {
            "commit": retrained["commit"],
            "code_changed": retrained["code_changed"],
            "val_bpb": new["val_bpb"],
            "scores": _pick(new, shared),
        },
        "compared": {"curves": curves, "scores": shared},
        "equal": equal,
    }


def _pick(numbers_: dict, keys: list[str]) -> dict:
    return {k: numbers_["scores"][k] for k in keys}


def check_lines(record: dict, source: str) -> list[str]:
    """The report's account of the check (render.py), from ``record`` (the file
    ``source``)."""
    checks = record["checks"]
    lines = [
        f"Adopted rows stand for reruns only if this study's code trains them to the same numbers: "
        f"{len(checks)} were retrained at it (`experiments/study_adoption.py`, "
        f"[`{source}`]({source})), every "
        "curve but throughput, the validation bits/byte and the scores both rows hold compared "
        "exactly:",
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
            f"{compared} | "
            f"{'yes' if c['equal'] else 'no'} |"
        )
    differ = sum(not c["equal"] for c in checks)
    verdict = (
        f"{differ} of {len(checks)} differ: an adopted row is not a rerun of this code"
        if differ
        else ""
    )
    verdict = verdict or "every compared number identical, bit for bit"
    return [*lines, "", f"Result: {verdict}."]


def main() -> None:
    rows = {row["name"]: row for row in json.loads(RUNS.read_text())["runs"]}
    checks = []
    for name in CHECKED:
        adopted = rows[name]
        if not adopted.get("adopted_from"):
            sys.exit(f"study_adoption: {name} is not an adopted row")
        configs = [ROOT / c for c in adopted["config"].split(" + ")]
        retrained = run(
            name, configs, "logs/study-v3-adoption", adopted["extra"], threads=1, evaluate="study"
        )
        checks.append(compare(adopted, retrained))
    RECORD.write_text(json.dumps({"checks": checks}, indent=2) + "\n")
    print("\n".join(check_lines({"checks": checks}, RECORD.name)))


if __name__ == "__main__":
    main()
