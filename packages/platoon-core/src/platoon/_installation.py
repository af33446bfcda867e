"""Whether platoon-core's installation is whole, asked only after an import of platoon's own modules failed.

Two distributions write the `platoon/` folder: platoon-core and the earlier, unrelated `platoon` line (0.2.0-0.4.0
on the package registry). Installing one over the other leaves the other's files in platoon-core's place, and
pip's uninstall of the earlier line (which installing the `platoon` meta package does) deletes every file the two
share, platoon-core's `platoon/__init__.py` among them. The other way round, an installer asked for `platoon>=0.3`
(an extension that required `platoon` instead of `platoon-core`) replaces this project's meta package with the
registry's and writes that line's files over platoon-core's. What follows is a `ModuleNotFoundError` deep in some
import, or another project answering `platoon`; this module names the cause and the commands that repair it, with
the wheels or URL platoon-core was installed from, in one line.

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
#: where platoon-core came from, when its installation recorded no direct URL (PEP 610)
UNKNOWN_SOURCE = "<the platoon_core wheel or git URL you installed it from>"


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

    foreign: dict[str, metadata.Distribution] = {}
    core: metadata.Distribution | None = None
    core_files: list[str] = []
    for dist in metadata.distributions(path=[str(SITE_DIR)]):
        name = dist.metadata["Name"] or ""
        files = _files_in_package(dist)
        if name.lower().replace("_", "-") == CORE:
            core, core_files = dist, files
        elif files:
            foreign[name] = dist
    core_version = core.version if core is not None else ""
    if foreign:
        listed = ", ".join(f"{name} {dist.version}" for name, dist in sorted(foreign.items()))
        names = " ".join(sorted(foreign))
        pip = _installer_command(next(iter(foreign.values())))
        if core is not None and not _file_is_core_own(core, "platoon/__init__.py"):
            # The other line's files went in after platoon-core's: an installer has just replaced this project.
            return (
                f"an installer replaced this project with {listed}, an unrelated project of the same name on the "
                "package registry (something required `platoon` where it means `platoon-core`); restore platoon "
                f"{core_version}: {pip} uninstall{' -y' if pip == 'pip' else ''} {names} && "
                f"{_reinstall(core, pip, with_meta=True)}"
            )
        return (
            f"the platoon/ package folder also holds files of {listed}, an earlier, unrelated distribution that "
            f"writes the same folder: run `{pip} uninstall {names}`, then reinstall "
            f"platoon-core {core_version or '0.2'}: {_reinstall(core, pip)}"
        )
    missing = [
        path
        for path in core_files
        if path.endswith(".py") and not os.path.exists(os.path.join(SITE_DIR, path))
    ]
    if core is not None and missing:
        shown = ", ".join(sorted(missing)[:3]) + (", ..." if len(missing) > 3 else "")
        return (
            f"platoon-core {core_version} is missing {len(missing)} of its files ({shown}), deleted when a "
            f"distribution that wrote the same platoon/ folder (such as the earlier `platoon` 0.2-0.4 line) was "
            f"uninstalled: reinstall platoon-core: {_reinstall(core, _installer_command(core))}"
        )
    return None


def _file_is_core_own(core: metadata.Distribution, path: str) -> bool:
    """Whether the file at `path` is the one platoon-core's RECORD lists (its sha256), not another's over it."""
    import base64
    import csv
    import hashlib

    for row in csv.reader((core.read_text("RECORD") or "").splitlines()):
        if len(row) >= 2 and row[0] == path and row[1].startswith("sha256="):
            try:
                with open(os.path.join(SITE_DIR, path), "rb") as file:
                    digest = hashlib.sha256(file.read()).digest()
            except OSError:
                return False
            return base64.urlsafe_b64encode(digest).rstrip(b"=").decode() == row[1].removeprefix("sha256=")
    return True  # not listed with a hash: nothing to tell it by


def _installer_command(dist: metadata.Distribution) -> str:
    """`uv pip` for a distribution uv installed (its INSTALLER file says so), else `pip`."""
    return "uv pip" if (dist.read_text("INSTALLER") or "").strip() == "uv" else "pip"


def _reinstall(core: metadata.Distribution | None, pip: str, *, with_meta: bool = False) -> str:
    """The command that writes platoon-core's files again, from where it was installed (its PEP 610 record);
    with the `platoon` meta package beside it when `with_meta` and the same place has one."""
    flags = "--reinstall --no-deps" if pip == "uv pip" else "--force-reinstall --no-deps"
    sources = _install_sources(core, with_meta=with_meta) if core is not None else []
    return f"{pip} install {flags} {' '.join(sources) or UNKNOWN_SOURCE}"


def _install_sources(core: metadata.Distribution, *, with_meta: bool) -> list[str]:
    """platoon-core's wheel, folder or git requirement as its direct_url.json records it (none when it came from an
    index), followed by the meta package's from the same place when asked for and found."""
    import json
    import shlex
    from urllib.parse import unquote, urlsplit

    try:
        record = json.loads(core.read_text("direct_url.json") or "null")
    except ValueError:
        return []
    if not isinstance(record, dict) or not isinstance(record.get("url"), str):
        return []
    url: str = record["url"]
    version = core.version
    vcs = record.get("vcs_info")
    if isinstance(vcs, dict):
        revision = vcs.get("requested_revision") or vcs.get("commit_id")
        base = f"{vcs.get('vcs', 'git')}+{url}" + (f"@{revision}" if revision else "")
        subdirectory = str(record.get("subdirectory") or "packages/platoon-core")
        found = [f"platoon-core @ {base}#subdirectory={subdirectory}"]
        if with_meta and subdirectory.endswith("platoon-core"):
            found.append(f"platoon @ {base}#subdirectory={subdirectory.removesuffix('-core')}")
        return [shlex.quote(source) for source in found]
    if not url.startswith("file:"):
        return [shlex.quote(url)]
    path = unquote(urlsplit(url).path)
    found = [path]
    if with_meta:
        folder, name = os.path.split(path)
        meta = (
            os.path.join(folder, f"platoon-{version}-py3-none-any.whl")
            if name.startswith("platoon_core-") and name.endswith(".whl")
            else os.path.join(
                folder, "platoon"
            )  # a source folder: packages/platoon-core beside packages/platoon
        )
        if os.path.exists(meta):
            found.append(meta)
    return [shlex.quote(source) for source in found]
