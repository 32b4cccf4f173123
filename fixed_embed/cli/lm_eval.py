"""``fixed-embed lm-eval ARGS``: lm-eval's own CLI with the ``fixed_embed`` model registered
(lm-eval loads no model plugins) and the offline tasks on ``--include_path``."""

import sys

import torch
from lm_eval.__main__ import cli_evaluate

import fixed_embed.evaluation.lm_eval_model  # noqa: F401  (registers the model)
from fixed_embed.evaluation.tasks import tasks_dir


def run(argv: list[str]) -> int:
    args = argv[1:]
    if "--include_path" not in args and not any(a.startswith("--include_path=") for a in args):
        args += ["--include_path", str(tasks_dir())]
    # lm-eval's default: cuda
    if not any(a.startswith("--device") for a in args) and not torch.cuda.is_available():
        args += ["--device", "cpu"]
    # lm-eval 0.4's CLI takes no argument list (HarnessCLI.parse_args reads, and edits, sys.argv).
    saved, sys.argv = sys.argv, ["lm-eval", *args]
    try:
        cli_evaluate()
    finally:
        sys.argv = saved
    return 0
