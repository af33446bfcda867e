"""Harbor sessions: the agent's sandbox, the environment tools, forks, the oracle, grading.

A `LiveSandbox` is one started sandbox and its gate, shared by every session view forked `shared` (reference counted);
the last view to close drains in-flight calls (at most `close_timeout_s`) and stops the sandbox in a shielded task,
so cancellation cannot cut the stop short. Every tool call and `run_solution()` takes a turn of the gate (serial
unless the tool is listed in `concurrent_tools`); grading and copy snapshots take exclusive turns.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import posixpath
import shutil
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from platoon import Task
from platoon.envs.gate import EnvBusy, Gate, GateClosed, SessionView, SharedLease
from platoon.envs.service import (
    EnvSetupError,
    ForkMode,
    Outcome,
    SessionNeeds,
    ToolResult,
    ToolSpec,
    infra_from_exception,
)
from platoon_harbor import grading
from platoon_harbor.tasks import HarborTask, UnsetVariable, VariableNotPassed, resolve_env
from platoon_harbor.users import as_user

__all__ = ["TOOL_NAMES", "HarborSession", "cut_middle", "format_bash"]

log = logging.getLogger(__name__)

TOOL_NAMES = ("bash", "view", "write", "edit")
#: tool outputs longer than this are cut in the middle
MAX_OUTPUT_CHARS = 30_000
#: the lines of context around an edit in its snippet
EDIT_CONTEXT_LINES = 4


# --- output rules -----------------------------------------------------------------------------------------------


def cut_middle(text: str, limit: int = MAX_OUTPUT_CHARS) -> str:
    """`text`, or its head and tail with a marker saying how many characters were cut from the middle."""
    if len(text) <= limit:
        return text
    marker = "\n[... {} characters cut ...]\n"
    keep = limit - len(marker.format(len(text)))
    head = keep // 2
    tail = keep - head
    return text[:head] + marker.format(len(text) - head - tail) + text[len(text) - tail :]


def format_bash(stdout: str, stderr: str, exit_code: int, timed_out: bool, timeout_s: float) -> str:
    """The bash tool's text: stdout, then `[stderr]` and stderr if any, else `[no output]`; then the exit code
    when non-zero, or the timeout."""
    text = stdout
    if stderr:
        text += "\n[stderr]\n" + stderr
    if not text:
        text = "[no output]"
    if timed_out:
        text += f"\n[command timed out after {timeout_s:g} s]"
    elif exit_code != 0:
        text += f"\n[exit code {exit_code}]"
    return cut_middle(text)


def numbered(lines: list[str], first: int) -> str:
    return "\n".join(f"{n:6}\t{line}" for n, line in enumerate(lines, start=first))


def _schema(properties: dict[str, Any], required: list[str]) -> dict[str, Any]:
    return {"type": "object", "properties": properties, "required": required, "additionalProperties": False}


TOOL_SPECS = (
    ToolSpec(
        "bash",
        "Run a bash command in the task's sandbox, from the working directory. Returns stdout, stderr after "
        "[stderr], and the exit code when it is not zero.",
        _schema({"command": {"type": "string", "description": "the command to run"}}, ["command"]),
    ),
    ToolSpec(
        "view",
        "View a file with numbered lines (optionally a 1-based inclusive line range; -1 means the end), or list "
        "a directory two levels deep. Relative paths are from the working directory.",
        _schema(
            {
                "path": {"type": "string"},
                "view_range": {"type": "array", "items": {"type": "integer"}, "minItems": 2, "maxItems": 2},
            },
            ["path"],
        ),
    ),
    ToolSpec(
        "write",
        "Write a file (making its parent directories; an existing file keeps its mode).",
        _schema({"path": {"type": "string"}, "content": {"type": "string"}}, ["path", "content"]),
    ),
    ToolSpec(
        "edit",
        "Replace old_str, which must occur exactly once in the file, with new_str.",
        _schema(
            {"path": {"type": "string"}, "old_str": {"type": "string"}, "new_str": {"type": "string"}},
            ["path", "old_str", "new_str"],
        ),
    ),
)


class ToolError(Exception):
    """A tool's failure, shown to the model as an error result."""


