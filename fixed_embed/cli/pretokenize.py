"""``fixed-embed pretokenize``: text documents -> token shards that ``fit`` reads with
``data.train: OUT/``.

Run it where the data is (a login node with the hub, or local files); copy ``OUT`` to the
machine that trains (it holds its tokenizer too). An interrupted run, started again with the same
arguments, keeps its finished shards. Format and rules: docs/data.md (token shards).
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

from fixed_embed.cli import CommandParser
from fixed_embed.config import positive


def run(argv: list[str]) -> int:
    parser = _parser()
    args = parser.parse_args(argv[1:])
    i, n = args.task, args.tasks
    if (i, n) != (None, None) and (None in (i, n) or args.overwrite or not i < n <= args.shards):
        parser.error(
            f"--task {i} --tasks {n}: give both, --task < --tasks <= --shards, and no --overwrite"
        )
    from fixed_embed.atomic import check_output
    from fixed_embed.data.corpus_check import check_corpus
    from fixed_embed.data.pretokenize import INDEX, pretokenize, summary_line
    from fixed_embed.data.sources import DocumentSource
    from fixed_embed.run.lock import acquire

    check_corpus(args.data, "--data", args.text_field)  # before any shard is written
    check_output(args.out, "--out")
    if n and (args.out / INDEX).is_file():
        print(f"pretokenize: {args.out} is already complete ({INDEX}): nothing to do")
        return 0
    tasks = (
        [f"task-{i:05d}-of-{n:05d}"] if n else [p.name[1:-5] for p in args.out.glob(".task-*.lock")]
    )
    source = DocumentSource(
        args.data, split=args.split, name=args.hub_name, text_field=args.text_field
    )
    # a scheduler's stop ends it as Ctrl-C does
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        with ExitStack() as locks, _progress_bar(not args.no_progress) as progress:
            # the index's lock (a whole run's), and every task's
            for target in ([] if n else [args.out]) + [args.out / name for name in tasks]:
                locks.enter_context(acquire(target, "or choose another --out", beside=True))
            result = pretokenize(
                source,
                args.tokenizer,
                args.out,
                shards=args.shards,
                workers=args.workers,
                holdout_per_mille=args.holdout_per_mille,
                tokenize_batch=args.tokenize_batch,
                overwrite=args.overwrite,
                progress=progress,
                task=(i, n) if n else None,
            )
    except KeyboardInterrupt as stop:
        why = stop.args[0] if stop.args else "Ctrl-C"
        raise KeyboardInterrupt(
            f"{why}; the same command continues, keeping the finished shards"
        ) from None
    finally:
        signal.signal(signal.SIGTERM, previous)
    print(summary_line(result))
    return 0


def _parser() -> CommandParser:
    parser = CommandParser(prog="fixed-embed pretokenize", description=__doc__)
    parser.add_argument(
        "--data", required=True, help="file, folder, glob (.txt/.jsonl/.parquet) or hub id"
    )
    parser.add_argument(
        "--tokenizer", required=True, help="a hub id, a tokenizer.json or a folder holding one"
    )
    parser.add_argument("--out", type=Path, required=True, help="the folder to write the shards to")
    parser.add_argument("--hub-name", help="the config name of a hub dataset")
    parser.add_argument("--split", default="train", help="the split of a hub dataset")
    parser.add_argument("--text-field", default="text")
    parser.add_argument(
        "--shards",
        type=positive("--shards"),
        default=64,
        help="output shards, whatever the --workers",
    )
    parser.add_argument(
        "--workers",
        type=positive("--workers"),
        default=1,
        help="processes writing shards in parallel",
    )
    parser.add_argument(
        "--holdout-per-mille",
        type=positive("--holdout-per-mille", zero=True),
        default=10,
        help="documents (per mille, by hash) for the held-out shards, as data.holdout_per_mille",
    )
    parser.add_argument("--tokenize-batch", type=positive("--tokenize-batch"), default=64)
    parser.add_argument(
        "--overwrite", action="store_true", help="replace token shards already in --out"
    )
    parser.add_argument(
        "--no-progress", action="store_true", help="no progress bar (the final line only)"
    )
    parser.add_argument(
        "--tasks", type=positive("--tasks"), help="N tasks at once (machines) share the shards"
    )
    parser.add_argument(
        "--task", type=positive("--task", zero=True), help="this task's share, 0..N-1; no index"
    )
    return parser


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(signal.Signals(signum).name)


@contextmanager
def _progress_bar(enabled: bool) -> Iterator[Callable[[dict[str, int]], None] | None]:
    """A rich progress bar over the source's bytes (when known) with documents, tokens and
    tokens/s."""
    if not enabled or os.environ.get("TERM") == "dumb":
        yield None
        return
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    counts = {"documents": 0, "tokens": 0}
    with Progress(
        TextColumn("pretokenize"),
        BarColumn(),
        TextColumn("{task.percentage:>3.0f}%"),
        TextColumn(
            "{task.fields[documents]:,} docs, {task.fields[tokens]:,} tokens, {task.fields[rate]}"
        ),
        TimeElapsedColumn(),
        transient=True,
    ) as progress:
        task = progress.add_task("", total=None, rate="", **counts)

        def update(change: dict[str, int]) -> None:
            if "total_bytes" in change:
                progress.update(task, total=change["total_bytes"])
                return
            for key in counts:
                counts[key] += change.get(key, 0)
            rate = f"{counts['tokens'] / (progress.tasks[0].elapsed or 1e-9):,.0f} tokens/s"
            progress.update(task, advance=change.get("text_bytes", 0), rate=rate, **counts)

        yield update
