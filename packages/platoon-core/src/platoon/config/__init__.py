"""Configuration: the loading pipeline, `k=v` overrides, the site profile and the config models a plugin builds.

Names are imported on first use so `import platoon.config` stays light (pydantic and yaml only, never plugins).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from platoon._lazy import lazy_exports

_EXPORTS: dict[str, str] = {
    "load_config": "platoon.config.loader",
    "choose_kind": "platoon.config.loader",
    "LoadedConfig": "platoon.config.loader",
    "DeprecationRecord": "platoon.config.loader",
    "warn_deprecations": "platoon.config.loader",
    "apply_overrides": "platoon.config.overrides",
    "parse_override": "platoon.config.overrides",
    "split_library_argv": "platoon.config.overrides",
    "SiteProfile": "platoon.config.site",
    "load_site": "platoon.config.site",
    "describe_site": "platoon.config.site",
    "default_cache_root": "platoon.config.site",
    "deprecated_variables": "platoon.config.site",
    # what plugins build, return or resolve (a service's path options and renamed keys, a self-check's rollout, a
    # config's `module:attr` reference): exported here so they reach them through the plugin surface (platoon.surface)
    "PathOption": "platoon.config.paths",
    "EnvironmentConfig": "platoon.config.environments",
    "RolloutConfig": "platoon.config_defs",
    "DeprecatedKey": "platoon.deprecations",
    "resolve_import_string": "platoon.registry",
}

__all__ = sorted(_EXPORTS)


__getattr__, __dir__ = lazy_exports(globals(), _EXPORTS)


if TYPE_CHECKING:  # pragma: no cover
    from platoon.config.environments import EnvironmentConfig as EnvironmentConfig
    from platoon.config.loader import DeprecationRecord as DeprecationRecord
    from platoon.config.loader import LoadedConfig as LoadedConfig
    from platoon.config.loader import choose_kind as choose_kind
    from platoon.config.loader import load_config as load_config
    from platoon.config.loader import warn_deprecations as warn_deprecations
    from platoon.config.overrides import apply_overrides as apply_overrides
    from platoon.config.overrides import parse_override as parse_override
    from platoon.config.overrides import split_library_argv as split_library_argv
    from platoon.config.paths import PathOption as PathOption
    from platoon.config.site import SiteProfile as SiteProfile
    from platoon.config.site import default_cache_root as default_cache_root
    from platoon.config.site import deprecated_variables as deprecated_variables
    from platoon.config.site import describe_site as describe_site
    from platoon.config.site import load_site as load_site
    from platoon.config_defs import RolloutConfig as RolloutConfig
    from platoon.deprecations import DeprecatedKey as DeprecatedKey
    from platoon.registry import resolve_import_string as resolve_import_string