# --- what a session needs of its service ------------------------------------------------------------------------


# The session module sits below `platoon_harbor.service` (which builds sessions), so it names the service and its
# options by these protocols rather than importing them; mypy checks `HarborService` against them where
# `service.py` hands itself to a `LiveSandbox`.
class SessionOptions(Protocol):
    """The `HarborOptions` fields a session reads."""

    @property
    def queue_timeout_s(self) -> float | None: ...
    @property
    def close_timeout_s(self) -> float: ...
    @property
    def tool_timeout_s(self) -> float: ...
    @property
    def concurrent_tools(self) -> frozenset[str]: ...
    @property
    def agent_user(self) -> str: ...
    @property
    def env(self) -> Mapping[str, str]: ...
    @property
    def pass_env(self) -> frozenset[str]: ...
    @property
    def verifier_timeout_multiplier(self) -> float: ...
    @property
    def reward(self) -> grading.RewardContract: ...
    @property
    def verifier_classifiers(self) -> tuple[grading.Classifier, ...]: ...
    @property
    def max_artifact_bytes(self) -> int: ...


class SessionService(Protocol):
    """What a session asks of the `HarborService` that opened it: its options, timeouts, verifier and forks."""

    @property
    def options(self) -> SessionOptions: ...
    def agent_timeout_for(self, task: HarborTask) -> float | None: ...
    def grades_separately(self, task: HarborTask) -> bool: ...
    def verifier_timeout_s(self, task: HarborTask) -> float: ...
    async def start_verifier(self, spec: Any) -> Any: ...
    async def open(
        self,
        task: Task,
        *,
        rollout_id: str,
        needs: SessionNeeds | None = None,
        view_task: Task | None = None,
    ) -> HarborSession: ...
    async def open_copy(self, session: HarborSession, child_task: Task) -> HarborSession: ...


# --- the live sandbox -------------------------------------------------------------------------------------------


@dataclass
class OpenedSandbox:
    """What `HarborService.open` prepared: the sandbox and what its sessions need to know."""

    sandbox: Any
    spec: Any
    task: HarborTask
    env: dict[str, str]
    workdir: str
    label: str
    network_isolated: bool
    host_loopback: bool
    needs: SessionNeeds | None
    rollout_id: str
    #: separate mode: the verifier's sandbox spec (its env is laid over at grading) and whether it bundles /tests
    verifier_spec: Any = None
    bundled_tests: bool = False


class LiveSandbox(SharedLease):
    """One started sandbox with its gate and its reference count."""

    def __init__(self, service: SessionService, opened: OpenedSandbox) -> None:
        super().__init__(
            Gate(queue_timeout_s=service.options.queue_timeout_s, name=opened.label), opened.label
        )
        self.service = service
        self.opened = opened
        self.sandbox = opened.sandbox
        #: separate mode: the artifacts taken from main (kept for regrading) and whether main was released
        self.collected: grading.Collected | None = None
        self.main_released = False

    async def _close(self) -> None:
        await self._drain_gate(
            self.service.options.close_timeout_s, log, then="stopping the sandbox under them"
        )
        try:
            await self.sandbox.stop()
        except Exception as exc:  # the registry still lists it, so a reap finds it
            log.warning("%s: stopping the sandbox failed: %s: %s", self.opened.label, type(exc).__name__, exc)
        finally:
            if self.collected is not None:
                shutil.rmtree(self.collected.root, ignore_errors=True)

    async def release_main(self) -> None:
        """Separate mode, nothing else holding main: stop it now; the session keeps only its artifacts."""
        self.main_released = True
        try:
            await asyncio.shield(self.sandbox.stop())
        except Exception as exc:
            log.warning("%s: stopping the sandbox failed: %s: %s", self.opened.label, type(exc).__name__, exc)

    def refusal(self) -> ToolResult | None:
        if self.main_released:
            return _error("Not run: the session was graded and its sandbox released.", "session_graded")
        return None


