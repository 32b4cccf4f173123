"""Benchmark suites run with lm-eval, and the paper-format table; results keep lm-eval's output,
to trace any score."""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from fixed_embed.atomic import atomic_write_text, temporary_name
from fixed_embed.errors import ConfigError, OutputExistsError, writing


@dataclass(frozen=True)
class Column:
    task: str
    metric: str
    fewshot: int = 0
    label: str = ""
    percent: bool = True  # accuracies as percentages; perplexities as they are

    @property
    def key(self) -> str:
        return f"{self.task}|{self.metric}|{self.fewshot}"

    @property
    def title(self) -> str:
        return self.label or f"{self.task} {self.metric}" + (
            f" ({self.fewshot}-shot)" if self.fewshot else ""
        )


PAPER = [
    Column("hellaswag", "acc_norm", label="HellaSwag"),
    Column("arc_easy", "acc_norm", label="ARC-E"),
    Column("arc_challenge", "acc_norm", label="ARC-C"),
    Column("piqa", "acc", label="PIQA"),
    Column("winogrande", "acc", label="WinoGrande"),
    Column("openbookqa", "acc_norm", label="OBQA"),
    Column("commonsense_qa", "acc", label="CSQA"),
    Column("mmlu", "acc", 0, label="MMLU 0-shot"),
    Column("mmlu", "acc", 5, label="MMLU 5-shot"),
    Column("lambada_openai", "acc", label="LAMBADA acc"),
    Column("lambada_openai", "perplexity", label="LAMBADA ppl", percent=False),
    Column("wikitext", "word_perplexity", label="WikiText word ppl", percent=False),
]
OFFLINE = [
    Column("fixed_embed_word_order", "acc", label="word order"),
    Column("fixed_embed_docs_ppl", "word_perplexity", label="docs word ppl", percent=False),
    Column("fixed_embed_docs_ppl", "bits_per_byte", label="docs bits/byte", percent=False),
]
STUDY = [  # what `make study` can score offline on local files
    Column("gutenberg_word_order", "acc", label="books word order"),
    Column("gutenberg_ppl", "bits_per_byte", label="books bits/byte", percent=False),
    Column("wikitext2_local", "word_perplexity", label="WikiText-2 valid word ppl", percent=False),
    Column("wikitext2_local", "bits_per_byte", label="WikiText-2 valid bits/byte", percent=False),
]
SUITES: dict[str, list[Column]] = {"paper": PAPER, "offline": OFFLINE, "study": STUDY}


def columns_for(suite: str | None, tasks: Sequence[str] = (), fewshot: int = 0) -> list[Column]:
    """The suite's columns, or those of ``tasks`` (their suite metrics if known, else every
    metric)."""
    if suite is not None and tasks:
        raise ConfigError("give a suite or a task list, not both")
    if suite is not None:
        if suite not in SUITES:
            raise ConfigError(f"unknown suite {suite!r}; known: {sorted(SUITES)}")
        return list(SUITES[suite])
    if not tasks:
        raise ConfigError("no tasks: give --suite or --tasks")
    columns = []
    for task in tasks:
        matches = [
            c for cols in SUITES.values() for c in cols if c.task == task and c.fewshot == fewshot
        ]
        columns.extend(matches or [Column(task, "*", fewshot)])  # "*": every metric lm-eval reports
    return columns


def run_suite(
    lm: Any,
    columns: Sequence[Column],
    limit: int | float | None = None,
    include_path: Iterable[str | os.PathLike] = (),
) -> dict[str, Any]:
    """``{"scores": {key: {"value", "stderr"}}, "columns", "lm_eval"}`` of ``lm`` on the
    columns' (known) tasks."""
    import lm_eval

    manager = check_tasks({c.task for c in columns}, include_path)
    raw: dict[str, Any] = {}
    scores: dict[str, dict[str, float | None]] = {}
    expanded: list[Column] = []
    for shots in sorted({c.fewshot for c in columns}):
        group = [c for c in columns if c.fewshot == shots]
        tasks = sorted({c.task for c in group})
        out = lm_eval.simple_evaluate(
            model=lm,
            tasks=tasks,
            num_fewshot=shots,
            limit=limit,
            task_manager=manager,
            log_samples=False,
        )
        if out is None:  # a non-zero rank of a distributed evaluation
            continue
        raw[f"{shots}-shot"] = json.loads(json.dumps(out, default=repr))
        for column in group:
            results = out["results"].get(column.task, {})
            reported = [k.split(",")[0] for k in results if "," in k and "_stderr" not in k]
            if column.metric == "*":  # every metric lm-eval reports
                resolved = [
                    Column(column.task, m, shots, percent="perplexity" not in m) for m in reported
                ]
            elif column.metric in reported:
                resolved = [column]
            else:
                raise ValueError(f"lm-eval reported no {column.metric!r} (reported: {reported})")
            for score in resolved:
                stderr = results.get(f"{score.metric}_stderr,none")
                scores[score.key] = {
                    "value": float(results[f"{score.metric},none"]),
                    "stderr": float(stderr) if isinstance(stderr, (int, float)) else None,
                }
            expanded += resolved
    return {"columns": [asdict(c) for c in expanded], "scores": scores, "lm_eval": raw}


