import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
import torch

SHARED_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"

os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
# The cores shared among pytest-xdist's workers (`make test` runs 2), or all of them (at most 2) without it.
torch.set_num_threads(max(1, min(2, (os.cpu_count() or 1) // int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", 1)))))


@pytest.fixture
def shared_data() -> Path:
    if not SHARED_DATA.is_dir():
        pytest.skip(f"shared data not found at {SHARED_DATA}")
    return SHARED_DATA


# What starts a process of its own: the inner loop (`make test-fast`, `-m "not slow"`) runs none of it.
_PROCESS_STARTERS = {Path(sys.executable).name, "python", "python3", "make", "sh", "bash", "fixed-embed", "torchrun"}
_ROOT = Path(__file__).resolve().parents[1]
_STDLIB = Path(sysconfig.get_paths()["stdlib"]).resolve()


def _started_by_project_code() -> bool:
    """Whether the nearest caller outside the standard library is this project's code (a test, a script, the
    library), not a dependency (which may run a helper process of its own to inspect the environment)."""
    frame = sys._getframe(2)
    while frame is not None:
        path = Path(frame.f_code.co_filename).resolve()
        if not path.is_relative_to(_STDLIB) and path != Path(__file__).resolve():
            return path.is_relative_to(_ROOT) and ".venv" not in path.relative_to(_ROOT).parts
        frame = frame.f_back
    return False


@pytest.fixture(autouse=True)
def _processes_only_in_slow_tests(request, monkeypatch):
    """A test that starts Python, make or a shell must be marked ``slow``, so the fast suite stays in-process."""
    if "slow" in request.keywords:
        return
    popen = subprocess.Popen

    class Refused(popen):
        def __init__(self, args, *rest, **kwargs):
            program = Path(str(args[0] if isinstance(args, (list, tuple)) else str(args).split()[0])).name
            if program in _PROCESS_STARTERS and _started_by_project_code():
                raise AssertionError(
                    f"{request.node.nodeid} starts a process ({program}): call it in-process (tests/cli.py) "
                    "or mark the test @pytest.mark.slow"
                )
            super().__init__(args, *rest, **kwargs)

    monkeypatch.setattr(subprocess, "Popen", Refused)
    import torch.multiprocessing

    def refuse(*args, **kwargs):
        raise AssertionError(f"{request.node.nodeid} starts worker processes: mark it @pytest.mark.slow")

    monkeypatch.setattr(torch.multiprocessing, "start_processes", refuse)


def pytest_collection_modifyitems(config, items):
    # Two ranks at once on 2 cores: under pytest-xdist (`make test`) one worker runs all of these, one at a
    # time, so no two multi-rank runs compete for the cores (or a timing check) while in-process tests go on.
    for item in items:
        if "multi_rank" in item.keywords:
            item.add_marker(pytest.mark.slow)
            item.add_marker(pytest.mark.xdist_group("multi_rank"))
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def corpus(tmp_path_factory):
    """A 60-document jsonl of a 12-word language and a 300-token BPE trained on it."""
    import json
    import random

    from fixed_embed.data.tokenizer import train_bpe

    folder = tmp_path_factory.mktemp("corpus")
    rng = random.Random(0)
    words = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta", "iota", "kappa", "lambda", "mu"]
    texts = [" ".join(rng.choice(words) for _ in range(rng.randint(50, 300))) for _ in range(60)]
    (folder / "docs.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    tok = train_bpe(texts, 300, folder / "tok", "training-corpus")
    return folder / "docs.jsonl", tok
