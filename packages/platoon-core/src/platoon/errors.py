"""The errors a user can cause, each carrying what the command line needs to print one clear line.

Exit codes: 78 for a configuration a run refuses, 64 for bad command-line usage, 1 for a runtime
failure. Tracebacks are for bugs: anything a user can provoke is raised as one of these.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

EX_USAGE = 64
EX_CONFIG = 78
EX_FAILURE = 1


class PlatoonError(Exception):
    """Base of platoon's user-facing errors; `exit_code` is what the command line exits with."""

    exit_code: int = EX_FAILURE


class ConfigError(PlatoonError, ValueError):
    """A configuration problem (exit 78), possibly many problems of one file reported together.

    Printed as `invalid config <source>:` followed by one indented line per problem, or just the message when
    there is a single problem and no source (subclasses for key problems print their one line).
    """

    exit_code = 78

    def __init__(self, problems: str | Iterable[str], *, source: str | None = None) -> None:
        self.problems: list[str] = [problems] if isinstance(problems, str) else list(problems)
        self.source = source
        super().__init__(self.render())

    def render(self) -> str:
        if self.source is None and len(self.problems) == 1:
            return self.problems[0]
        head = f"invalid config {self.source}:" if self.source else "invalid config:"
        return "\n".join([head, *(f"  {problem}" for problem in self.problems)])


class ExtensionError(ConfigError):
    """A component that cannot be resolved: unknown, ambiguous, incompatible or failing to load (exit 78)."""

    def __init__(self, message: str) -> None:
        super().__init__([message])


class UsageError(PlatoonError):
    """Bad command-line usage (exit 64)."""

    exit_code = EX_USAGE


class NotPrepared(ConfigError):
    """What a run needs is not prepared on this site (exit 78); the command line names the prepare command."""

    def __init__(self, problems: Sequence[str], *, command: str | None = None) -> None:
        #: the `platoon prepare ...` command for this config and overrides (shell-quoted), printed last
        self.command = command
        super().__init__(list(problems))

    def render(self) -> str:
        lines = ["what the run needs is not prepared on this site:", *(f"  {p}" for p in self.problems)]
        if self.command:
            lines.append(f"prepare it with: {self.command}")
        return "\n".join(lines)
