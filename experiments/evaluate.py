"""Score a run's checkpoints in jobs of their own (``--executor local|slurm``), not on its
training ranks.

Each permanent checkpoint (a multiple of its CheckpointPolicy's ``keep_every``; every
``step=N.ckpt`` with ``--all``) gets one job: ``fixed-embed eval`` on one device into the folder
the in-loop benchmark writes (``RUN/benchmarks/step_N``, which ``fixed-embed table`` reads),
then its scores as ``bench/<task>/<metric>`` in the run's TensorBoard at that update.
``--watch`` goes on while the run trains (its BenchmarkCallback off:
``--trainer.callbacks.<i>.init_args.enabled=false``, or ``every_n_steps: 0``), until its last
update is scored. The tasks default to the run's BenchmarkCallback's. Started again, it skips
what is scored (docs/cluster.md).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from experiments.launch import fit
from experiments.launch.executor import ROOT, add_arguments, executor_for
from experiments.launch.record import run_record
from fixed_embed.config import positive
from fixed_embed.errors import UserError
from fixed_embed.run.folder import benchmark_folder, step_checkpoints, step_of

SCORED = "scored.json"  # in the benchmark folder, last: the TensorBoard scalars are written too


def score_job(name: str, command: list[str], run: str, step: int) -> str:
    """One checkpoint's job: ``fixed-embed eval``, then its scores into the run's TensorBoard."""
    from torch.utils.tensorboard import SummaryWriter

    if code := subprocess.run(command, cwd=ROOT, stdout=subprocess.DEVNULL).returncode:
        raise RuntimeError(f"fixed-embed eval exited with status {code} (its error above)")
    folder = benchmark_folder(Path(run), step)
    scores = json.loads((folder / "results.json").read_text())["scores"]
    metrics = {
        "bench/{}/{}".format(*key.split("|")[:2]): score["value"] for key, score in scores.items()
    }
    with SummaryWriter(log_dir=run, filename_suffix=f".bench-{step:08d}") as writer:
        for tag, value in metrics.items():  # at the index of the last update, as in the loop
            writer.add_scalar(tag, value, step - 1)
    (folder / SCORED).write_text(json.dumps(metrics) + "\n")
    return name


def eval_command(checkpoint: Path, out: Path, args: argparse.Namespace, bench: Any) -> list[str]:
    """``bench``: the run's BenchmarkCallback, whose tasks the flags not given default to."""
    options = ["--batch-size", str(args.batch_size)]
    if args.suite:
        options += ["--suite", args.suite]
    else:
        limit = args.limit if args.limit is not None else bench.limit
        options += ["--tasks", args.tasks or ",".join(bench.tasks)]
        options += ["--limit", str(limit)] if limit is not None else []
        options += [arg for path in bench.include_path for arg in ("--include-path", str(path))]
    options += ["--device", args.device] if args.device else []
    return fit.eval_command(checkpoint, out, *options)


def permanent(run: Path, keep: int | None, every: bool) -> list[Path]:
    """The checkpoints to score: every step checkpoint, or those at multiples of ``keep``."""
    found = step_checkpoints(run / "checkpoints")
    return found if every or not keep else [p for p in found if step_of(p) % keep == 0]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("run", type=Path, help="the run folder (logs/<name>/<run>)")
    parser.add_argument(
        "--all", action="store_true", help="every step checkpoint, not only the permanent ones"
    )
    parser.add_argument(
        "--watch", action="store_true", help="go on while the run trains, until it has finished"
    )
    parser.add_argument(
        "--every-s",
        type=positive("--every-s", float),
        default=300.0,
        help="--watch: look for new checkpoints this often",
    )
    parser.add_argument(
        "--suite", help="a suite of fixed-embed eval instead of the run's benchmark tasks"
    )
    parser.add_argument(
        "--tasks", help="comma-separated lm-eval tasks (default: the run's BenchmarkCallback's)"
    )
    parser.add_argument(
        "--limit",
        type=positive("--limit", float),
        help="examples per task (default: the run's BenchmarkCallback's)",
    )
    parser.add_argument("--batch-size", type=positive("--batch-size"), default=16)
    parser.add_argument("--device", help="cuda, cpu (default: cuda if available)")
    add_arguments(parser)
    return parser


def main() -> int:
    parser = _parser()
    args = parser.parse_args()
    if not (args.run / "config.yaml").is_file():
        parser.error(f"{args.run} is not a run folder (no config.yaml): give logs/<name>/<run>")
    if failed := score(args):
        sys.exit(
            "evaluate: " + "; ".join(failed.values()) + " (the same command scores them again)"
        )
    return 0


def score(args: argparse.Namespace) -> dict[int, str]:
    """A job for each checkpoint not scored yet, until none is left (``--watch``: until the run
    has finished); the updates that failed, with why."""
    from callbacks import BenchmarkCallback, CheckpointPolicy

    run = run_record(args.run)
    keep = run.callback(CheckpointPolicy).get("keep_every")
    bench = BenchmarkCallback(**run.callback(BenchmarkCallback))
    jobs = executor_for(args, args.run / "eval-jobs", args.run / "eval-jobs" / "jobs.json")
    failed = {}
    for step in jobs.records:  # a relaunch attaches to the jobs still queued or running
        jobs.attach(int(step))
    while True:
        last = step_checkpoints(args.run / "checkpoints")[-1:] if _finished(args.run) else []
        # the permanent checkpoints, and the run's last update
        for checkpoint in dict.fromkeys([*permanent(args.run, keep, args.all), *last]):
            step = step_of(checkpoint)
            if step in jobs.active or step in failed or _scored(args.run, step):
                continue
            if args.status:
                print(f"{checkpoint}: not scored")
                continue
            out, name = benchmark_folder(args.run, step), f"{args.run.name}@{step}"
            command = eval_command(checkpoint, out, args, bench)
            jobs.submit(step, score_job, name, command, str(args.run), step)
            print(f"scoring {checkpoint} ({jobs.name}): {out}", flush=True)
        for step, _, failure in jobs.ended(lambda step: _scored(args.run, step)):
            if failure is not None:  # reported once, not submitted again by this launch
                failed[step] = f"update {step}: {failure}"
                print(f"scoring update {step} failed: {failed[step]}", flush=True)
        if args.status or not (jobs.active or (args.watch and not _finished(args.run))):
            break
        if jobs.active:
            jobs.wait()
        else:
            time.sleep(args.every_s)
    jobs.shutdown()
    return failed


def _scored(run: Path, step: int) -> bool:
    return (benchmark_folder(run, step) / SCORED).is_file()


def _finished(run: Path) -> bool:
    try:
        return fit.finished(run)
    except (OSError, ValueError, KeyError, UserError):  # no last.ckpt yet
        return False


if __name__ == "__main__":
    sys.exit(main())
