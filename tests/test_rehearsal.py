"""`make rehearsal` as a test: the paper's configs, 2 gloo processes, preempted and relaunched (DDP and FSDP)."""

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.multi_rank
def test_paper_config_rehearsal_survives_preemption_and_relaunch(tmp_path):
    result = subprocess.run(
        [sys.executable, str(ROOT / "experiments" / "rehearsal.py"), "--logs", str(tmp_path / "logs")],
        capture_output=True, text=True, cwd=ROOT, timeout=900,
    )  # fmt: skip
    report = result.stdout[-4000:]
    assert result.returncode == 0, report
    assert "FAIL" not in report and "rehearsal: 18 of 18 checks hold" in report
