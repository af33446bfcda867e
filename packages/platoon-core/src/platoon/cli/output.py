"""What every command prints: diagnostics on stderr prefixed `platoon: `, data (tables, YAML, JSON) on stdout."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable, Sequence
from typing import Any


def err(message: str) -> None:
    """One diagnostic line (or block) on stderr, prefixed `platoon: `."""
    print(f"platoon: {message}", file=sys.stderr, flush=True)


def out(text: str = "") -> None:
    print(text, flush=True)


def table(headers: Sequence[str], rows: Iterable[Sequence[Any]], *, indent: str = "") -> str:
    """Column-aligned text with two-space gaps and no trailing spaces."""
    cells = [list(map(str, headers))] + [
        ["-" if c is None or c == "" else str(c) for c in row] for row in rows
    ]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    lines = [
        indent + "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in cells
    ]
    return "\n".join(lines)


def dump_json(value: Any) -> str:
    return json.dumps(value, indent=2, ensure_ascii=False)


def new_app(help: str) -> Any:
    """A command group with platoon's settings: plain help output (rich adds ~0.1 s), no completion install."""
    import typer

    return typer.Typer(help=help, no_args_is_help=True, add_completion=False, rich_markup_mode=None)
