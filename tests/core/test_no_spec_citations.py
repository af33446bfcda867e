"""No comment, docstring or page cites a section of a specification the repository does not ship.

platoon was built from specification files kept outside the repository; a reader cannot open a citation of them,
so a rule the code depends on is stated where it is used or on a page under docs/.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCANNED = (
    "packages",
    "tests",
    "benchmarks",
    "scripts",
    "docs",
    "examples",
    "recipes",
    ".ci",
    "README.md",
    "CONTRIBUTING.md",
)
TEXT_SUFFIXES = {".py", ".md", ".toml", ".yaml", ".yml", ".in", ".txt", ".sh", ".j2", ".cfg", ".ini", ""}
SKIPPED_DIRS = {
    "__pycache__",
    ".venv",
    "node_modules",
    ".cache",
    ".pytest_cache",
    ".mypy_cache",
    ".ruff_cache",
}

# The names are joined here so that this file's own text matches none of the patterns.
SPEC_FILES = "|".join(("core", "harness", "platform", "train", "textcraft", "tinker-api", "design"))
CITATION = re.compile(
    "|".join(
        (
            # a spec file by its bare name; `docs/textcraft.md` and a Markdown link `](textcraft.md)` are shipped pages
            rf"(?<![\w/.\[-])(?<!\]\()(?:{SPEC_FILES})\.md\b",
            r"\bspec/\w+\.md\b",
            r"\b(?:harness|core|training|platform|train|textcraft) spec [0-9]",
            r"\bspec (?:section )?[0-9]",
            r"\bsections? [0-9]",
            r"\brules? [0-9]+\.[0-9]",
            "\N{SECTION SIGN}",
        )
    )
)


def citations(text: str) -> list[str]:
    """The spec citations in `text`, as found."""
    return [match.group(0) for match in CITATION.finditer(text)]


def _files() -> Iterator[Path]:
    for name in SCANNED:
        top = ROOT / name
        if top.is_file():
            yield top
            continue
        for path in sorted(top.rglob("*")):
            if path.is_file() and path.suffix in TEXT_SUFFIXES and not SKIPPED_DIRS & set(path.parts):
                yield path


def test_no_file_cites_a_spec_section_the_repository_does_not_ship() -> None:
    found = []
    for path in _files():
        relative = path.relative_to(ROOT).as_posix()
        try:
            lines = path.read_text(encoding="utf-8").splitlines()
        except UnicodeDecodeError:
            continue
        for number, line in enumerate(lines, 1):
            if citations(line):
                found.append(f"{relative}:{number}: {line.strip()}")
    assert not found, "state the rule or point to a page under docs/ instead:\n" + "\n".join(found)


@pytest.mark.parametrize(
    "line",
    [
        '"""The docker sandbox provider (harness' + '.md 5.3): one long-lived container per sandbox."""',
        "# a tokenizer seeded into the cache counts as there (platform" + ".md 11)",
        "Harbor task directories (harness spec " + "6.1) and the task ids of a local dataset directory",
        "grading that agents cannot forge (and the anti-forgery rules of section " + "9)",
        "installs docker.io, as `spec/platform" + ".md` 3 says",
        "the site profile (rule " + "11.9)",
        "as the spec " + "\N{SECTION SIGN}3 words it",
    ],
)
def test_a_cited_spec_section_is_found(line: str) -> None:
    assert citations(line)


@pytest.mark.parametrize(
    "line",
    [
        "See [TextCraft](textcraft" + ".md) and docs/textcraft" + ".md#prompts.",
        "raise SpecError(f'{path}: no such harness spec file')",
        "the stable import paths (docs/architecture.md), and docs/training.md's steps",
        "[the tutorial](tutorials/first-environment-and-harness" + ".md)",
    ],
)
def test_a_shipped_page_or_a_harness_spec_file_is_not_a_citation(line: str) -> None:
    assert citations(line) == []
