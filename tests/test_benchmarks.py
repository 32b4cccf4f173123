"""The GPU benchmark script runs end to end (on the tiny config, on CPU) and prints its table."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_gpu_benchmark_smoke_on_cpu(tmp_path):
    out = tmp_path / "rows.json"
    run = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "gpu.py"),
            "--tiny",
            "--device",
            "cpu",
            "--steps",
            "1",
            "--warmup",
            "1",
            "--batch",
            "1",
            "--accumulate",
            "2",
            "--modes",
            "eager",
            "ac",
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    rows = json.loads(out.read_text())
    assert [(r["variant"], r["mode"]) for r in rows] == [
        ("learned", "eager"),
        ("learned", "ac"),
        ("binary16", "eager"),
        ("binary16", "ac"),
    ]
    assert all(r["tokens_per_sec"] > 0 and r["mfu"] is None for r in rows)  # CPU: no MFU
    # the training path: the model's chunked loss, 2 micro-batches per update; the estimate beside
    # each row
    assert all(r["accumulate"] == 2 and r["error"] is None and r["estimate_gb"] > 0 for r in rows)
    assert rows[1]["estimate_gb"] < rows[0]["estimate_gb"]  # activation checkpointing keeps less
    assert "learned | eager |" in run.stdout  # each row printed as it finishes, before the table
    assert "Training step, tiny config" in run.stdout
