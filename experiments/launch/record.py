"""What a run is: the values of its resolved config, the one its fit saved in its run folder
(``config.yaml``) or, before it runs, the one its config files and flags resolve to, and what the
library counts from them (``fixed_embed.model.accounting``, ``run_length``). The runs' rows, the
study's plan and estimate, its report and ``evaluate.py`` read a run from here alone.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from pydoc import locate

import yaml

# one experiment file, or several merged in order (a variant, then deltas)
Configs = Path | Sequence[Path]


def resolve(configs: Configs, flags: Sequence[str] = ()) -> dict:
    """The config of ``fixed-embed fit --config A --config B ... FLAGS``: each file (with its
    bases) merged in order, then the flags."""
    from fixed_embed.config import deep_merge, load_experiment, merge_flags

    config, named = {}, {}
    for path in [configs] if isinstance(configs, (str, Path)) else configs:
        config = deep_merge(config, load_experiment(path, named))
    return merge_flags(config, flags)


@dataclass(frozen=True)
class RunRecord:
    config: dict  # the resolved config
    trainable: int
    non_embedding: int  # the blocks' and final norm's parameters
    flops_per_token: int  # training FLOPs per target at data.seq_len
    updates: int | None  # None: a length in epochs
    tokens: int | None  # training targets on one device: updates x accumulation x batch x seq_len

    def callback(self, kind: type) -> dict:
        """The init_args of the run's callback of class ``kind`` (or a subclass), or {}."""
        for callback in self.config["trainer"].get("callbacks") or []:
            if issubclass(locate(callback["class_path"]), kind):
                return callback.get("init_args") or {}
        return {}


def record(config: dict) -> RunRecord:
    from fixed_embed.train.experiment import run_length

    trainer, data, model = config["trainer"], config["data"], config["model"]
    counts = _counts(json.dumps([model["decoder"], model["interface"]]), data["seq_len"])
    bounded = (trainer.get("max_steps") or -1) > 0 or model.get("token_budget")
    updates = run_length(config)[0] if bounded else None
    per_update = (trainer.get("accumulate_grad_batches") or 1) * data["batch_size"]
    tokens = None if updates is None else updates * per_update * data["seq_len"]
    return RunRecord(config, *counts, updates, tokens)


def run_record(run_dir: Path) -> RunRecord:
    """The record of a run that has started, from the config its fit saved."""
    return record(yaml.safe_load((Path(run_dir) / "config.yaml").read_text()))


# a model's counts are the same for every rate and seed it trains at
@cache
def _counts(model: str, seq_len: int) -> tuple[int, int, int]:
    from fixed_embed.model.accounting import parameter_report
    from fixed_embed.train.experiment import build_model

    decoder, interface = json.loads(model)
    built = build_model({"decoder": decoder, "interface": interface}).decoder
    report = parameter_report(built)
    return report.trainable, report.backbone, built.flops_per_token(seq_len)
