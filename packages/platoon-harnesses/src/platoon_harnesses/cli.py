"""`platoon toolchain build | list | verify`: build TOML specs' toolchains once per
site, list what a root holds, and check that nothing changed a toolchain since it was built (its tree hash).

Exit codes: 0 ok; 1 a build failed, a toolchain is stale without `--force`, or `verify` found a difference; 64 no
spec named; 78 a spec that does not load or gives nothing to build, or a site-profile conflict.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Any

import typer

from platoon.console import err, new_app, out, table
from platoon.errors import EX_CONFIG, EX_FAILURE, EX_USAGE

app = new_app("Build, list and verify the toolchains of sandboxed harnesses.")

RootOption = Annotated[
    str | None,
    typer.Option(
        "--root",
        metavar="DIR",
        help="The toolchain root (default: toolchains under the site profile's cache, ~/.cache/platoon/toolchains).",
        show_default=False,
    ),
]


def _root(explicit: str | None) -> Path:
    """The root; without `--root`, the deprecated variable's conflicts are refused (78) and its use printed."""
    from types import SimpleNamespace

    from platoon.config import deprecated_variables, load_site
    from platoon.deprecations import deprecation_lines
    from platoon_harnesses.toolchains import toolchain_root

    if explicit is None:
        site = load_site()
        for line in deprecation_lines(SimpleNamespace(deprecations=deprecated_variables(site))):
            err(line)
    return toolchain_root(explicit)


@app.command()
def build(
    specs: Annotated[
        list[str] | None,
        typer.Argument(
            metavar="SPEC...", help="Harness specs: name[@version] or a .toml path.", show_default=False
        ),
    ] = None,
    root: RootOption = None,
    force: Annotated[
        bool, typer.Option("--force", help="Replace a toolchain built from another recipe.")
    ] = False,
    uv: Annotated[
        str | None, typer.Option("--uv", metavar="PATH", help="The uv to build with (default: uv on PATH).")
    ] = None,
) -> int:
    """Build each spec's toolchain from its [install.recipe] at ROOT/NAME (a no-op when it is current)."""
    from platoon import get_harness
    from platoon.errors import ConfigError
    from platoon.harness.spec import HarnessSpec
    from platoon_harnesses import toolchains

    if not specs:
        err("toolchain build: name at least one spec (name[@version] or a .toml path)")
        return EX_USAGE
    base = _root(root)
    resolved: list[HarnessSpec] = []
    for ref in specs:  # every spec is checked before anything is built
        try:
            harness: Any = get_harness(ref)
        except ConfigError as exc:
            err(str(exc))
            return EX_CONFIG
        if not isinstance(harness, HarnessSpec):
            err(f"{ref}: a function harness, not a TOML spec: it has no toolchain to build")
            return EX_CONFIG
        try:
            toolchains.toolchain_path(harness, base)
            toolchains.recipe_sha256(toolchains.recipe_of(harness))
        except toolchains.NoRecipe as exc:
            err(f"{ref}: {exc}")
            return EX_CONFIG
        resolved.append(harness)
    failed = False
    for harness in resolved:
        try:
            built = toolchains.build(harness, base, force=force, uv=uv, say=err)
        except toolchains.ToolchainError as exc:
            err(f"{harness.ref}: {exc}")
            failed = True
            continue
        out(f"{harness.ref}: {built.path} ({built.manifest.get('tree_hash')})")
    return EX_FAILURE if failed else 0


def _toolchain_dirs(base: Path) -> list[Path]:
    """The toolchains under a root: its directories, leaving out hidden ones (locks, builds in progress)."""
    if not base.is_dir():
        return []
    return sorted(p for p in base.iterdir() if p.is_dir() and not p.name.startswith("."))


@app.command("list")
def list_(root: RootOption = None) -> int:
    """The toolchains under the root: spec, python, packages, size, tree hash, when built."""
    from platoon_harnesses.toolchains import ToolchainError, read_manifest

    base = _root(root)
    rows: list[list[Any]] = []
    for path in _toolchain_dirs(base):
        try:
            manifest = read_manifest(path)
        except ToolchainError:
            rows.append([path.name, "unreadable", "", "", "", "", "", ""])
            continue
        if manifest is None:
            rows.append([path.name, "unfinished", "", "", "", "", "", ""])
            continue
        tree = str(manifest.get("tree_hash") or "")
        packages = manifest.get("packages")
        rows.append(
            [
                path.name,
                "ok",
                manifest.get("spec"),
                manifest.get("python"),
                len(packages) if isinstance(packages, dict) else "",
                _size(manifest.get("bytes")),
                tree[: len("sha256:") + 16],
                manifest.get("built_at"),
            ]
        )
    if not rows:
        out(f"no toolchains under {base}")
        return 0
    out(f"toolchains under {base}:")
    out(
        table(
            ["name", "state", "spec", "python", "packages", "size", "tree hash", "built"], rows, indent="  "
        )
    )
    return 0


def _size(value: Any) -> str:
    if not isinstance(value, int):
        return ""
    size = float(value)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return str(value)


@app.command()
def verify(
    names: Annotated[
        list[str] | None,
        typer.Argument(
            metavar="[NAME]...", help="Toolchains to check (default: all under the root).", show_default=False
        ),
    ] = None,
    root: RootOption = None,
) -> int:
    """Recompute each toolchain's tree hash and compare it with its manifest; exit 1 if any differs."""
    from platoon_harnesses.toolchains import ToolchainError
    from platoon_harnesses.toolchains import verify as check_tree

    base = _root(root)
    paths = [base / name if not os.path.isabs(name) else Path(name) for name in names or []]
    if not paths:
        paths = _toolchain_dirs(base)
        if not paths:
            out(f"no toolchains under {base}")
            return 0
    failed = False
    for path in paths:
        if not path.is_dir():
            err(f"{path.name}: no toolchain at {path}")
            failed = True
            continue
        try:
            problem = check_tree(path)
        except ToolchainError as exc:
            problem = str(exc)
        if problem is None:
            out(f"{path.name}: ok")
        else:
            out(
                f"{path.name}: MODIFIED: {problem}"
                if "tree hash is" in problem
                else f"{path.name}: FAILED: {problem}"
            )
            failed = True
    return EX_FAILURE if failed else 0
