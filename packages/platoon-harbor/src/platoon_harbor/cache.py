"""Where a Harbor entry keeps what it fetches, builds and checks: its Harbor cache, shared by the service, the
dataset check and `platoon prepare`.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from platoon.config import default_cache_root, load_site

__all__ = ["harbor_cache"]


def harbor_cache(options: Mapping[str, Any], cache_root: str | os.PathLike[str] | None) -> Path:
    """The entry's Harbor cache: `cache` (deprecated), `$PLATOON_HARBOR_CACHE` (deprecated), else
    `<cache root>/harbor` (`cache_root`, else the site profile's cache root, else ~/.cache/platoon)."""
    if options.get("cache"):
        return Path(os.path.abspath(os.path.expanduser(str(options["cache"]))))
    legacy = os.environ.get("PLATOON_HARBOR_CACHE")
    if legacy:
        return Path(os.path.abspath(os.path.expanduser(legacy)))
    if cache_root is None:  # a caller without a loaded config (the service in a worker): the site profile's
        profile = load_site()
        cache_root = profile.cache_root if profile is not None else default_cache_root()
    return Path(cache_root) / "harbor"
