"""Benchmark task data: checked loadable at fit start (an offline node would fail hours in),
fetched by ``prefetch``."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from fixed_embed.errors import DataError, in_one_line

IN_LOOP = (
    "the in-loop benchmark would fail at its first evaluation; point the tasks at local files (a "
    "task YAML with "
    "dataset_path: json and dataset_kwargs.data_files in BenchmarkCallback include_path) or set "
    "its enabled: false"
)


def check_task_data(tasks: Iterable[str], manager: Any, instead: str = IN_LOOP) -> None:
    """Load every task's data through lm-eval; a :class:`DataError` naming those that failed and
    the ways out."""
    from lm_eval.tasks import get_task_dict

    failed = {}
    for task in sorted(set(tasks)):
        try:
            get_task_dict([task], manager)
        except (
            Exception
        ) as error:  # datasets raises many kinds (ConnectionError, FileNotFoundError, ...)
            failed[task] = in_one_line(error)
    if failed:
        detail = "; ".join(f"{task}: {why}" for task, why in failed.items())
        raise DataError(
            f"benchmark task data cannot be loaded here ({detail}): {instead}, or run `fixed-embed "
            "prefetch --tasks "
            f"{','.join(failed)}` on a machine with internet access that shares this one's Hugging "
            "Face cache "
            "(HF_HOME / HF_DATASETS_CACHE)"
        )
