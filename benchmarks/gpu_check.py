"""`make gpu-check`: the one prepared check for the day a GPU is lent (<= 10 minutes on one
H100/H200).

Exit status 0 only if every check holds. On one GPU (``--device cuda``, the default):

1. **bench rows** (``benchmarks/gpu.py``, the training path: chunked loss, accumulation): binary16
   eager and compile+ac at micro-batch 4; each row finishes, MFU is sensible (5-80 %), and the
   measured peak (``torch.cuda.max_memory_allocated``) lies within 25 % of the estimate's
   allocated peak and below what it says the run requires;
2. **a short paper-config fit per strategy** (DDP with bf16-mixed; FSDP2 with ``fsdp.yaml``'s
   32-true + bf16 parameters), on one GPU, compile and activation checkpointing on, the paper's
   backbone on the offline corpus (no hub needed), 8 updates of 2 micro-batches: it logs sensible
   ``perf/mfu``, ``perf/tokens_per_sec``, ``perf/peak_mem_gb``; validates after updates 4 and 8;
   runs the offline in-loop benchmark after update 4; writes a checkpoint; is SIGTERM'd after that
   benchmark, exits 0 and the same command resumes to equal per-update losses; and neither
   validation nor the benchmark recompiles (``TORCH_LOGS=recompiles`` prints no "Recompiling").

It writes ``report.md`` and ``report.json`` under ``--out`` (default ``logs/gpu-check``), which
docs/benchmarks.md can quote. ``--device cpu`` runs the same checks on a tiny backbone (compile
off, fp32, no MFU), as tests/test_gpu_path.py does end to end.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from experiments.rehearsal import launch, scalars  # noqa: E402
from fixed_embed.errors import UserError  # noqa: E402
from fixed_embed.run.lock import acquire  # noqa: E402

STEPS = 8
CALLBACKS = [
    {"class_path": "callbacks.CheckpointPolicy", "init_args": {"every_n_steps": 4, "keep_last": 1}},
    {"class_path": "callbacks.FailFast"},
    {"class_path": "callbacks.UpdateProgressBar"},
    {"class_path": "callbacks.PreemptionCheckpoint"},
    {"class_path": "callbacks.GradientMonitor", "init_args": {"every_n_steps": 1}},
    {
        "class_path": "callbacks.SpeedMonitor",
        "init_args": {"every_n_steps": 2, "skip_first_steps": 2},
    },
    {
        "class_path": "callbacks.BenchmarkCallback",
        "init_args": {
            "tasks": ["fixed_embed_word_order"],
            "every_n_steps": 4,
            "limit": 20,
            "batch_size": 8,
            "at_train_end": False,
        },
    },
]


def override(device: str, data: Path | None = None) -> dict:
    """The paper config shrunk to a few minutes: intervals, data (token shards, or the offline
    corpus), one device."""
    cuda = device == "cuda"
    config = {
        "trainer": {
            "accelerator": "gpu" if cuda else "cpu",
            "devices": 1,
            "num_nodes": 1,
            "max_steps": STEPS,
            "accumulate_grad_batches": 2,
            "val_check_interval": 4,
            "log_every_n_steps": 1,
            "callbacks": CALLBACKS,
        },
        "model": {"parallel": {"compile": cuda, "activation_checkpointing": True}},
        "data": {
            "train": None,
            "hub_name": None,
            "tokenizer": None,
            "tokenizer_vocab_size": 8192,
            "seq_len": 2048 if cuda else 32,
            "batch_size": 4 if cuda else 2,
            "num_workers": 2 if cuda else 0,
            "val_sequences": 32 if cuda else 16,
        },
    }
    vocab = 8192
    # the shards carry their tokenizer (the paper's SmolLM2 one for make shards-sample)
    if data is not None:
        from fixed_embed.data.token_shards import TokenShards
        from fixed_embed.data.tokenizer import load_tokenizer

        shards = TokenShards(data)
        vocab = load_tokenizer(str(shards.tokenizer_file)).get_vocab_size()
        config["data"].update(
            train=str(data), tokenizer=None, holdout_per_mille=shards.holdout_per_mille
        )
        config["data"].pop("tokenizer_vocab_size")
    if not cuda:
        config["trainer"]["precision"] = "32-true"
        config["model"]["decoder"] = {
            "vocab_size": vocab,
            "d_model": 64,
            "n_layers": 2,
            "n_heads": 4,
            "ffn_dim": 256,
            "max_seq_len": 64,
        }
        config["model"]["parallel"]["param_dtype"] = "float32"
    elif data is not None:
        config["model"]["decoder"] = {"vocab_size": vocab}
    return config


def fit_command(strategy: str, run: str, logs: Path, extra: Path) -> list[str]:
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
        str(extra),
        f"--trainer.logger.init_args.save_dir={logs}",
        "--run",
        run,
        "--ckpt_path",
        "last",
    ]


def recompiles(text: str, folder: Path) -> int:
    logs = [text] + [p.read_text(errors="replace") for p in folder.rglob("console.log")]
    return sum(chunk.count("Recompiling function") for chunk in logs)


def record(checks: list, name: str, ok: bool, detail: str = "") -> None:
    checks.append({"check": name, "ok": bool(ok), "detail": detail})


def check_fit(strategy: str, device: str, out: Path, checks: list, report: dict) -> None:
    def check(name: str, ok: bool, detail: str = "") -> None:
        record(checks, f"fit {strategy}: {name}", ok, detail)

    logs = out / "fit" / strategy
    extra = out / f"override-{device}.yaml"
    os.environ["TORCH_LOGS"] = "recompiles"
    rc, ref_out, seconds = launch(fit_command(strategy, "reference", logs, extra))
    check("reference run exits 0", rc == 0, f"{seconds:.0f} s" if rc == 0 else ref_out[-2000:])
    rc, pre_out, seconds = launch(
        fit_command(strategy, "preempted", logs, extra), "BenchmarkCallback at step 4"
    )
    saved = rc == 0 and "PreemptionCheckpoint: SIGTERM -> saved" in pre_out
    check(
        "SIGTERM after the in-loop benchmark: exit 0 with a checkpoint",
        saved,
        f"{seconds:.0f} s" if rc == 0 else pre_out[-2000:],
    )
    rc, res_out, seconds = launch(fit_command(strategy, "preempted", logs, extra))
    check(
        "the same command resumes and finishes",
        rc == 0 and "resuming " in res_out,
        f"{seconds:.0f} s" if rc == 0 else res_out[-2000:],
    )
    base = logs / "paper" / "gf2"
    reference, resumed = scalars(base / "reference"), scalars(base / "preempted")
    ref_loss, loss = reference.get("train/loss", []), resumed.get("train/loss", [])
    tol = 1e-3 if device == "cuda" else 1e-5  # bf16 kernels are not bit-reproducible
    same = len(loss) == len(ref_loss) == STEPS and all(
        math.isclose(a, b, rel_tol=tol) for (_, a), (_, b) in zip(loss, ref_loss, strict=True)
    )
    check(
        f"resumed per-update losses equal the uninterrupted run's (rel {tol:g})",
        same,
        f"{loss} vs {ref_loss}",
    )
    check(
        "validation after updates 4 and 8", [s for s, _ in reference.get("val/loss", [])] == [3, 7]
    )
    check("in-loop benchmark after update 4", any(t.startswith("bench/") for t in reference))
    check("a checkpoint is written", (base / "reference" / "checkpoints" / "last.ckpt").exists())
    tags = ("perf/tokens_per_sec", "perf/peak_mem_gb", "perf/mfu")
    perf = {tag: [v for _, v in reference.get(tag, [])] for tag in tags}
    check(
        "perf/tokens_per_sec > 0",
        bool(perf["perf/tokens_per_sec"]) and min(perf["perf/tokens_per_sec"]) > 0,
    )
    check(
        "perf/peak_mem_gb > 0", bool(perf["perf/peak_mem_gb"]) and min(perf["perf/peak_mem_gb"]) > 0
    )
    if device == "cuda":
        mfu = perf["perf/mfu"]
        check(
            "perf/mfu between 5 % and 80 %",
            bool(mfu) and all(0.05 < v < 0.8 for v in mfu),
            str(mfu),
        )
    n = recompiles(ref_out + pre_out + res_out, logs)
    check(
        "no recompiles (validation and the benchmark run eager)", n == 0, f"{n} 'Recompiling' lines"
    )
    report["fits"][strategy] = {"losses": loss, "reference_losses": ref_loss, **perf}
    # ~20 GB each at the paper's size: two strategies' would fill a 64 GB disk
    for run in ("reference", "preempted"):
        shutil.rmtree(base / run / "checkpoints", ignore_errors=True)


def check_bench(device: str, out: Path, checks: list, report: dict) -> None:
    rows_path = out / "bench.json"
    cuda = device == "cuda"
    batch, steps, warmup = (4, 3, 2) if cuda else (1, 1, 1)
    argv = [sys.executable, str(ROOT / "benchmarks" / "gpu.py"), f"--out={rows_path}"]
    argv += [f"--batch={batch}", f"--steps={steps}", f"--warmup={warmup}", "--accumulate=2"]
    argv += ["--variants", "binary16", "--modes", "eager", "compile+ac" if cuda else "ac"]
    if not cuda:  # the tiny config; compile off (inductor's C++ build takes minutes on CPU)
        argv += ["--tiny", "--device=cpu"]
    start = time.monotonic()
    try:
        run = subprocess.run(argv, capture_output=True, text=True, cwd=ROOT, timeout=300)
    except subprocess.TimeoutExpired as late:
        run = subprocess.CompletedProcess(
            argv, 1, "", f"bench rows: over {late.timeout:.0f} s, stopped"
        )
    rows = json.loads(rows_path.read_text()) if rows_path.exists() else []
    report["bench"] = rows
    detail = f"{time.monotonic() - start:.0f} s" if run.returncode == 0 else run.stderr[-2000:]
    ok = run.returncode == 0 and len(rows) == 2
    record(checks, "bench rows: every row finishes", ok, detail)
    for r in rows:
        name = f"bench {r['variant']} {r['mode']}"
        if r["error"]:
            continue
        record(checks, f"{name}: tokens/s > 0", r["tokens_per_sec"] > 0)
        if cuda:
            record(
                checks,
                f"{name}: MFU between 5 % and 80 %",
                0.05 < (r["mfu"] or 0) < 0.8,
                f"{r['mfu']}",
            )
            ratio = r["peak_mem_gb"] / r["estimate_gb"]
            record(
                checks,
                f"{name}: measured peak within 25 % of the estimate, below 'required'",
                abs(ratio - 1) <= 0.25 and r["peak_mem_gb"] <= r["required_gb"],
                f"peak {r['peak_mem_gb']:.1f} GiB, estimate {r['estimate_gb']:.1f} GiB "
                f"({100 * (ratio - 1):+.0f} %), required {r['required_gb']:.1f} GiB",
            )


def write_report(out: Path, report: dict) -> None:
    (out / "report.json").write_text(json.dumps(report, indent=2) + "\n")
    lines = [
        f"# make gpu-check: {report['device_name']}",
        "",
        f"{report['passed']} of {len(report['checks'])} checks hold in {report['seconds']:.0f} s "
        f"({report['started']}).",
        "",
        "| check | result | detail |",
        "|---|---|---|",
    ]
    for c in report["checks"]:
        detail = c["detail"].replace("\n", " ").replace("|", "/")[:200]
        lines.append(f"| {c['check']} | {'PASS' if c['ok'] else 'FAIL'} | {detail} |")
    if report.get("bench"):
        lines += [
            "",
            "| variant | mode | tokens/s | MFU | peak GiB | estimate GiB | error |",
            "|---|---|---:|---:|---:|---:|---|",
        ]
        for r in report["bench"]:
            mfu = f"{100 * r['mfu']:.1f} %" if r.get("mfu") else "--"
            peak = f"{r['peak_mem_gb']:.1f}" if r.get("peak_mem_gb") else "--"
            est = f"{r['estimate_gb']:.2f}" if r.get("estimate_gb") else "--"
            tps = f"{r['tokens_per_sec']:,.0f}" if r.get("tokens_per_sec") else "--"
            lines.append(
                f"| {r['variant']} | {r['mode']} | {tps} | {mfu} | {peak} | {est} | "
                f"{r.get('error') or ''} |"
            )
    (out / "report.md").write_text("\n".join(lines) + "\n")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    parser.add_argument("--strategies", default="ddp,fsdp")
    parser.add_argument(
        "--out",
        default=str(ROOT / "logs" / "gpu-check"),
        help="wiped first (one check at a time per folder)",
    )
    parser.add_argument("--no-bench", action="store_true", help="skip the bench rows")
    parser.add_argument(
        "--data",
        type=Path,
        help="token shards to train on (make shards-sample); default: the offline corpus",
    )
    args = parser.parse_args()
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error(
            "no CUDA device: run this on a GPU node (or --device cpu for the CPU rehearsal of it)"
        )
    out = Path(args.out)
    # a second check into one --out would wipe the first's folder and mix both reports: refused,
    # naming it
    try:
        lock = acquire(out, "or choose another --out", beside=True)
    except UserError as error:
        parser.exit(2, f"gpu_check.py: error: {error}\n")
    with lock:
        shutil.rmtree(out, ignore_errors=True)
        out.mkdir(parents=True)
        (out / f"override-{args.device}.yaml").write_text(
            yaml.safe_dump(override(args.device, args.data), sort_keys=False)
        )
        name = torch.cuda.get_device_name() if args.device == "cuda" else "cpu"
        report = {
            "device_name": name,
            "started": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "fits": {},
        }
        checks: list[dict] = []
        start = time.monotonic()
        stages = [] if args.no_bench else [lambda: check_bench(args.device, out, checks, report)]
        stages += [
            lambda s=s: check_fit(s, args.device, out, checks, report)
            for s in args.strategies.split(",")
        ]
        # each stage's checks printed and reported as it ends: a check cut short keeps them
        for stage in stages:
            first = len(checks)
            stage()
            for c in checks[first:]:
                shown = (
                    c["detail"] if c["detail"] and (not c["ok"] or len(c["detail"]) < 60) else ""
                )
                print(
                    f"{'PASS' if c['ok'] else 'FAIL'}  {c['check']}"
                    + (f"  ({shown[:300]})" if shown else "")
                )
            sys.stdout.flush()
            report.update(
                checks=checks, passed=sum(c["ok"] for c in checks), seconds=time.monotonic() - start
            )
            write_report(out, report)
    print(
        f"gpu-check: {report['passed']} of {len(checks)} checks hold in {report['seconds']:.0f} s; "
        f"report: {out / 'report.md'}"
    )
    return 0 if report["passed"] == len(checks) else 1


if __name__ == "__main__":
    sys.exit(main())
