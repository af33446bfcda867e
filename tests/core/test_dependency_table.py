"""docs/architecture.md's dependency table: every package of the design has a row; those it keeps out (measured
there) are no distribution's runtime dependency, and every other one is declared by some distribution."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[2]

#: the design's dependency list, with the optional extras textual (viz) and matplotlib (plot)
DESIGN = [
    "pluggy", "tinker", "openreward", "transformers", "tokenizers", "pydantic", "typer", "httpx", "starlette",
    "uvicorn", "mcp", "docker", "hpc-sandbox", "importlib-metadata", "attrs", "textual", "matplotlib",
]  # fmt: skip
#: measured and kept out of the product (the dev group holds them for the tests and the benchmarks)
KEPT_OUT = {"mcp", "importlib-metadata", "attrs"}


def table_packages() -> set[str]:
    text = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    section = text.split("\n## Dependencies\n", 1)[1].split("\n## ", 1)[0]
    names: set[str] = set()
    for line in section.splitlines():
        if not line.startswith("| ") or line.startswith(("| Package", "| plane")):
            continue
        first = line.split("|")[1]
        first = re.sub(r"\(.*?\)", "", first)
        names.update(canonicalize_name(part.strip()) for part in first.split("/") if part.strip())
    return names


def runtime_requirements() -> set[str]:
    """Every distribution's dependencies and optional dependencies (not the dev groups)."""
    names: set[str] = set()
    for pyproject in (ROOT / "packages").glob("*/pyproject.toml"):
        project = tomllib.loads(pyproject.read_text(encoding="utf-8"))["project"]
        lines = list(project.get("dependencies", []))
        for extra in project.get("optional-dependencies", {}).values():
            lines.extend(extra)
        names.update(canonicalize_name(Requirement(line).name) for line in lines)
    return names


def test_every_design_package_has_a_row():
    assert set(DESIGN) <= table_packages(), sorted(set(DESIGN) - table_packages())


def test_kept_out_packages_stay_out_and_the_rest_are_declared():
    declared = runtime_requirements()
    assert KEPT_OUT.isdisjoint(declared), sorted(KEPT_OUT & declared)
    used = set(DESIGN) - KEPT_OUT
    assert used <= declared, sorted(used - declared)
