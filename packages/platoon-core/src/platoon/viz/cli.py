"""The viewer's own command line: `platoon viz tail|replay|show-dump` (platoon's `main` hands it everything after
`viz`, bypassing typer) and `python -m platoon.viz`.

argparse rather than typer: the viewer's options are its own (core.md 3.1). Textual is imported only once the
arguments are good and a viewer is about to start; without it, one line names the extra that brings it.
Exit codes as the rest of the command line: 0 ok, 1 failure (textual missing, a dump that is not one), 64 usage.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

from platoon.errors import EX_FAILURE, EX_USAGE

if TYPE_CHECKING:
    from platoon.viz.app import ViewerApp

__all__ = ["MISSING_TEXTUAL", "build", "main", "parser", "textual_available"]

MISSING_TEXTUAL = (
    "the trajectory viewer needs textual, which is not installed: pip install 'platoon-core[viz]'"
)
DEFAULT_DELAY = 0.5


class _UsageError(Exception):
    pass


class _Parser(argparse.ArgumentParser):
    """argparse whose errors are returned as the usage status (64) instead of exiting with 2."""

    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        raise _UsageError(f"{self.prog}: {message}")


def parser(prog: str = "platoon viz") -> argparse.ArgumentParser:
    top = _Parser(
        prog=prog,
        description="The trajectory viewer: follow, replay or show the event files of training, eval and rollout.",
    )
    commands = top.add_subparsers(
        dest="command", required=True, metavar="{tail,replay,show-dump}", parser_class=_Parser
    )

    def common(sub: argparse.ArgumentParser, *, rdir: bool = False) -> None:
        sub.add_argument("paths", nargs="*", metavar="PATH", help="files to read")
        sub.add_argument(
            "--dir", action="append", default=[], metavar="D", help="every *.jsonl of D (not descending)"
        )
        if rdir:
            sub.add_argument("--rdir", action="append", default=[], metavar="R", help="every *.jsonl under R")
        sub.add_argument(
            "--mode",
            choices=("auto", "codeact", "openhands"),
            default="auto",
            help="step rendering (auto: OpenHands where a step has action/observation events)",
        )
        sub.add_argument(
            "--selectable-text",
            action="store_true",
            help="start with mouse capture off, so the terminal can select text (m toggles it)",
        )

    tail = commands.add_parser("tail", help="follow event files as they grow (polled every 0.2 s)")
    common(tail, rdir=True)
    replay = commands.add_parser("replay", help="replay event files, merged by time")
    common(replay)
    replay.add_argument(
        "--delay",
        type=float,
        default=DEFAULT_DELAY,
        metavar="S",
        help="seconds between records (0: all at once)",
    )
    dump = commands.add_parser(
        "show-dump", help="show TrajectoryCollection dumps (.json, or .jsonl one a line)"
    )
    common(dump)
    return top


def textual_available() -> bool:
    return importlib.util.find_spec("textual") is not None


def build(args: argparse.Namespace, stack: contextlib.ExitStack, prog: str = "platoon viz") -> ViewerApp:
    """The viewer for parsed arguments; temporary files (show-dump's event files) live as long as `stack`.
    The arguments are checked before Textual is imported."""
    from platoon.viz.sources import Replay, Tailer, convert_dumps, dump_files, event_files

    command = args.command
    where = f"{prog} {command}"
    if not (args.paths or args.dir or getattr(args, "rdir", None)):
        raise _UsageError(
            f"{where}: name at least one file or --dir" + (" or --rdir" if command == "tail" else "")
        )
    if command == "tail":
        tailer = Tailer(args.paths, args.dir, args.rdir)
        title = "tail " + " ".join([*args.paths, *args.dir, *args.rdir])
        from platoon.viz.app import ViewerApp

        return ViewerApp(tailer=tailer, mode=args.mode, selectable_text=args.selectable_text, title=title)
    for path in args.paths:
        if not Path(path).is_file():
            raise _UsageError(f"{where}: no such file: {path}")
    for directory in args.dir:
        if not Path(directory).is_dir():
            raise _UsageError(f"{where}: no such directory: {directory}")
    if command == "replay":
        if args.delay < 0:
            raise _UsageError(f"{where}: --delay must be 0 or more, not {args.delay:g}")
        files = event_files(args.paths, args.dir)
        delay = args.delay
    else:
        dumps, skipped = dump_files(args.paths, args.dir)
        for path in skipped:
            print(f"{where}: skipped {path} (a dump is .json or .jsonl)", file=sys.stderr)
        output = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="platoon-viz-")))
        files = convert_dumps(dumps, output)
        delay = 0.0
    if not files:
        raise _UsageError(f"{where}: no files to show")
    title = f"{command} " + " ".join(str(p) for p in [*args.paths, *args.dir])
    from platoon.viz.app import ViewerApp

    return ViewerApp(
        replay=Replay(files), delay=delay, mode=args.mode, selectable_text=args.selectable_text, title=title
    )


def main(argv: Sequence[str] | None = None, *, prog: str = "platoon viz") -> int:
    """Run the viewer on `argv` (default: `sys.argv[1:]`); returns the exit status."""
    try:
        args = parser(prog).parse_args(list(sys.argv[1:] if argv is None else argv))
    except _UsageError as exc:
        print(exc, file=sys.stderr)
        return EX_USAGE
    except SystemExit as exc:  # --help
        return exc.code if isinstance(exc.code, int) else 0
    if not textual_available():
        print(f"{prog}: {MISSING_TEXTUAL}", file=sys.stderr)
        return EX_FAILURE
    with contextlib.ExitStack() as stack:
        try:
            app = build(args, stack, prog)
        except _UsageError as exc:
            print(exc, file=sys.stderr)
            return EX_USAGE
        except (OSError, ValueError) as exc:
            print(f"{prog} {args.command}: {exc}", file=sys.stderr)
            return EX_FAILURE
        result = app.run()
    return result if isinstance(result, int) else 0
