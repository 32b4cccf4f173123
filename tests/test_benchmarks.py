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
        [sys.executable, str(ROOT / "benchmarks" / "gpu.py"), "--tiny", "--device", "cpu", "--steps", "1",
         "--warmup", "1", "--batch", "1", "--modes", "eager", "ac", "--out", str(out)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    rows = json.loads(out.read_text())
    assert [(r["variant"], r["mode"]) for r in rows] == [
        ("learned", "eager"), ("learned", "ac"), ("binary16", "eager"), ("binary16", "ac")]  # fmt: skip
    assert all(r["tokens_per_sec"] > 0 and r["mfu"] is None for r in rows)  # CPU: no MFU
    assert "Training step, tiny config" in run.stdout
