import os
import shlex
import subprocess
import sys
import sysconfig
from pathlib import Path
from typing import Any

import pytest
import torch

SHARED_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"

os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
# The cores shared among pytest-xdist's workers (`make test` runs 2), or all of them (at most 2)
# without it.
torch.set_num_threads(
    max(1, min(2, (os.cpu_count() or 1) // int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", 1))))
)


@pytest.fixture
def shared_data() -> Path:
    if not SHARED_DATA.is_dir():
        pytest.skip(f"shared data not found at {SHARED_DATA}")
    return SHARED_DATA


# What starts a process of its own: the inner loop (`make test-fast`, `-m "not slow"`) runs none of
# it. DataLoader workers (forked by torch within a fit) are not counted: they are part of an
# in-process fit.
_PROCESS_STARTERS = {
    Path(sys.executable).name,
    "python",
    "python3",
    "make",
    "sh",
    "bash",
    "fixed-embed",
    "torchrun",
}
_ROOT = Path(__file__).resolve().parents[1]
_STDLIB = Path(sysconfig.get_paths()["stdlib"]).resolve()


def _started_by_project_code() -> bool:
    """Whether the nearest caller outside the standard library is this project's code (a test, a
    script, the library), not a dependency."""
    frame = sys._getframe(2)
    while frame is not None:
        path = Path(frame.f_code.co_filename).resolve()
        if not path.is_relative_to(_STDLIB) and path != Path(__file__).resolve():
            return path.is_relative_to(_ROOT) and ".venv" not in path.relative_to(_ROOT).parts
        frame = frame.f_back
    return False


def _refused_program(args: Any) -> str | None:
    """The process-starting program in a command line (any word of it: ``env python``, ``sh -c
    "... make"``), or None. A dependency may still run ``python -c CODE`` or ``python -m TOOL``:
    probes of the environment (jsonargparse asks for ``sys.path``, lm-eval runs ``-mpip list``),
    not a run; a launcher re-running a script (Lightning's DDP, torchrun) is refused."""
    words = (
        shlex.split(args)
        if isinstance(args, str)
        else [str(a) for a in (args if isinstance(args, (list, tuple)) else [args])]
    )
    parts = [part for word in words for part in (word, *word.split())]
    found = next((Path(p).name for p in parts if Path(p).name in _PROCESS_STARTERS), None)
    probe = (
        len(words) > 1
        and words[1].startswith(("-c", "-m"))
        and "torch.distributed.run" not in words
    )
    if found and probe and not _started_by_project_code():
        return None
    return found


@pytest.fixture(autouse=True)
def _processes_only_in_slow_tests(request, monkeypatch):
    """A test that starts Python, make or a shell must be marked ``slow``, so the fast suite
    stays in-process.

    ``pytest.fail`` (a BaseException): an ``except Exception`` in the code under test cannot
    swallow it."""
    if request.node.get_closest_marker("slow") is not None:
        return

    def refuse(what: str) -> None:
        pytest.fail(
            f"{request.node.nodeid} starts {what}: call it in-process (tests/cli.py) or mark it "
            "slow"
        )

    class Refused(subprocess.Popen):
        def __init__(self, args, *rest, **kwargs):
            if program := _refused_program(args):
                self._child_created = False  # what Popen.__del__ reads: nothing was started
                refuse(f"a process ({program})")
            super().__init__(args, *rest, **kwargs)

    monkeypatch.setattr(subprocess, "Popen", Refused)
    import torch.multiprocessing

    def refuse_ranks(*args: Any, **kwargs: Any) -> None:
        refuse("worker processes (torch.multiprocessing)")

    monkeypatch.setattr(torch.multiprocessing, "start_processes", refuse_ranks)
    # torch.multiprocessing.spawn() calls the module's own name (the package exports a function
    # `spawn`)
    monkeypatch.setattr(sys.modules["torch.multiprocessing.spawn"], "start_processes", refuse_ranks)


# The rehearsal: six two-rank launches in a row, as long as the other multi-rank tests together.
_OWN_GROUP = {"test_rehearsal.py"}


def _start_order(item: pytest.Item) -> int:
    """0 for a group of its own, 1 for any other process-starting test, 2 for an in-process one."""
    if item.path.name in _OWN_GROUP:
        return 0
    return 1 if "slow" in item.keywords else 2


def pytest_collection_modifyitems(config, items):
    # Two ranks at once on 2 cores: under pytest-xdist (`make test`) one worker runs these one at a
    # time, so no two multi-rank tests compete for the cores, while the other runs the rehearsal's
    # launches (which wait for no other rank's time) and then the in-process tests.
    for item in items:
        if "multi_rank" in item.keywords:
            item.add_marker(pytest.mark.slow)
            own = item.path.name in _OWN_GROUP
            item.add_marker(pytest.mark.xdist_group(item.path.stem if own else "multi_rank"))
    # xdist hands out the multi-rank group first (its largest), then single tests in this order:
    # the long ones first, the short in-process ones last, so that both workers run out of work at
    # about the same time.
    items.sort(key=_start_order)
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
    words = [
        "alpha",
        "beta",
        "gamma",
        "delta",
        "epsilon",
        "zeta",
        "eta",
        "theta",
        "iota",
        "kappa",
        "lambda",
        "mu",
    ]
    texts = [" ".join(rng.choice(words) for _ in range(rng.randint(50, 300))) for _ in range(60)]
    (folder / "docs.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    tok = train_bpe(texts, 300, folder / "tok", "training-corpus")
    return folder / "docs.jsonl", tok


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory, corpus):
    """A tiny run's ``last.ckpt`` after one update, with room (``max_seq_len`` 128) for eval's
    task."""
    from tests.helpers import fit_tiny

    tmp = tmp_path_factory.mktemp("tiny")
    fit_tiny(tmp, corpus, stop_at=1, max_steps=1, decoder={"max_seq_len": 128})
    return tmp / "ckpt" / "last.ckpt"


@pytest.fixture(scope="module")
def shards(corpus, tmp_path_factory):
    """The session corpus as 4 token shards with a 10 % hold-out."""
    from fixed_embed.data.pretokenize import pretokenize
    from fixed_embed.data.sources import DocumentSource

    data, tok = corpus
    out = tmp_path_factory.mktemp("shards") / "s"
    pretokenize(DocumentSource(str(data)), str(tok), out, shards=4, holdout_per_mille=100)
    return out
