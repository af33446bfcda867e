"""The viewer's own command line: `platoon viz tail|replay|show-dump` and `python -m platoon.viz`.

A typer group like every other `platoon` command (the same help layout, `-h`, usage errors with exit 64), kept here
because the viewer's options are its own: platoon's `main` hands everything after `viz` to `main` below
without building the rest of the command line, and `platoon --help` lists it from `platoon.cli.root`. Textual is
imported only once the arguments are good and a viewer is about to start; without it, one line names the extra
that brings it. Exit codes as the rest of the command line: 0 ok, 1 failure (textual missing, a dump that is not
one), 64 usage.
"""

from __future__ import annotations

import contextlib
import sys
import tempfile
from collections.abc import Sequence
from contextvars import ContextVar
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from typer._click.exceptions import UsageError

from platoon.cli.output import TOP_LEVEL, new_app
from platoon.errors import EX_FAILURE
from platoon.extras import installed

if TYPE_CHECKING:
    from platoon.viz.app import ViewerApp
    from platoon.viz.model import Mode, RolloutFilter

__all__ = ["MISSING_TEXTUAL", "app", "build", "build_command", "main", "textual_available"]

MISSING_TEXTUAL = (
    "the trajectory viewer needs textual, which is not installed: pip install 'platoon-core[viz]'"
)
DEFAULT_DELAY = 0.5
MODES = ("auto", "codeact", "openhands")
HELP = "The trajectory viewer: follow, replay or show the event files of training, eval and rollout."

app = new_app(HELP, name="viz", **TOP_LEVEL)


@app.callback()
def viewer_needs_textual(ctx: typer.Context) -> None:
    """The trajectory viewer: follow, replay or show the event files of training, eval and rollout."""
    # Before a command looks at its arguments: without Textual nothing it could say would help.
    if not textual_available():
        print(f"{_prog(ctx)}: {MISSING_TEXTUAL}", file=sys.stderr)
        raise typer.Exit(EX_FAILURE)


# The options the three commands share.
Paths = Annotated[
    list[Path] | None, typer.Argument(metavar="[PATH]...", help="Event files to read.", show_default=False)
]
Dirs = Annotated[
    list[Path] | None,
    typer.Option(
        "--dir", metavar="DIR", help="Every *.jsonl of DIR (not descending); repeatable.", show_default=False
    ),
]
ModeOption = Annotated[
    str,
    typer.Option(
        "--mode",
        metavar="MODE",
        help="How steps are summarised: auto, codeact or openhands (auto: OpenHands where a step has "
        "action/observation events).",
    ),
]
SelectableText = Annotated[
    bool,
    typer.Option(
        "--selectable-text",
        help="Start with mouse capture off, so the terminal can select text (m toggles it).",
    ),
]
FilterOption = Annotated[
    str | None,
    typer.Option(
        "--filter",
        metavar="TERMS",
        help="List only the rollouts that match, e.g. 'reward<1 outcome:error task:train:3' (f in the viewer "
        "changes it; ? lists the terms).",
        show_default=False,
    ),
]


@app.command("tail", short_help="Follow event files as they grow.")
def tail(
    ctx: typer.Context,
    paths: Paths = None,
    dir: Dirs = None,
    rdir: Annotated[
        list[Path] | None,
        typer.Option(
            "--rdir",
            metavar="DIR",
            help="Every *.jsonl under DIR, however deep (a training run's directory); repeatable.",
            show_default=False,
        ),
    ] = None,
    mode: ModeOption = "auto",
    selectable_text: SelectableText = False,
    filter: FilterOption = None,
) -> int:
    """Follow event files as they grow (every 0.2 s while they grow, every 2 s once they stop)."""
    paths, dirs, rdirs = paths or [], dir or [], rdir or []
    if not (paths or dirs or rdirs):
        raise UsageError("name at least one file, --dir or --rdir")
    rule = _rule(filter)

    def viewer() -> ViewerApp:
        from platoon.viz.app import ViewerApp
        from platoon.viz.sources import Tailer

        title = "tail " + " ".join(str(p) for p in [*paths, *dirs, *rdirs])
        tailer = Tailer(paths, dirs, rdirs)
        return ViewerApp(
            tailer=tailer, mode=_mode(mode), selectable_text=selectable_text, title=title, rule=rule
        )

    return _run(ctx, viewer)


@app.command("replay", short_help="Replay event files merged by time.")
def replay(
    ctx: typer.Context,
    paths: Paths = None,
    dir: Dirs = None,
    delay: Annotated[
        float, typer.Option("--delay", metavar="SECONDS", help="Seconds between records (0: all at once).")
    ] = DEFAULT_DELAY,
    mode: ModeOption = "auto",
    selectable_text: SelectableText = False,
    filter: FilterOption = None,
) -> int:
    """Replay event files from their start, merged by time, with play, pause and step."""
    paths, dirs = paths or [], dir or []
    _inputs(paths, dirs)
    if delay < 0:
        raise typer.BadParameter(f"must be 0 or more, not {delay:g}", param_hint="--delay")
    rule = _rule(filter)

    def viewer() -> ViewerApp:
        from platoon.viz.app import ViewerApp
        from platoon.viz.sources import Replay, event_files

        files = event_files(paths, dirs)
        if not files:
            raise typer.BadParameter("no *.jsonl files there", param_hint="--dir")
        return ViewerApp(
            replay=Replay(files),
            delay=delay,
            mode=_mode(mode),
            selectable_text=selectable_text,
            title="replay " + " ".join(str(p) for p in [*paths, *dirs]),
            rule=rule,
        )

    return _run(ctx, viewer)


