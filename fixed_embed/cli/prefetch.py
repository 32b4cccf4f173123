"""``fixed-embed prefetch``: download what a run on an offline compute node needs, on a login node.

The tokenizer (``HuggingFaceTB/SmolLM2-135M`` by default) into the hub cache, and the benchmark
tasks' data (the paper suite by default, i.e. every task ``eval --suite paper`` and the paper
config's in-loop benchmark use) into the Hugging Face datasets cache. Run it where there is
internet, with the same ``HF_HOME`` (or ``HF_DATASETS_CACHE``) as the compute nodes; then set
``HF_DATASETS_OFFLINE=1 HF_HUB_OFFLINE=1`` there.
"""

from __future__ import annotations

from fixed_embed.cli import CommandParser

PAPER_TOKENIZER = "HuggingFaceTB/SmolLM2-135M"


def run(argv: list[str]) -> int:
    parser = CommandParser(prog="fixed-embed prefetch", description=__doc__)
    parser.add_argument(
        "--suite",
        default="paper",
        help="the eval --suite whose task data to fetch (default: paper)",
    )
    parser.add_argument("--tasks", help="comma-separated tasks instead of a suite")
    parser.add_argument(
        "--include-path", action="append", default=[], help="folder of extra task YAMLs"
    )
    parser.add_argument(
        "--tokenizer", default=PAPER_TOKENIZER, help="tokenizer to cache ('none': skip)"
    )
    args = parser.parse_args(argv[1:])
    from lm_eval.tasks import get_task_dict

    from fixed_embed.data.tokenizer import load_tokenizer
    from fixed_embed.evaluation.suite import check_tasks, columns_for
    from fixed_embed.evaluation.tasks import check_task_folders

    named = [t for t in (args.tasks or "").split(",") if t]
    tasks = sorted({c.task for c in columns_for(None if args.tasks else args.suite, named)})
    check_task_folders(args.include_path)
    # an unknown task is refused before any download
    manager = check_tasks(tasks, args.include_path)
    # then a tokenizer that does not load, before the tasks' downloads
    if args.tokenizer.lower() != "none":
        load_tokenizer(args.tokenizer)
        print(f"cached tokenizer: {args.tokenizer}")
    get_task_dict(tasks, manager)  # built: their data downloaded into the Hugging Face cache
    for task in tasks:
        print(f"cached task data: {task}")
    return 0
