"""The running version of platoon, from one function so that every place that shows it agrees.

Order: a source checkout's `packages/platoon/pyproject.toml` (the `platoon` distribution), else the
installed `platoon-core` distribution, else `0+unknown`.
"""

from __future__ import annotations

import functools
import tomllib
from pathlib import Path

UNKNOWN_VERSION = "0+unknown"


def _checkout_version() -> str | None:
    # src/platoon/_version.py -> packages/platoon-core/src/platoon; the meta package sits beside platoon-core.
    packages_dir = Path(__file__).resolve().parents[3]
    pyproject = packages_dir / "platoon" / "pyproject.toml"
    if not (packages_dir.parent / "pyproject.toml").is_file() or not pyproject.is_file():
        return None
    try:
        project = tomllib.loads(pyproject.read_text(encoding="utf-8")).get("project", {})
    except (OSError, tomllib.TOMLDecodeError):
        return None
    if project.get("name") != "platoon" or not isinstance(project.get("version"), str):
        return None
    return project["version"]


@functools.cache
def running_version() -> str:
    version = _checkout_version()
    if version:
        return version
    from importlib import metadata

    try:
        return metadata.version("platoon-core")
    except metadata.PackageNotFoundError:
        return UNKNOWN_VERSION