def check_tasks(tasks: Iterable[str], include_path: Iterable[str | os.PathLike] = ()) -> Any:
    """lm-eval's TaskManager over its built-ins, the offline tasks and ``include_path``; raises
    for unknown tasks."""
    from lm_eval.tasks import TaskManager

    from fixed_embed.evaluation.tasks import tasks_dir

    tasks, paths = set(tasks), [str(tasks_dir()), *map(str, include_path)]
    # Indexing lm-eval's ~15k built-in task files takes 8 s, on every rank: skipped when only ours
    # are asked.
    manager = TaskManager(include_path=paths[:1], include_defaults=False)
    if len(paths) > 1 or not tasks <= set(manager.all_tasks):
        manager = TaskManager(include_path=paths)
    if unknown := sorted(t for t in tasks if t not in manager.all_tasks):
        raise ConfigError(f"lm-eval knows no task {unknown} (searched its built-ins and {paths})")
    return manager


def run_label(checkpoint: str | os.PathLike) -> str:
    """``logs/tiny/gf2/default/step=00000050.ckpt`` for the absolute path of
    ``logs/tiny/gf2/default/checkpoints/step=00000050.ckpt``: the path from the working folder
    (logs/demo/tiny/gf2 is not logs/tiny/gf2); outside it, the last three folders."""
    path = Path(checkpoint)
    if path.is_relative_to(Path.cwd()):
        return "/".join(
            p for p in path.relative_to(Path.cwd()).parts if p not in ("checkpoints", "ckpt")
        )
    parents = [p for p in path.parent.parts[1:] if p not in ("checkpoints", "ckpt")][-3:]
    return "/".join([*parents, path.name])


def default_eval_dir(
    model: str | os.PathLike,
    suite: str | None,
    tasks: Sequence[str] = (),
    fewshot: int = 0,
    limit: int | float | None = None,
    hub: bool = False,
) -> Path:
    """``logs/eval/<run label>-<suite or tasks>[-limitN]-<hash>``, keyed on the file a
    ``last.ckpt`` link resolves to (or the hub id): a new folder per update; the hash keeps two
    runs with the same label apart."""
    spec = str(model)
    if hub and not Path(spec).expanduser().exists():
        label, identity = spec, spec
    else:
        identity = str(Path(spec).expanduser().resolve())
        label = run_label(identity).removesuffix(".ckpt").replace("/", "-")
    what = suite if suite is not None else "+".join(tasks) + (f"-{fewshot}shot" if fewshot else "")
    if limit is not None:
        what += f"-limit{limit:g}"
    digest = hashlib.sha256(f"{identity}|{what}".encode()).hexdigest()[:8]
    name = f"{label}-{what}"[:120]
    return Path("logs", "eval", re.sub(r"[^A-Za-z0-9._+-]+", "_", name) + f"-{digest}")


def check_results_folder(out_dir: str | os.PathLike, overwrite: bool = False) -> None:
    """Before the evaluation, not after: refuse an earlier results.json (unless ``overwrite``),
    an unwritable folder."""
    path = Path(out_dir) / "results.json"
    if path.exists() and not overwrite:
        raise OutputExistsError(
            f"{path} already exists (an earlier evaluation); pass --output DIR to write elsewhere, "
            "or --overwrite to replace it"
        )
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        with writing(path), open(temporary_name(path), "wb") as probe:
            # tried (read-only, full, ulimit -f); a results.json holds more (lm-eval's report)
            probe.write(bytes(4096))
    finally:
        temporary_name(path).unlink(missing_ok=True)


def write_results(results: dict[str, Any], model: str, out_dir: str | os.PathLike) -> Path:
    """``out_dir/results.json`` (atomically; its path is returned) and ``out_dir/table.md`` (+
    ``TABLE_NOTES``)."""
    written = {"model": model, **results}
    path = atomic_write_text(Path(out_dir) / "results.json", json.dumps(written, indent=2) + "\n")
    atomic_write_text(path.with_name("table.md"), markdown_table([written]) + TABLE_NOTES)
    return path


#: Printed under the table in ``table.md``: how to read the scores.
TABLE_NOTES = """
Notes:

- Scores are lm-eval's: accuracies in % with ± standard error; perplexities as they are.
- Fixed codes (binary16; GF(2) with offset 0) map token 0, the end-of-text token of SmolLM2 and of
  this project's BPE, to the zero vector. lm-eval conditions the first target of each document's
  first rolling window (perplexity tasks), and the first token of an empty-context request, on
  end-of-text alone: for these models the logits there are uniform, so that target is scored at
  exactly log(1/V), whatever the weights. A learned table is not held to this. See docs/design.md,
  "Token 0 is the all-zero code".
"""


def markdown_table(results: Sequence[dict[str, Any]]) -> str:
    """One row per results file, one column per (task, metric, shots) in order of first
    appearance."""
    columns: dict[str, Column] = {}
    for column in (Column(**c) for result in results for c in result["columns"]):
        columns.setdefault(column.key, column)
    header = "| model | " + " | ".join(c.title for c in columns.values()) + " |"
    rule = "|---|" + "---:|" * len(columns)
    rows = [header, rule]
    for result in results:
        cells = [_cell(result["scores"].get(key), column) for key, column in columns.items()]
        # what it scored
        update = f" @ update {result['update']}" if result.get("update") is not None else ""
        rows.append(f"| {result['model']}{update} | " + " | ".join(cells) + " |")
    return "\n".join(rows) + "\n"


def _cell(score: dict[str, float | None] | None, column: Column) -> str:
    if score is None:
        return "--"
    scale = 100.0 if column.percent else 1.0
    value = f"{score['value'] * scale:.2f}"
    if (stderr := score.get("stderr")) is not None and math.isfinite(stderr):
        value += f" ± {stderr * scale:.2f}"
    return value
