"""`make rehearsal`: the paper's run, launched, preempted and relaunched exactly as a cluster
would, on 2 CPU cores.

For each strategy (DDP, FSDP) it runs the paper's gf2 config composed with
``experiments/rehearsal/override.yaml`` (2 gloo processes, a tiny backbone, 8 updates of 8
accumulated micro-batches) three times:

1. ``reference``: uninterrupted;
2. ``preempted``: the same command under another ``--run``, sent SIGTERM once the in-loop benchmark
   of update 4 is done; it must exit 0 with a checkpoint;
3. the very same command again (a requeue): it must resume and finish.

Checks (exit status 0 only if all hold): each launch exits 0; the relaunch prints ``resuming``; the
preempted-and-resumed run's per-update losses equal the reference's; its TensorBoard folder holds
one curve (every update once, no ``version_N``); validation ran after updates 4 and 8, the
benchmark after update 4; the checkpoint folder holds exactly what the policy keeps (the
checkpoint resumed from is deleted once it rotates out), ``last`` a link.
"""

from __future__ import annotations

import argparse
import math
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from experiments.launch.executor import ROOT
from experiments.launch.fit import curves

STEPS = 8


def command(strategy: str, run: str, logs: Path) -> list[str]:
    return [
        sys.executable,
        "-m",
        "fixed_embed",
        "fit",
        "--config",
        str(ROOT / "experiments/paper/gf2.yaml"),
        "--config",
        str(ROOT / f"experiments/strategies/{strategy}.yaml"),
        "--config",
        str(ROOT / "experiments/rehearsal/override.yaml"),
        f"--trainer.logger.init_args.save_dir={logs}",
        "--run",
        run,
        "--ckpt_path",
        "last",
    ]


def launch(args: list[str], interrupt_after: str | None = None) -> tuple[int, str, float]:
    """Run ``args``; with ``interrupt_after``, send SIGTERM to the launching process once that
    text appears."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    start = time.monotonic()
    proc = subprocess.Popen(
        args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT, env=env
    )
    output = []
    for line in proc.stdout:
        output.append(line)
        if interrupt_after and interrupt_after in line:
            proc.send_signal(signal.SIGTERM)
            interrupt_after = None
    return proc.wait(timeout=600), "".join(output), time.monotonic() - start


def scalars(folder: Path) -> dict[str, list[list[float]]]:
    # a folder its launch did not write: reported by that launch's check
    return curves(folder, None) if folder.is_dir() else {}


def rehearse(strategy: str, logs: Path) -> list[tuple[str, bool, str]]:
    checks: list[tuple[str, bool, str]] = []

    def check(name: str, ok: bool, detail: str = "") -> None:
        checks.append((f"{strategy}: {name}", ok, detail))

    # the uninterrupted run, the preempted one and its relaunch: what each must print
    for name, run, stop, said in (
        ("reference run exits 0", "reference", None, ""),
        (
            "SIGTERM: exit 0 with a checkpoint",
            "preempted",
            "BenchmarkCallback at step 4",
            "PreemptionCheckpoint: SIGTERM -> saved",
        ),
        ("the same command resumes and finishes", "preempted", None, "resuming "),
    ):
        rc, out, seconds = launch(command(strategy, run, logs), stop)
        check(name, rc == 0 and said in out, f"{seconds:.0f} s" if rc == 0 else out[-2000:])

    base = logs / "paper" / "gf2"
    reference, resumed = scalars(base / "reference"), scalars(base / "preempted")
    ref_loss, loss = reference.get("train/loss", []), resumed.get("train/loss", [])
    check(
        "one TensorBoard curve: every update once",
        [s for s, _ in loss] == list(range(STEPS)),
        str(loss),
    )
    same = len(loss) == len(ref_loss) == STEPS and all(
        math.isclose(a, b, rel_tol=1e-5) for (_, a), (_, b) in zip(loss, ref_loss, strict=True)
    )
    check("per-update losses equal the uninterrupted run's", same, f"{loss} vs {ref_loss}")
    check("validation after updates 4 and 8", [s for s, _ in resumed.get("val/loss", [])] == [3, 7])
    check("in-loop benchmark after update 4", any(t.startswith("bench/") for t in resumed))
    check(
        "no version_N folders", sorted(p.name for p in base.iterdir()) == ["preempted", "reference"]
    )
    folder = base / "preempted" / "checkpoints"
    names = sorted(p.name for p in folder.iterdir() if not p.name.startswith("."))
    kept = {"last.ckpt", "step=00000004.ckpt", "step=00000006.ckpt", "step=00000008.ckpt"}
    check(
        "checkpoints: exactly the policy's, last a link",
        set(names) == kept and (folder / "last.ckpt").is_symlink(),
        str(names),
    )
    return checks


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--strategies", default="ddp,fsdp")
    parser.add_argument(
        "--logs", type=Path, default=ROOT / "logs" / "rehearsal", help="wiped first"
    )
    args = parser.parse_args(argv)
    shutil.rmtree(args.logs, ignore_errors=True)
    start = time.monotonic()
    checks = [
        c
        for strategy in args.strategies.split(",")
        for c in rehearse(strategy, args.logs / strategy)
    ]
    for name, ok, detail in checks:
        shown = detail if detail and (not ok or len(detail) < 40) else ""
        print(f"{'PASS' if ok else 'FAIL'}  {name}" + (f"  ({shown})" if shown else ""))
    failed = sum(not ok for _, ok, _ in checks)
    print(
        f"rehearsal: {len(checks) - failed} of {len(checks)} checks hold in "
        f"{time.monotonic() - start:.0f} s"
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
