"""Offline lm-eval tasks (``include_path``: ``tasks_dir()``), data made at load by
``offline_data.py``: ``*word_order`` (a sentence's true second half vs the same words shuffled,
chance 50 %), ``*_ppl``, ``wikitext2_local`` (rolling)."""

from pathlib import Path

from fixed_embed.errors import ConfigError


def tasks_dir() -> Path:
    return Path(__file__).resolve().parent


def check_task_folders(folders: list[str]) -> None:
    """Refuse lm-eval task folders that do not exist, hold no task YAML or a YAML that does not
    parse."""
    import yaml

    for include in folders:
        folder = Path(include)
        if not folder.is_dir():
            problem = "does not exist" if not folder.exists() else "is not a folder"
            raise ConfigError(
                f"--include-path {include} {problem}: give a folder of lm-eval task YAMLs"
            )
        if not (files := sorted(folder.rglob("*.yaml"))):
            raise ConfigError(
                f"--include-path {include} holds no task YAML (*.yaml): give a folder of lm-eval "
                "task YAMLs"
            )
        for task_file in files:
            try:
                # composed, not constructed: lm-eval's tags (``!function utils.process``) are never
                # run
                yaml.compose(task_file.read_text(), Loader=yaml.SafeLoader)
            except (yaml.YAMLError, UnicodeDecodeError) as error:
                first = str(error).splitlines()[0] if str(error) else type(error).__name__
                raise ConfigError(
                    f"--include-path {include}: {task_file} is not valid YAML ({first})"
                ) from None