class HarborSession(SessionView):
    """A view of a live Harbor sandbox: tools through the gate, `run_solution()`, grading, forks, close."""

    _lease: LiveSandbox

    # -- attributes ------------------------------------------------------------------------------------------------

    @property
    def harbor_task(self) -> HarborTask:
        return self._lease.opened.task

    @property
    def instruction(self) -> str:
        return self._task.goal or self._lease.opened.task.instruction

    @property
    def sandbox(self) -> Any:
        return self._lease.sandbox

    @property
    def workdir(self) -> str:
        return self._lease.opened.workdir

    @property
    def mcp_servers(self) -> tuple[Any, ...]:
        return self._lease.opened.task.environment.mcp_servers

    @property
    def network_isolated(self) -> bool:
        return self._lease.opened.network_isolated

    @property
    def host_loopback(self) -> bool:
        return self._lease.opened.host_loopback

    @property
    def agent_timeout_s(self) -> float | None:
        return self._lease.service.agent_timeout_for(self._lease.opened.task)

    # -- tools -----------------------------------------------------------------------------------------------------

    async def tools(self) -> list[ToolSpec]:
        return list(TOOL_SPECS)

    async def call_tool(
        self, name: str, arguments: Mapping[str, Any], *, on_behalf_of: str | None = None
    ) -> ToolResult:
        """Run a tool; refusals, bad calls and failures come back as error results."""
        if name not in TOOL_NAMES:
            return _error(f"Unknown tool {name!r}; the tools are {', '.join(TOOL_NAMES)}.", "unknown_tool")
        if not isinstance(arguments, Mapping) or not all(isinstance(k, str) for k in arguments):
            return _error("Invalid arguments: give a JSON object with string keys.", "invalid_arguments")
        live = self._lease
        if self._closed or live.closed:
            return _error("Not run: the environment session is closed.", "session_closed")
        refused = live.refusal()
        if refused is not None:
            return refused
        args = dict(arguments)
        op = "concurrent" if name in live.service.options.concurrent_tools else "serial"
        try:
            return await live.gate.run(
                lambda: self._run_tool(name, args),
                op,
                caller=on_behalf_of if on_behalf_of is not None else self,
                what=f"tool call {name!r}",
            )
        except EnvBusy as exc:
            return _error(f"Not run: env busy ({exc}). This call does not count; try again.", "env_busy")
        except GateClosed:
            return _error("Not run: the environment session is closed.", "session_closed")

    async def _run_tool(self, name: str, args: dict[str, Any]) -> ToolResult:
        refused = self._lease.refusal()  # checked again once admitted: a grading ahead may have released main
        if refused is not None:
            return refused
        try:
            if name == "bash":
                return await self._bash(args)
            if name == "view":
                return ToolResult.text(cut_middle(await self._view(args)))
            if name == "write":
                return ToolResult.text(await self._write(args))
            return ToolResult.text(cut_middle(await self._edit(args)))
        except ToolError as exc:
            return _error(cut_middle(str(exc)), "tool_error")
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            return _error(cut_middle(f"{name} failed: {type(exc).__name__}: {exc}"), "tool_error")

    def _path(self, args: Mapping[str, Any]) -> str:
        path = args.get("path")
        if not isinstance(path, str) or not path:
            raise ToolError("`path` must be a non-empty string.")
        return posixpath.normpath(posixpath.join(self.workdir, path))

    async def _exec(self, cmd: Any, **kwargs: Any) -> Any:
        env = self._lease.opened.env
        return await self.sandbox.exec(cmd, env=env, **kwargs)

    async def _bash(self, args: Mapping[str, Any]) -> ToolResult:
        command = args.get("command")
        if not isinstance(command, str):
            return _error("`command` must be a string.", "invalid_arguments")
        timeout = self._lease.service.options.tool_timeout_s
        result = await self._exec(command, timeout_s=timeout, cwd=self.workdir)
        return ToolResult.text(
            format_bash(result.stdout, result.stderr, result.exit_code, result.timed_out, timeout)
        )

    async def _read(self, path: str) -> str:
        result = await self._exec(
            [
                "bash",
                "-c",
                'if [ -d "$1" ]; then echo "is a directory" >&2; exit 3; fi; cat -- "$1"',
                "view",
                path,
            ],
            timeout_s=self._lease.service.options.tool_timeout_s,
            cwd="/",
        )
        if result.exit_code != 0:
            reason = (
                result.stderr.strip().splitlines()[-1]
                if result.stderr.strip()
                else f"exit {result.exit_code}"
            )
            raise ToolError(f"Cannot read {path}: {reason}")
        return str(result.stdout)

    async def _view(self, args: Mapping[str, Any]) -> str:
        path = self._path(args)
        listing = await self._exec(
            [
                "bash",
                "-c",
                'cd / && [ -d "$1" ] || exit 2; find "$1" -mindepth 1 -maxdepth 2 -not -path "*/.*" | LC_ALL=C sort',
                "view",
                path,
            ],
            timeout_s=self._lease.service.options.tool_timeout_s,
            cwd="/",
        )
        if listing.exit_code == 0:
            entries = listing.stdout.splitlines()
            head = f"Files and directories in {path} (two levels deep, dot paths left out):"
            return "\n".join([head, *entries]) if entries else f"{head}\n[empty]"
        text = await self._read(path)
        lines = text.split("\n")
        if text.endswith("\n"):
            lines.pop()
        view_range = args.get("view_range")
        first = 1
        if view_range is not None:
            if (
                not isinstance(view_range, list)
                or len(view_range) != 2
                or not all(isinstance(v, int) and not isinstance(v, bool) for v in view_range)
            ):
                raise ToolError(
                    "`view_range` must be two integers [start, end] (1-based, inclusive; end -1 = the end)."
                )
            start, end = view_range
            total = len(lines)
            if end == -1:
                end = total
            if start < 1 or start > max(total, 1) or end < start or end > total:
                raise ToolError(f"Invalid view_range {view_range}: the file has {total} line(s).")
            lines = lines[start - 1 : end]
            first = start
        return numbered(lines, first)

    async def _write_text(self, path: str, content: str) -> None:
        # `cat >` truncates an existing file in place, so it keeps its mode; parents are made first.
        result = await self._exec(
            ["bash", "-c", 'mkdir -p -- "$(dirname -- "$1")" && cat > "$1"', "write", path],
            stdin=content,
            timeout_s=self._lease.service.options.tool_timeout_s,
            cwd="/",
        )
        if result.exit_code != 0:
            raise ToolError(f"Cannot write {path}: {result.stderr.strip() or f'exit {result.exit_code}'}")

    async def _write(self, args: Mapping[str, Any]) -> str:
        path = self._path(args)
        content = args.get("content")
        if not isinstance(content, str):
            raise ToolError("`content` must be a string.")
        await self._write_text(path, content)
        return f"Wrote {len(content.encode())} bytes to {path}."

    async def _edit(self, args: Mapping[str, Any]) -> str:
        path = self._path(args)
        old, new = args.get("old_str"), args.get("new_str")
        if not isinstance(old, str) or not old:
            raise ToolError("`old_str` must be a non-empty string.")
        if not isinstance(new, str):
            raise ToolError("`new_str` must be a string.")
        text = await self._read(path)
        count = text.count(old)
        if count == 0:
            raise ToolError(f"old_str does not occur in {path}; nothing was changed.")
        if count > 1:
            raise ToolError(f"old_str occurs {count} times in {path}; make it unique. Nothing was changed.")
        at = text.index(old)
        updated = text[:at] + new + text[at + len(old) :]
        await self._write_text(path, updated)
        first_line = text[:at].count("\n")  # 0-based line where the edit starts
        last_line = first_line + new.count("\n")
        lines = updated.split("\n")
        if updated.endswith("\n"):
            lines.pop()
        lo = max(0, first_line - EDIT_CONTEXT_LINES)
        hi = min(len(lines), last_line + EDIT_CONTEXT_LINES + 1)
        return f"Edited {path}. The changed lines with context:\n" + numbered(lines[lo:hi], lo + 1)

    # -- the oracle ------------------------------------------------------------------------------------------------

    async def run_solution(self) -> Any:
        """Upload `solution/` to /solution and run `bash /solution/solve.sh` from the workdir (for
        `platoon-oracle`); returns the `ExecResult`."""
        live = self._lease
        task = live.opened.task
        if live.main_released:
            raise EnvSetupError(
                "env_setup", f"{live.opened.label}: the session was graded and its sandbox released"
            )
        if not task.has_solution:
            raise EnvSetupError("env_config", f"Harbor task {task.id} has no solution/solve.sh")
        timeout = self.agent_timeout_s or live.service.options.tool_timeout_s

        async def solve() -> Any:
            await self.sandbox.upload(task.solution_dir, "/solution")
            return await self._exec("bash /solution/solve.sh", timeout_s=timeout, cwd=self.workdir)

        return await live.gate.run(solve, "serial", caller=self, what="run_solution")

    # -- grading ---------------------------------------------------------------------------------------------------

    async def grade(self) -> Outcome:
        """Grade by the task's tests; infrastructure failures are untrainable outcomes, never raised."""
        live = self._lease
        try:
            if self._closed or live.closed:
                return Outcome.infra("session_closed", reason="the session closed before it was graded")
            return await live.gate.run(self._grade, "exclusive", caller=self, what="grade")
        except EnvBusy as exc:
            return Outcome.infra("env_busy", reason=str(exc))
        except GateClosed:
            return Outcome.infra("session_closed", reason="the session closed before it was graded")
        except Exception as exc:
            return infra_from_exception(exc)

    async def _grade(self) -> Outcome:
        live = self._lease
        service = live.service
        task = live.opened.task
        extra: dict[str, Any] = {}
        if service.options.agent_user == "ignore" and (task.agent.user or task.verifier.user):
            extra["ignored_users"] = {
                k: v for k, v in (("agent", task.agent.user), ("verifier", task.verifier.user)) if v
            }
        try:
            verifier_env = {
                **live.opened.env,
                **resolve_env(task.verifier.env, passed=service.options.pass_env, what="[verifier].env"),
            }
        except (UnsetVariable, VariableNotPassed) as exc:
            return Outcome.infra("verifier_setup", reason=str(exc), metadata=extra)
        if service.grades_separately(task):
            return await self._grade_separate(extra)
        # With a task user, platoon's own steps run as root and the tests as the verifier's user (root unless the
        # task names one, as in Harbor).
        spec_user = live.opened.spec.user
        verifier_user = task.verifier.user if service.options.agent_user == "run" else None
        return await grading.grade_shared(
            grading.SharedGrading(
                sandbox=as_user(self.sandbox, "0" if spec_user is not None else None),
                tests_user=verifier_user or ("0" if spec_user is not None else None),
                workdir=self.workdir,
                tests_dir=task.tests_dir,
                verifier_env=verifier_env,
                timeout_s=task.verifier.timeout_sec * service.options.verifier_timeout_multiplier,
                contract=service.options.reward,
                classifiers=service.options.verifier_classifiers,
                task=task,
                extra_metadata=extra,
            )
        )

    async def _grade_separate(self, extra: dict[str, Any]) -> Outcome:
        live = self._lease
        service = live.service
        opened = live.opened
        task = opened.task
        venv = task.verifier.environment
        try:
            env = {
                **service.options.env,
                **resolve_env(
                    venv.env if venv else {},
                    passed=service.options.pass_env,
                    what="[verifier.environment].env",
                ),
                **resolve_env(task.verifier.env, passed=service.options.pass_env, what="[verifier].env"),
            }
        except (UnsetVariable, VariableNotPassed) as exc:
            return Outcome.infra("verifier_setup", reason=str(exc), metadata=extra)
        vspec = dataclasses.replace(opened.verifier_spec, env=env)
        base = {"verifier_mode": "separate", **extra}
        # A task graded separately only by the service's choice was written for tests that see the agent's sandbox:
        # its workdir is what the agent made, and it replaces the image's workdir in the verifier (so a file the agent
        # deleted stays deleted). Its declared artifacts (often logs kept for the record) come too.
        workdir_is_artifact = not task.separate_verifier
        if live.collected is None:
            sandbox = as_user(self.sandbox, "0" if opened.spec.user is not None else None)
            try:
                await sandbox.kill_processes()
            except Exception as exc:
                return Outcome.infra(
                    grading.sandbox_failure(exc, "verifier_isolation"),
                    reason=f"killing the agents' processes failed: {exc}",
                    metadata=base,
                )
            try:
                problem = await grading.workdir_problem(sandbox, self.workdir)
            except Exception as exc:
                return Outcome.infra("verifier_setup", reason=str(exc), metadata=base)
            if problem is not None:
                meta = {**base, "verifier_cwd_error": f"{self.workdir}: {problem}"}
                return grading.platoon_zero(service.options.reward, "workdir_missing", meta)
            sources: list[tuple[str, str, tuple[str, ...]]] = [("/logs/artifacts", "/logs/artifacts", ())]
            if workdir_is_artifact:
                sources.append((self.workdir, vspec.workdir, ()))
            for artifact in task.artifacts:
                if artifact.source.startswith("/"):
                    sources.append((artifact.source, artifact.source, artifact.exclude))
                else:
                    sources.append(
                        (
                            posixpath.normpath(posixpath.join(self.workdir, artifact.source)),
                            posixpath.normpath(posixpath.join(vspec.workdir, artifact.source)),
                            artifact.exclude,
                        )
                    )
            root = Path(tempfile.mkdtemp(prefix="platoon-artifacts-"))
            try:
                live.collected = await grading.collect_artifacts(
                    sandbox, sources, service.options.max_artifact_bytes, root
                )
            except grading.GradeFailure as exc:
                shutil.rmtree(root, ignore_errors=True)
                return Outcome.infra(exc.kind, reason=str(exc), metadata=base)
            except Exception as exc:
                shutil.rmtree(root, ignore_errors=True)
                return Outcome.infra(
                    "verifier_artifacts", reason=f"{type(exc).__name__}: {exc}", metadata=base
                )
            if live.refs == 1 and live.gate.in_flight <= 1:  # only this grading holds main
                await live.release_main()
        return await grading.grade_separate(
            grading.SeparateGrading(
                start_verifier=lambda: self._start_verifier(vspec),
                tests_user=vspec.user,
                workdir=vspec.workdir,
                tests_dir=task.tests_dir,
                bundled_tests=opened.bundled_tests,
                verifier_env=env,
                timeout_s=service.verifier_timeout_s(task),
                contract=service.options.reward,
                collected=live.collected,
                fresh_workdir=workdir_is_artifact,
                classifiers=service.options.verifier_classifiers,
                task=task,
                extra_metadata=extra,
            )
        )

    async def _start_verifier(self, vspec: Any) -> Any:
        """The verifier's sandbox; with a verifier user, a view whose setup steps run as root."""
        sandbox = await self._lease.service.start_verifier(vspec)
        return as_user(sandbox, "0" if vspec.user is not None else None)

    # -- forks -----------------------------------------------------------------------------------------------------

    async def fork(
        self, mode: ForkMode | str = ForkMode.SHARED, *, task: Task | None = None
    ) -> HarborSession:
        """`shared` (the same sandbox), `copy` (a snapshot restored as a new sandbox) or `fresh` (a new session)."""
        mode = ForkMode(mode)
        live = self._lease
        if self._closed or live.closed:
            raise EnvSetupError("env_setup", f"{live.opened.label}: cannot fork a closed session")
        if live.main_released:
            raise EnvSetupError(
                "env_setup", f"{live.opened.label}: the session was graded and its sandbox released"
            )
        child_task = task or self._task
        if mode is ForkMode.FRESH:
            return await live.service.open(
                self._task, rollout_id=live.opened.rollout_id, needs=live.opened.needs, view_task=child_task
            )
        if mode is ForkMode.COPY:
            return await live.service.open_copy(self, child_task)
        live.refs += 1
        return HarborSession(live, child_task)


def _error(text: str, reason: str) -> ToolResult:
    result = ToolResult.text(text, is_error=True)
    result.metadata["error_reason"] = reason
    return result
