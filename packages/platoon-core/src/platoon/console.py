"""The console helper every command and plugin prints through: diagnostics on stderr prefixed `platoon: `, data
(tables, YAML, JSON) on stdout."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable, Sequence
from typing import Any


def err(message: str) -> None:
    """One diagnostic line (or block) on stderr, prefixed `platoon: `."""
    write_stderr(f"platoon: {message}\n")


def write_stderr(text: str) -> None:
    """Write `text` to stderr and flush it, never raising.

    A reader that went away (`platoon train ... 2>&1 | tee log`, then Ctrl-C, which ends tee too) must not turn a
    message on the way to a stop or a checkpoint into an exception: stderr (and stdout, when it is the same pipe)
    then goes to /dev/null for the rest of the process, so later lines, log records and the interpreter's final
    flush do not fail either.
    """
    try:
        sys.stderr.write(text)
        sys.stderr.flush()
    except (OSError, ValueError, RuntimeError):  # RuntimeError: a signal handler's write inside another write
        _send_to_devnull()


def _send_to_devnull() -> None:
    import contextlib
    import os

    try:
        broken = os.fstat(2)
    except OSError:
        return
    streams = [2]
    with contextlib.suppress(OSError):
        shown = os.fstat(1)
        if (shown.st_dev, shown.st_ino) == (broken.st_dev, broken.st_ino):
            streams.append(1)
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        for fd in streams:
            os.dup2(devnull, fd)
    finally:
        os.close(devnull)
    for stream in (sys.stderr, sys.stdout):
        with contextlib.suppress(OSError, ValueError, RuntimeError):
            stream.flush()  # what the closed pipe refused is dropped now, not at exit


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


def new_app(help: str, **settings: Any) -> Any:
    """A command group with platoon's settings: plain help output (rich adds ~0.1 s), no completion install; a
    top-level one (`platoon`, `platoon viz`) passes its own `settings` on too."""
    import typer

    return typer.Typer(
        help=help, no_args_is_help=True, add_completion=False, rich_markup_mode=None, **settings
    )


#: what a top-level command group adds to `new_app`'s settings: `-h` too, and errors said by platoon, not typer
TOP_LEVEL = {"pretty_exceptions_enable": False, "context_settings": {"help_option_names": ["-h", "--help"]}}
