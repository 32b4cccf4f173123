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

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from experiments.launch.executor import LIVE, add_arguments, executor_for  # noqa: E402
from experiments.launch.fit import finished  # noqa: E402
from fixed_embed.atomic import atomic_write_text  # noqa: E402
from fixed_embed.config import positive  # noqa: E402
from fixed_embed.errors import UserError  # noqa: E402
from fixed_embed.run.folder import benchmark_folder, step_checkpoints, step_of  # noqa: E402

SCORED = "scored.json"  # in the benchmark folder, last: the TensorBoard scalars are written too


class ScoreJob:
    """One checkpoint's job: ``fixed-embed eval``, then its scores into the run's TensorBoard."""

    def __call__(
        self, name: str, command: list[str], run: str, step: int, threads: int | None = None
    ) -> str:
        from torch.utils.tensorboard import SummaryWriter

        if code := subprocess.run(command, cwd=ROOT, stdout=subprocess.DEVNULL).returncode:
            raise RuntimeError(f"fixed-embed eval exited with status {code} (its error above)")
        folder = benchmark_folder(Path(run), step)
        scores = json.loads((folder / "results.json").read_text())["scores"]
        metrics = {
            "bench/{}/{}".format(*key.split("|")[:2]): score["value"]
            for key, score in scores.items()
        }
        with SummaryWriter(log_dir=run, filename_suffix=f".bench-{step:08d}") as writer:
            for tag, value in metrics.items():
                writer.add_scalar(
                    tag, value, step - 1
                )  # the index of the last update, as the in-loop benchmark
        (folder / SCORED).write_text(json.dumps(metrics) + "\n")
        return name


def callback_settings(run: Path, name: str) -> dict:
    """The init_args of the run's callback ``name`` (from the config.yaml it saved), or {}."""
    config = yaml.safe_load((run / "config.yaml").read_text()) or {}
    for callback in (config.get("trainer") or {}).get("callbacks") or []:
        if isinstance(callback, dict) and str(callback.get("class_path", "")).endswith(f".{name}"):
            return callback.get("init_args") or {}
    return {}


def eval_command(
    checkpoint: Path, out: Path, args: argparse.Namespace, settings: dict
) -> list[str]:
    command = [
        sys.executable,
        "-m",
        "fixed_embed",
        "eval",
        str(checkpoint),
        "--output",
        str(out),
        "--overwrite",
        "--batch-size",
        str(args.batch_size),
    ]
    if args.suite:
        command += ["--suite", args.suite]
    else:
        command += [
            "--tasks",
            args.tasks or ",".join(settings.get("tasks") or ["fixed_embed_word_order"]),
        ]
        limit = args.limit if args.limit is not None else settings.get("limit", 100)
        command += ["--limit", str(limit)] if limit is not None else []
        command += [
            arg
            for path in settings.get("include_path") or []
            for arg in ("--include-path", str(path))
        ]
    return command + (["--device", args.device] if args.device else [])


def permanent(run: Path, every: bool) -> list[Path]:
    """The checkpoints to score: every step checkpoint, or those at multiples of keep_every."""
    keep, found = (
        callback_settings(run, "CheckpointPolicy").get("keep_every"),
        step_checkpoints(run / "checkpoints"),
    )
    return found if every or not keep else [p for p in found if step_of(p) % keep == 0]


def main() -> int:
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
    args = parser.parse_args()
    if not (args.run / "config.yaml").is_file():
        parser.error(f"{args.run} is not a run folder (no config.yaml): give logs/<name>/<run>")
    executor, settings = (
        executor_for(args, args.run / "eval-jobs"),
        callback_settings(args.run, "BenchmarkCallback"),
    )
    records_file = (
        args.run / "eval-jobs" / "jobs.json"
    )  # a relaunch attaches to the jobs still queued or running
    records = json.loads(records_file.read_text()) if records_file.is_file() else {}
    active = {
        int(step): job
        for step, record in records.items()
        if (job := executor.attach(record)) is not None
    }
    failed: dict[int, str] = {}
    while True:
        last = step_checkpoints(args.run / "checkpoints")[-1:] if _finished(args.run) else []
        for checkpoint in dict.fromkeys(
            [*permanent(args.run, args.all), *last]
        ):  # and the run's last update
            step, name = step_of(checkpoint), f"{args.run.name}@{step_of(checkpoint)}"
            if (
                step in active
                or step in failed
                or (benchmark_folder(args.run, step) / SCORED).is_file()
            ):
                continue
            if args.status:
                print(f"{checkpoint}: not scored")
                continue
            out = benchmark_folder(args.run, step)
            active[step] = executor.submit(
                ScoreJob(), name, eval_command(checkpoint, out, args, settings), str(args.run), step
            )
            print(f"scoring {checkpoint} ({executor.name}): {out}", flush=True)
            records[str(step)] = executor.record(active[step])
            records_file.parent.mkdir(parents=True, exist_ok=True)
            atomic_write_text(records_file, json.dumps(records, indent=1) + "\n")
        for step, handle in list(active.items()):
            scored = (benchmark_folder(args.run, step) / SCORED).is_file()
            if scored or executor.state(handle) not in LIVE:
                del active[step]
                if not scored:  # reported once, not submitted again by this launch
                    failed[step] = f"update {step}: {executor.failure(handle)}"
                    print(f"scoring update {step} failed: {failed[step]}", flush=True)
        if args.status or not (active or (args.watch and not _finished(args.run))):
            break
        time.sleep(args.every_s if not active else min(args.every_s, 5.0))
    executor.shutdown()
    if failed:
        sys.exit(
            "evaluate: " + "; ".join(failed.values()) + " (the same command scores them again)"
        )
    return 0


def _finished(run: Path) -> bool:
    try:
        return finished(run)
    except (OSError, ValueError, KeyError, UserError):  # no last.ckpt yet
        return False


if __name__ == "__main__":
    sys.exit(main())
