"""The stable import path of named environments (`platoon.envs.named.EnvironmentEntry`, as 0.2.0 named it).

They live in `platoon.config.named`: a named environment is a partial `environments` entry that the config loader
expands, so it belongs with the loading of configs.
"""

from platoon.config.named import (
    FORBIDDEN_KEYS,
    REGISTRY,
    EnvironmentEntry,
    clear_registry,
    environment_record,
    get_environment,
)

__all__ = [
    "FORBIDDEN_KEYS",
    "REGISTRY",
    "EnvironmentEntry",
    "clear_registry",
    "environment_record",
    "get_environment",
]
