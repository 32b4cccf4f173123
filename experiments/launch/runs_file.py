"""The runs file of a plan: its rows in ``OUT.json``, written after every run (completed runs are
skipped when the command is repeated, so a long sweep resumes), one writer at a time, and their
table in ``OUT.md`` with the git commit that produced it.
"""

from __future__ import annotations

import functools
import json
import re
import statistics
import sys
from pathlib import Path

from rich.table import Table

from experiments.launch import fit
from fixed_embed.atomic import atomic_write_text
from fixed_embed.errors import UserError
from fixed_embed.run.lock import RunLock, acquire


def _rate(row: dict) -> str:
    """Tokens per wall second; none for a resumed run, whose wall time covers its last attempt only.

    Its ``tokens_seen`` is the whole run's, and the tokens of the last attempt are not recorded,
    so neither the run's rate nor the last attempt's is known: a resumed row shows no number
    even where it carries one.
    """
    if row.get("resumed") or row.get("tokens_per_sec") is None:
        return "resumed"
    return f"{row['tokens_per_sec']:,.0f}"


def _wall(row: dict) -> str:
    return f"{row['wall_seconds'] / 60:.1f}" + (" (last attempt)" if row.get("resumed") else "")


def table(rows: list[dict], title: str) -> Table:
    result = Table(title=title)
    for column in (
        "run",
        "trainable params",
        "final val loss",
        "val ppl",
        "tokens/s (wall)",
        "wall",
    ):
        result.add_column(column, justify="left" if column == "run" else "right")
    for r in rows:
        result.add_row(
            r["name"],
            f"{r['trainable_params']:,}",
            f"{r['val_loss']:.3f}",
            f"{r['val_ppl']:.1f}",
            _rate(r),
            f"{_wall(r)} min",
        )
    return result


def read_runs(path: str | Path) -> dict:
    """A runs file (``{title, commit, runs}``), or a one-line refusal naming it: a study resumes
    from its rows, skips the runs they hold and renders its report from them, so a file it
    cannot read must stop it."""
    try:
        data = json.loads(Path(path).read_text())
        if not isinstance(data, dict) or not all(isinstance(row, dict) for row in data["runs"]):
            raise ValueError("not a {title, commit, runs: [row, ...]} object")
    except (OSError, ValueError, KeyError, TypeError) as error:
        reason = " ".join(str(error).split())[:200]
        raise SystemExit(
            f"cannot read the runs file {path} ({type(error).__name__}: {reason}): restore it "
            f"(git checkout -- {path}) or move it away to rerun its runs"
        ) from None
    return data


def rows_by_name(out: str) -> dict[str, dict]:
    """The rows of the runs file ``OUT.json`` by name ({} before it is written)."""
    path = Path(f"{out}.json")
    return {row["name"]: row for row in read_runs(path)["runs"]} if path.is_file() else {}


# held until this process exits, whatever number of run_all / write_rows calls it makes
@functools.cache
def hold(runs_file: str) -> RunLock:
    """One writer per runs file: this process, or a one-line refusal naming the live holder."""
    try:
        return acquire(Path(runs_file), "or pass another --out", beside=True)
    except UserError as error:
        raise SystemExit(str(error)) from None


def write_rows(rows: list[dict], title: str, out: str, commit: str | None = None) -> None:
    hold(f"{out}.json")
    commit = commit or fit.git_commit()
    # a reader (or the next launch, after a kill) never sees half a runs file: it resumes from it
    atomic_write_text(
        f"{out}.json", json.dumps({"title": title, "commit": commit, "runs": rows}, indent=2) + "\n"
    )
    note = "one `fixed-embed fit` per row; the JSON has each row's flags (`extra`) and commit"
    lines = [
        f"# {title}",
        "",
        f"commit `{commit}`; {note}.",
        "",
        "| run | trainable params | final val loss | val ppl | tokens/s | wall (min) |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    lines += [
        f"| {r['name']} | {r['trainable_params']:,} | {r['val_loss']:.3f} | {r['val_ppl']:.1f} "
        f"| {_rate(r)} | {_wall(r)} |"
        for r in rows
    ]
    groups = seed_groups(rows)
    if any(len(losses) > 1 for losses in groups.values()):
        lines += [
            "",
            "Over training seeds (runs named `NAME` and `NAME-seedS`): mean ± sample sd.",
            "",
            "| run | seeds | val loss mean | sd | min | max |",
            "|---|---:|---:|---:|---:|---:|",
        ]
        for name, losses in groups.items():
            sd = statistics.stdev(losses) if len(losses) > 1 else float("nan")
            lines.append(
                f"| {name} | {len(losses)} | {statistics.mean(losses):.3f} | {sd:.3f} | "
                f"{min(losses):.3f} | {max(losses):.3f} |"
            )
    Path(f"{out}.md").write_text("\n".join(lines) + "\n")


def seed_groups(rows: list[dict]) -> dict[str, list[float]]:
    """Final validation losses grouped by run name without its ``-seedS`` suffix."""
    groups: dict[str, list[float]] = {}
    for r in rows:
        groups.setdefault(re.sub(r"-seed\d+$", "", r["name"]), []).append(r["val_loss"])
    return groups


# re-render OUT.md from OUT.json: python experiments/launch/runs_file.py OUT
if __name__ == "__main__":
    data = read_runs(f"{sys.argv[1]}.json")
    write_rows(data["runs"], data["title"], sys.argv[1], commit=data["commit"])
