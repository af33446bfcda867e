"""How a typer-built command runs: its exit status from what it returned or raised, for `platoon` and for the
viewer's command line alike. typer is imported only when a command runs."""

from __future__ import annotations

import sys
import warnings
from typing import Any

__all__ = ["reader_went_away", "run_command"]


def run_command(command: Any, args: list[str], *, prog: str) -> int:
    """Run a click command that typer built (`platoon`'s, or the viewer's) on `args`; returns the exit status: what
    it returned, or what it raised said in one line with platoon's status for it (64 for bad usage)."""
    from typer import Abort, Exit
    from typer._click.exceptions import ClickException, UsageError

    from platoon.cli.output import err
    from platoon.deprecations import PlatoonDeprecationWarning
    from platoon.errors import EX_CONFIG, EX_USAGE, PlatoonError

    try:
        with warnings.catch_warnings():
            result = command.main(args=args, prog_name=prog, standalone_mode=False)
    except UsageError as exc:
        exc.show()
        return EX_USAGE
    except ClickException as exc:
        exc.show()
        return exc.exit_code
    except Exit as exc:
        return exc.exit_code
    except Abort:
        err("aborted")
        return 130
    except PlatoonDeprecationWarning as warning:
        err(f"{warning}; the warning filters make deprecations errors")
        return EX_CONFIG
    except PlatoonError as exc:
        err(str(exc))
        return exc.exit_code
    except BrokenPipeError:
        return reader_went_away()
    return result if isinstance(result, int) and not isinstance(result, bool) else 0


def reader_went_away() -> int:
    """The reader of stdout closed it (`platoon --help | head -1`): what is still buffered goes nowhere, so the
    interpreter's final flush raises nothing and no traceback follows the output the reader took."""
    import os

    try:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    except (
        OSError,
        ValueError,
    ):  # a replaced stdout without a file descriptor: nothing left to flush into it
        pass
    return 1
