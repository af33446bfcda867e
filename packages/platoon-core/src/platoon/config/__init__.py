"""Configuration: the loading pipeline, `k=v` overrides and the site profile.

Names are imported on first use so `import platoon.config` stays light (pydantic and yaml only, never plugins).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from platoon._lazy import lazy_exports

_EXPORTS: dict[str, str] = {
    "load_config": "platoon.config.loader",
    "LoadedConfig": "platoon.config.loader",
    "DeprecationRecord": "platoon.config.loader",
    "warn_deprecations": "platoon.config.loader",
    "apply_overrides": "platoon.config.overrides",
    "parse_override": "platoon.config.overrides",
    "split_library_argv": "platoon.config.overrides",
    "SiteProfile": "platoon.config.site",
    "load_site": "platoon.config.site",
    "describe_site": "platoon.config.site",
}

__all__ = sorted(_EXPORTS)


__getattr__, __dir__ = lazy_exports(globals(), _EXPORTS)


if TYPE_CHECKING:  # pragma: no cover
    from platoon.config.loader import DeprecationRecord as DeprecationRecord
    from platoon.config.loader import LoadedConfig as LoadedConfig
    from platoon.config.loader import load_config as load_config
    from platoon.config.loader import warn_deprecations as warn_deprecations
    from platoon.config.overrides import apply_overrides as apply_overrides
    from platoon.config.overrides import parse_override as parse_override
    from platoon.config.overrides import split_library_argv as split_library_argv
    from platoon.config.site import SiteProfile as SiteProfile
    from platoon.config.site import describe_site as describe_site
    from platoon.config.site import load_site as load_site
