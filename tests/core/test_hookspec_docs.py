"""Every hookspec documents what a plugin author needs, in the form `platoon/hookspecs.py`'s docstring sets, and
docs/extending.md lists every hook with its first-result answer."""

from __future__ import annotations

import inspect
import re
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from platoon import hookspecs

EXTENDING = Path(__file__).resolve().parents[2] / "docs" / "extending.md"

#: the attribute pluggy's HookspecMarker("platoon") sets on each hookspec: its options
SPEC_ATTRIBUTE = f"{hookspecs.hookspec.project_name}_spec"

HOOKSPECS: dict[str, Callable[..., Any]] = {
    name: value
    for name, value in vars(hookspecs).items()
    if inspect.isfunction(value) and hasattr(value, SPEC_ATTRIBUTE)
}


def missing_parts(fn: Callable[..., Any]) -> list[str]:
    """What the hookspec's docstring lacks, or says wrongly, one phrase each."""
    doc = inspect.getdoc(fn) or ""
    missing: list[str] = []
    documented = re.findall(r"^:param (\w+):", doc, re.MULTILINE)
    for parameter in inspect.signature(fn).parameters:
        if parameter not in documented:
            missing.append(f"`:param {parameter}:`")
    for stray in sorted(set(documented) - set(inspect.signature(fn).parameters)):
        missing.append(f"a parameter `{stray}` (documented, not in the signature)")
    if not re.search(r"^:returns: \S", doc, re.MULTILINE):
        missing.append("`:returns:`")
    if not re.search(r"^Called: \S", doc, re.MULTILINE):
        missing.append("a `Called:` paragraph (when and how often)")
    said = re.search(r"^First result: (yes|no)\b", doc, re.MULTILINE)
    firstresult = bool(getattr(fn, SPEC_ATTRIBUTE)["firstresult"])
    if said is None:
        missing.append("a `First result: yes|no` paragraph")
    elif (said.group(1) == "yes") != firstresult:
        missing.append(
            f"a true first-result line (it says {said.group(1)!r}; the marker's firstresult={firstresult})"
        )
    example = re.search(r"^Example::\n\n((?:(?: {4}.*)?\n)+)", doc + "\n", re.MULTILINE)
    if example is None or not example.group(1).strip():
        missing.append("an `Example::` with an indented block")
    else:
        try:
            compile(textwrap.dedent(example.group(1)), f"{fn.__name__} example", "exec")
        except SyntaxError as exc:
            missing.append(f"an example that is Python ({exc.msg}, line {exc.lineno})")
    if not re.search(r"^\.\. versionadded:: \d+\.\d+\.\d+$", doc, re.MULTILINE):
        missing.append("`.. versionadded:: X.Y.Z`")
    return missing


def hook_rows() -> dict[str, dict[str, str]]:
    """docs/extending.md's table of hooks: hook name -> its cells by column header."""
    rows: dict[str, dict[str, str]] = {}
    headers: list[str] | None = None
    for line in EXTENDING.read_text().splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if headers is None:
            if line.startswith("|") and cells[:1] == ["Hook"] and "First result" in cells:
                headers = cells
            continue
        if not line.startswith("|"):
            break  # the table ends
        name = re.match(r"`(\w+)", cells[0])
        if name is not None:
            rows[name.group(1)] = dict(zip(headers, cells, strict=False))
    return rows


def test_the_hookspecs_are_found_by_their_marker():
    # every hook core asks by table is among them, so a hookspec the marker does not find cannot go unchecked
    assert set(hookspecs.REGISTRATION_HOOKS.values()) <= set(HOOKSPECS)
    assert set(hookspecs.SEAM_HOOKS.values()) <= set(HOOKSPECS)


@pytest.mark.parametrize("name", sorted(HOOKSPECS))
def test_every_hookspec_documents_itself(name):
    missing = missing_parts(HOOKSPECS[name])
    assert not missing, f"{name}'s docstring lacks: {'; '.join(missing)}"


@pytest.mark.parametrize("name", sorted(HOOKSPECS))
def test_docs_extending_lists_every_hook(name):
    rows = hook_rows()
    assert rows, f"{EXTENDING} has no table of hooks (a header row `| Hook | ... | First result | ...`)"
    assert name in rows, f"{EXTENDING}'s table of hooks has no row for {name}"
    firstresult = bool(getattr(HOOKSPECS[name], SPEC_ATTRIBUTE)["firstresult"])
    said = rows[name]["First result"].split(":")[0].strip()
    assert said == ("yes" if firstresult else "no"), f"{EXTENDING} says {name} is first-result {said!r}"
    assert re.search(r"\d+\.\d+\.\d+", rows[name].get("Since", "")), (
        f"{EXTENDING} gives no version for {name}"
    )


@pytest.mark.parametrize("name", sorted(hookspecs.REGISTRATION_HOOKS.values()))
def test_every_registration_hook_names_the_shapes_it_accepts(name):
    # with postponed annotations the return annotation is its source text
    answer = inspect.signature(HOOKSPECS[name]).return_annotation
    assert answer is not inspect.Signature.empty, f"{name} has no return annotation"
    shapes = {shape.strip() for shape in str(answer).strip("()").split("|")}
    assert "Any" not in shapes, f"{name} returns Any: name the records it accepts"
    assert "None" in shapes, f"{name} does not say that None (not yours) is an answer"


# The checker itself, on hookspecs that break the form: each omission is named.

_hookspec = hookspecs.hookspec


@_hookspec(firstresult=True)
def _undocumented(name: str, dry_run: bool) -> None:
    """Something, undocumented.

    :param name: the name.

    First result: no.

    Example::

        def broken(:
    """


def test_the_checker_names_each_missing_part():
    missing = missing_parts(_undocumented)
    # the compiler's wording of the syntax error differs between Python versions
    assert [part.split(" (")[0] if part.startswith("an example") else part for part in missing] == [
        "`:param dry_run:`",
        "`:returns:`",
        "a `Called:` paragraph (when and how often)",
        "a true first-result line (it says 'no'; the marker's firstresult=True)",
        "an example that is Python",
        "`.. versionadded:: X.Y.Z`",
    ]


def test_the_checker_passes_a_documented_hookspec():
    @_hookspec
    def documented(name: str) -> str | None:
        """A thing called `name`.

        :param name: the name.
        :returns: the thing, or None.

        Called: once.

        First result: no.

        Example::

            @platoon.hookimpl
            def documented(name):
                return name

        .. versionadded:: 0.2.0
        """

    assert missing_parts(documented) == []
