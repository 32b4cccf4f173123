"""``fixed-embed eval CKPT | --hf MODEL``: a benchmark suite with lm-eval, results JSON +
paper-format table."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import lm_eval.api.registry
from rich.console import Console
from rich.markdown import Markdown

from fixed_embed.atomic import check_output
from fixed_embed.cli import CommandParser
from fixed_embed.config import positive
from fixed_embed.evaluation.suite import (
    SUITES,
    check_results_folder,
    check_tasks,
    columns_for,
    default_eval_dir,
    markdown_table,
    run_label,
    run_suite,
    write_results,
)
from fixed_embed.evaluation.task_data import check_task_data
from fixed_embed.evaluation.tasks import check_task_folders
from fixed_embed.run.lock import acquire


def run(argv: list[str]) -> int:
    parser = _parser()
    args = parser.parse_args(argv[1:])
    if (args.checkpoint is None) == (args.hf is None):
        parser.error("give a checkpoint or --hf MODEL (one of them)")
    tasks = [t for t in (args.tasks or "").split(",") if t]
    suite = args.suite or (None if tasks else "paper")
    limit = None if args.limit is None else (int(args.limit) if args.limit >= 1 else args.limit)
    columns = columns_for(suite, tasks, args.num_fewshot)
    check_task_folders(args.include_path)
    # a misspelt task, or one whose data is not here (offline): refused now
    names = {c.task for c in columns}
    check_task_data(
        names,
        check_tasks(names, args.include_path),
        "score the offline suite instead (--suite offline)",
    )
    if args.checkpoint:  # resolved once: the folder's name and the scores come from the same file
        args.checkpoint = str(Path(args.checkpoint).expanduser().resolve())
    out = Path(
        args.output
        or default_eval_dir(
            args.hf or args.checkpoint, suite, tasks, args.num_fewshot, limit, hub=bool(args.hf)
        )
    )
    check_output(out, "--output")
    # one evaluation per folder at a time
    with acquire(out, "or choose another --output", beside=True):
        check_results_folder(out, args.overwrite)  # before hours of evaluation, not after
        lm, name = _model(args)
        results = run_suite(lm, columns, limit=limit, include_path=args.include_path)
        if args.checkpoint:  # what was scored: the file a last.ckpt link resolved to, its update
            results = {**lm.module.provenance, **results}
        # printed first: a refused write keeps them
        Console().print(Markdown(markdown_table([{"model": name, **results}])))
        path = write_results(results, name, out)
        print(f"results: {path}\ntable:   {out / 'table.md'}")
    return 0


def _model(args: Any) -> tuple[Any, str]:
    """The lm-eval model to score, and its row name in the table."""
    if args.hf:
        hf_args = f"pretrained={args.hf},dtype=auto,trust_remote_code=False"
        # None (no --device): lm-eval's default
        lm = lm_eval.api.registry.get_model("hf").create_from_arg_string(
            hf_args, {"batch_size": args.batch_size, "device": args.device}
        )
        return lm, args.name or args.hf
    from fixed_embed.evaluation.lm_eval_model import FixedEmbedLM

    lm = FixedEmbedLM(
        args.checkpoint, args.tokenizer, batch_size=args.batch_size, device=args.device
    )
    label = run_label(lm.module.provenance["checkpoint"])
    return lm, args.name or f"{type(lm.module.interface).__name__} {label}"


def _parser() -> CommandParser:
    parser = CommandParser(prog="fixed-embed eval", description=__doc__)
    parser.add_argument("checkpoint", nargs="?", help="a LanguageModel .ckpt")
    parser.add_argument(
        "--hf", metavar="MODEL", help="score a transformers model instead (hub id or folder)"
    )
    parser.add_argument(
        "--suite", choices=sorted(SUITES), help="default: paper, unless --tasks is given"
    )
    parser.add_argument("--tasks", help="comma-separated lm-eval task names instead of a suite")
    parser.add_argument(
        "--num-fewshot",
        type=positive("--num-fewshot", zero=True),
        default=0,
        help="shots for --tasks",
    )
    parser.add_argument(
        "--limit", type=positive("--limit", float), help="examples per task, or a fraction below 1"
    )
    parser.add_argument("--batch-size", type=positive("--batch-size"), default=16)
    parser.add_argument("--device", help="cuda, cpu, ... (default: cuda if available)")
    parser.add_argument(
        "--tokenizer", help="for a checkpoint that holds none (another than its own is refused)"
    )
    parser.add_argument(
        "--include-path", action="append", default=[], help="extra lm-eval task YAMLs"
    )
    parser.add_argument(
        "--output", "--out", help="results folder (default: logs/eval/<run>-<suite>-<hash>)"
    )
    parser.add_argument(
        "--overwrite", action="store_true", help="replace an existing results.json in the folder"
    )
    parser.add_argument("--name", help="the model's row name in the table")
    return parser
