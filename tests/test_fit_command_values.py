"""fit's values through the command, end to end: a bad value is one line and exit 2 before any
work (no run folder), a validation interval beyond the run is said, and a class path that does
not import is named in one line."""

import pytest

from tests.cli import run_cli


class _Fit(Exception):
    pass


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["--model.optimizer.lr", "0"], "model.optimizer.lr: must be a finite number > 0, got 0"),
        (
            ["--model.optimizer.lr", ".nan"],
            "model.optimizer.lr: must be a finite number > 0, got '.nan'",
        ),
        (
            ["--model.decoder.n_heads", "7"],
            "model.decoder.d_model (64) must be divisible by n_heads (7)",
        ),
        (
            ["--trainer.accumulate_grad_batches", "0"],
            "trainer.accumulate_grad_batches must be a finite number > 0",
        ),
        (["--trainer.strategy", "nope"], "trainer.strategy 'nope' is not a Lightning strategy"),
        (
            ["--trainer.max_steps", "0"],
            "trainer.max_steps must be a finite number > 0 (or -1: no limit), got 0",
        ),
    ],
)
def test_the_command_prints_one_line_and_exits_2_before_any_work(argv, said, tmp_path, corpus):
    from tests.test_lifecycle import fit_args

    args = fit_args(
        tmp_path, corpus, "gf2", "--trainer.max_steps", "1", "--model.decoder.d_model", "64", *argv
    )
    result = run_cli(*args)
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr[-2000:]
    errors = [line for line in result.stderr.splitlines() if "error:" in line]
    assert len(errors) == 1 and said in errors[0], result.stderr[-2000:]
    assert not (tmp_path / "logs").exists()  # before any work: no run folder


def test_val_check_interval_beyond_the_run_says_no_validation_will_run(
    tmp_path, corpus, monkeypatch
):
    from fixed_embed.cli import train
    from tests.test_lifecycle import fit_args

    # stop before any data
    monkeypatch.setattr(train, "_preflight", lambda config: (_ for _ in ()).throw(_Fit()))
    said, locks = [], []
    monkeypatch.setattr(train, "rank_zero_warn", said.append)
    try:
        with pytest.raises(_Fit):
            train.FixedEmbedCLI(
                args=fit_args(
                    tmp_path,
                    corpus,
                    "gf2",
                    "--trainer.max_steps",
                    "5",
                    "--trainer.val_check_interval",
                    "10",
                ),
                locks=locks,
            )
    finally:
        for lock in locks:
            lock.release()
    assert said == ["trainer.val_check_interval 10 > the run's 5 updates: no validation runs"]


def test_a_class_path_that_does_not_import_is_named_in_one_line(tmp_path, corpus):
    """A saved config naming a renamed or removed class (a callback of an older version, say)."""
    from tests.test_lifecycle import fit_args

    old = tmp_path / "old.yaml"
    old.write_text(
        "trainer:\n  callbacks:\n    - class_path: callbacks.throughput.ThroughputMonitor\n"
    )
    result = run_cli(*fit_args(tmp_path, corpus, "gf2", "--config", str(old)))
    errors = [line for line in result.stderr.splitlines() if "error:" in line]
    assert result.returncode == 2 and len(errors) == 1, result.stderr[-2000:]
    assert (
        "trainer.callbacks: Problem with given class_path "
        "'callbacks.throughput.ThroughputMonitor': module "
        "'callbacks.throughput' has no attribute 'ThroughputMonitor'" in errors[0]
    )
