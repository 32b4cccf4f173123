"""Configuration: value domains, YAML read strictly, experiment files composed, the command
line's configs; each name importable from this package."""
# ruff: noqa: F401  (re-exports)

from fixed_embed.config.command_line import (
    CONFIG_FILE_FLAGS,
    config_values,
    expand_config_args,
    refused_value,
)
from fixed_embed.config.compose import (
    BASE_KEY,
    DEFAULT_RUN,
    PUBLIC_PACKAGES,
    deep_merge,
    load_experiment,
    merge_flags,
)
from fixed_embed.config.domains import (
    Beta,
    NonNegativeFinite,
    NonNegativeInt,
    PerMille,
    PositiveFinite,
    PositiveInt,
    UnitInterval,
    domain,
    positive,
)
from fixed_embed.config.strict_yaml import read_yaml, use_in_jsonargparse
