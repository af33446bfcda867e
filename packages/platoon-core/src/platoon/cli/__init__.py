"""The `platoon` command line (typer). `main(argv)` is the console script and is also called in process.

Exit codes: 0 ok, 1 runtime failure, 64 usage error (click's 2 is mapped), 78 configuration a run
refuses; a non-zero integer a command returns becomes the exit status.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

# run_command lives below this package's __init__ so the viewer's command line (platoon.viz.cli), which this
# module's `platoon viz` calls, runs through it without importing this module back; it stays importable from here.
from platoon.cli.running import reader_went_away, run_command


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line on `argv` (default: `sys.argv[1:]`) and return the exit status."""
    args = list(sys.argv[1:] if argv is None else argv)
    from platoon._installation import report_earlier_line

    if report_earlier_line():
        return 1
    try:
        if argv is None:  # the console script: this process and its heap are the command's (platoon.heap)
            from platoon.heap import owned_by_the_command

            with owned_by_the_command():
                return _run(args)
        return _run(args)
    except BrokenPipeError:
        return reader_went_away()
    except ImportError as exc:
        # A module of platoon's own that cannot be imported is, in an installed platoon, a damaged installation
        # (another distribution wrote or deleted files of the platoon/ folder): one line saying how to repair it.
        from platoon._installation import diagnose, is_own_module

        problem = diagnose() if is_own_module(exc.name) else None
        if problem is None:
            raise
        print(f"platoon: {problem}", file=sys.stderr, flush=True)
        return 1
    finally:
        if argv is None:
            _before_exit()


def _before_exit() -> None:
    """The console script exits next (`sys.exit(main())`): the objects alive now are moved out of the cyclic
    garbage collector's reach, so the interpreter's shutdown does not walk them all again (after a command that
    imported torch, tinker or an environment SDK that walk takes seconds). Not done for in-process calls, whose
    objects must stay collectable."""
    import gc

    if "triton" in sys.modules:
        # torch's triton binds with nanobind, which reports every object of its types still alive at exit as a
        # leak (a page of "nanobind: leaked ..."): a command that loaded it in this process frees it all. (`platoon
        # tinker serve`, the one that loads torch here, ends with `os._exit` before this: local_server/process.py.)
        return
    gc.freeze()


def _run(args: list[str]) -> int:
    from platoon.errors import EX_USAGE

    if not args or args in (["--help"], ["-h"]):
        # The root help page needs neither typer nor importlib.metadata (platoon.cli.root). Alone, `platoon`
        # prints it on stderr and exits with the usage status, as the typer app does.
        from platoon.cli.root import render_help

        print(render_help(), file=sys.stdout if args else sys.stderr, flush=True)
        return 0 if args else EX_USAGE

    if args and args[0] == "viz":
        # The trajectory viewer parses its own arguments.
        from platoon.viz.cli import main as viz_main

        return viz_main(args[1:], prog="platoon viz")

    from platoon.cli.app import build_command

    return run_command(build_command(), args, prog="platoon")
