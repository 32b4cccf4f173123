"""`make rehearsal` as a test: the paper's configs, 2 gloo processes, preempted and relaunched
(DDP and FSDP)."""

import pytest

from experiments import rehearsal


@pytest.mark.multi_rank
def test_paper_config_rehearsal_survives_preemption_and_relaunch(tmp_path, capsys):
    # its launches are the processes; it need not be
    code = rehearsal.main(["--logs", str(tmp_path / "logs")])
    report = capsys.readouterr().out[-4000:]
    assert code == 0, report
    assert "FAIL" not in report and "rehearsal: 18 of 18 checks hold" in report