@app.command("show-dump", short_help="Show TrajectoryCollection dumps.")
def show_dump(
    ctx: typer.Context,
    paths: Annotated[
        list[Path] | None,
        typer.Argument(
            metavar="[PATH]...",
            help="TrajectoryCollection dumps: .json, or .jsonl with one dump a line.",
            show_default=False,
        ),
    ] = None,
    dir: Dirs = None,
    mode: ModeOption = "auto",
    selectable_text: SelectableText = False,
    filter: FilterOption = None,
) -> int:
    """Show TrajectoryCollection dumps (as `platoon eval` and `platoon rollout` write them) all at once."""
    paths, dirs = paths or [], dir or []
    _inputs(paths, dirs)
    rule = _rule(filter)
    prog = _prog(ctx)

    def viewer(stack: contextlib.ExitStack) -> ViewerApp:
        from platoon.viz.app import ViewerApp
        from platoon.viz.sources import Replay, convert_dumps, dump_files

        dumps, skipped = dump_files(paths, dirs)
        for path in skipped:
            print(f"{prog} show-dump: skipped {path} (a dump is .json or .jsonl)", file=sys.stderr)
        if not dumps:
            raise typer.BadParameter("no .json or .jsonl dump there", param_hint="PATH")
        output = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="platoon-viz-")))
        return ViewerApp(
            replay=Replay(convert_dumps(dumps, output)),
            delay=0.0,
            mode=_mode(mode),
            selectable_text=selectable_text,
            title="show-dump " + " ".join(str(p) for p in [*paths, *dirs]),
            rule=rule,
        )

    return _run(ctx, viewer, with_stack=True)


def _inputs(paths: list[Path], dirs: list[Path]) -> None:
    """replay and show-dump read what is there now: each name must exist."""
    if not (paths or dirs):
        raise UsageError("name at least one file or --dir")
    for path in paths:
        if not path.is_file():
            raise typer.BadParameter(f"no such file: {path}", param_hint="PATH")
    for directory in dirs:
        if not directory.is_dir():
            raise typer.BadParameter(f"no such directory: {directory}", param_hint="--dir")


def _mode(mode: str) -> Mode:
    if mode not in MODES:
        raise typer.BadParameter(f"{mode!r} is not one of {', '.join(MODES)}", param_hint="--mode")
    return mode  # type: ignore[return-value]


def _rule(text: str | None) -> RolloutFilter | None:
    if not text:
        return None
    from platoon.viz.model import parse_filter

    try:
        return parse_filter(text)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--filter") from None


def _prog(ctx: typer.Context) -> str:
    """`platoon viz`, or `python -m platoon.viz`: how the user called the viewer."""
    return ctx.find_root().info_name or "platoon viz"


#: set by `build`: where the viewer a command makes goes instead of being run, and the stack its files live on
_BUILDING: ContextVar[tuple[list[ViewerApp], contextlib.ExitStack] | None] = ContextVar(
    "_BUILDING", default=None
)


def _run(ctx: typer.Context, viewer: Any, *, with_stack: bool = False) -> int:
    """Start the viewer `viewer()` makes (given an exit stack for its temporary files when `with_stack`); Textual
    is first imported here, after the arguments were checked."""
    prog = _prog(ctx)
    building = _BUILDING.get()
    if building is not None:
        made, outer = building
        made.append(viewer(outer) if with_stack else viewer())
        return 0
    with contextlib.ExitStack() as stack:
        try:
            made = viewer(stack) if with_stack else viewer()
        except (OSError, ValueError) as exc:  # a dump that is not one, a file that cannot be read
            print(f"{prog} {ctx.info_name}: {exc}", file=sys.stderr)
            return EX_FAILURE
        result = made.run()
    return result if isinstance(result, int) else 0


def textual_available() -> bool:
    return installed("textual")


def build_command() -> Any:
    """The click command of `app`, always a group, in the help style of every platoon command."""
    from platoon.cli.style import plain_help

    return plain_help(typer.main.get_group(app))


def build(argv: Sequence[str], stack: contextlib.ExitStack, *, prog: str = "platoon viz") -> ViewerApp:
    """The viewer the command line `argv` describes, made but not started (the tests drive it with Textual's
    pilot; the screenshot script saves its screens); its temporary files live as long as `stack`. A bad command
    line raises click's UsageError."""
    made: list[ViewerApp] = []
    token = _BUILDING.set((made, stack))
    try:
        build_command().main(args=list(argv), prog_name=prog, standalone_mode=False)
    finally:
        _BUILDING.reset(token)
    if not made:
        raise RuntimeError(f"{prog} {' '.join(argv)} made no viewer (is textual installed?)")
    return made[0]


def main(argv: Sequence[str] | None = None, *, prog: str = "platoon viz") -> int:
    """Run the viewer's command line on `argv` (default: `sys.argv[1:]`); returns the exit status."""
    from platoon.cli.running import run_command

    return run_command(build_command(), list(sys.argv[1:] if argv is None else argv), prog=prog)
