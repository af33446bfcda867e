"""Whether platoon-core's installation is whole, asked only after an import of platoon's own modules failed.

Two distributions write the `platoon/` folder: platoon-core and the earlier, unrelated `platoon` line (0.2.0-0.4.0
on the package registry). Installing one over the other leaves the other's files in platoon-core's place, and
pip's uninstall of the earlier line (which installing the `platoon` meta package does) deletes every file the two
share, platoon-core's `platoon/__init__.py` among them. What follows is a `ModuleNotFoundError` deep in some
import; this module names the cause and the commands that repair it, in one line.

`import platoon` and the command line make one cheap check (a listing of the folder that holds `platoon/`, no
importlib.metadata) for the earlier line installed beside platoon-core; the full diagnosis runs only after an import
of platoon's own modules failed. This module lives under a name the earlier line never used, so that line's
uninstall cannot take it away.
"""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from importlib import metadata

CORE = "platoon-core"
#: the folder that holds the `platoon/` package (site-packages for an installed wheel)
SITE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REINSTALL = (
    "pip install --force-reinstall --no-deps <the platoon_core wheel or git URL you installed it from>"
)


def is_own_module(module_name: str | None) -> bool:
    """True for `platoon` and its submodules: a failed import of one of them may be a damaged installation."""
    return module_name is not None and (module_name == "platoon" or module_name.startswith("platoon."))


def earlier_line_beside_core() -> str | None:
    """The version of a distribution named `platoon` whose files are in the platoon/ folder, if one is installed.

    This project's `platoon` (the meta package) installs no files there; the earlier line's does. One directory
    listing, and a RECORD read only when a `platoon-*.dist-info` is present.
    """
    try:
        entries = os.listdir(SITE_DIR)
    except OSError:
        return None
    for entry in entries:
        if entry.startswith("platoon-") and entry.endswith(".dist-info"):
            try:
                with open(os.path.join(SITE_DIR, entry, "RECORD"), encoding="utf-8") as record:
                    if any(line.startswith("platoon/") for line in record):
                        return entry[len("platoon-") : -len(".dist-info")]
            except OSError:
                continue
    return None


_reported = False


def report_earlier_line() -> bool:
    """Print, once per process, the line that says how to separate the earlier line from platoon-core.

    Returns whether that line is installed (False, printing nothing, when it is not).
    """
    global _reported
    if earlier_line_beside_core() is None:
        return False
    if not _reported:
        _reported = True
        print(f"platoon: {diagnose()}", file=sys.stderr, flush=True)
    return True


def _files_in_package(dist: metadata.Distribution) -> list[str]:
    """The `platoon/...` paths a distribution's RECORD lists, present or not (its `files` skips missing ones)."""
    import csv

    record = dist.read_text("RECORD") or ""
    paths = (row[0] for row in csv.reader(record.splitlines()) if row)
    return [path for path in paths if path.startswith("platoon/")]


def diagnose() -> str | None:
    """One line naming what damaged the installation and how to repair it, or None when it looks whole."""
    from importlib import metadata

    foreign: dict[str, str] = {}
    core_files: list[str] = []
    core_version = ""
    for dist in metadata.distributions(path=[str(SITE_DIR)]):
        name = dist.metadata["Name"] or ""
        files = _files_in_package(dist)
        if name.lower().replace("_", "-") == CORE:
            core_files, core_version = files, dist.version
        elif files:
            foreign[name] = dist.version
    if foreign:
        listed = ", ".join(f"{name} {version}" for name, version in sorted(foreign.items()))
        return (
            f"the platoon/ package folder also holds files of {listed}, an earlier, unrelated distribution that "
            f"writes the same folder: run `pip uninstall {' '.join(sorted(foreign))}`, then reinstall "
            f"platoon-core {core_version or '0.2'}: {REINSTALL}"
        )
    missing = [
        path
        for path in core_files
        if path.endswith(".py") and not os.path.exists(os.path.join(SITE_DIR, path))
    ]
    if missing:
        shown = ", ".join(sorted(missing)[:3]) + (", ..." if len(missing) > 3 else "")
        return (
            f"platoon-core {core_version} is missing {len(missing)} of its files ({shown}), deleted when a "
            f"distribution that wrote the same platoon/ folder (such as the earlier `platoon` 0.2-0.4 line) was "
            f"uninstalled: reinstall platoon-core: {REINSTALL}"
        )
    return None
