"""Offline compute nodes: a task whose data cannot be loaded fails at fit start naming the way
out, and ``fixed-embed prefetch`` caches the suite and the tokenizer on a login node."""

import pytest

# -- 8. offline compute nodes: task data checked at fit start, prefetch on a login node
# ------------------------

MISSING_TASK = """task: {name}
dataset_path: json
dataset_kwargs:
  data_files:
    validation: {path}
validation_split: validation
output_type: loglikelihood
doc_to_text: "{{{{text}}}}"
doc_to_target: " end"
metric_list:
  - metric: acc
"""


def test_a_task_whose_data_cannot_be_loaded_fails_at_fit_start_with_the_way_out(tmp_path):
    from fixed_embed.errors import DataError
    from fixed_embed.evaluation.suite import check_tasks
    from fixed_embed.evaluation.task_data import check_task_data

    tasks = tmp_path / "tasks"
    tasks.mkdir()
    (tasks / "gone.yaml").write_text(
        MISSING_TASK.format(name="gone_local_task", path=tmp_path / "missing.jsonl")
    )
    # the name is known: the old check passed here
    manager = check_tasks(["gone_local_task"], [tasks])
    with pytest.raises(
        DataError, match=r"gone_local_task: .*fixed-embed prefetch --tasks gone_local_task"
    ):
        check_task_data(["gone_local_task"], manager)


def test_prefetch_caches_the_paper_suite_and_the_tokenizer(monkeypatch):
    import lm_eval.tasks

    import fixed_embed.data.tokenizer as tokenizer
    import fixed_embed.evaluation.suite as suite
    from tests.cli import run_cli

    built, loaded = [], []
    # no registry scan: seconds
    monkeypatch.setattr(suite, "check_tasks", lambda tasks, include_path=(): None)
    monkeypatch.setattr(lm_eval.tasks, "get_task_dict", lambda tasks, manager: built.extend(tasks))
    monkeypatch.setattr(tokenizer, "load_tokenizer", lambda spec: loaded.append(spec))
    result = run_cli("prefetch")
    assert result.returncode == 0, result.stderr[-2000:]
    assert {"hellaswag", "arc_easy", "piqa", "lambada_openai", "mmlu", "wikitext"} <= set(built)
    assert loaded == ["HuggingFaceTB/SmolLM2-135M"] and "cached tokenizer" in result.stdout


def test_prefetch_refuses_an_unknown_task_before_loading_the_tokenizer(monkeypatch):
    import fixed_embed.data.tokenizer as tokenizer
    from tests.cli import run_cli

    loaded = []
    # a hub download otherwise
    monkeypatch.setattr(tokenizer, "load_tokenizer", lambda spec: loaded.append(spec))
    result = run_cli("prefetch", "--tasks", "no_such_task")
    assert result.returncode == 2 and "no_such_task" in result.stderr and not loaded, result.stderr[
        -2000:
    ]
