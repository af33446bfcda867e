"""The session base of ORS services, in process and remote: the lease (one live environment session with its
accounting, event log, refusals and grading, shared by every view forked `shared`) and the view a harness holds.

`SharedLease` and `SessionView`, a reference-counted backend closed in a shielded task and a view that releases it,
are what Harbor's sandbox sessions share with these. Each service's own part (how a call runs, how the session
ends, how it forks) lives in its subclasses.
"""

from __future__ import annotations

import collections
import logging
import math
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Protocol

# SharedLease and SessionView live beside the gate (Harbor's sessions build on them too); named here as before
from platoon.envs.gate import EnvBusy, Gate, GateClosed, SessionView, SharedLease
from platoon.envs.ors import bridge
from platoon.envs.service import EnvSetupError, ForkMode, Outcome, ToolResult, ToolSpec
from platoon.task import Task

__all__ = [
    "TOOL_ERROR_KEY",
    "OrsLease",
    "OrsSession",
    "SessionView",
    "SharedLease",
    "as_number",
    "error_result",
]

# The messages below kept the logger they had before this base moved out of `inprocess` (a filter may name it).
log = logging.getLogger("platoon.envs.ors.inprocess")

TOOL_ERROR_KEY = "openhands.dev/tool-error"


def as_number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value)


def error_result(text: str, code: str, **metadata: Any) -> ToolResult:
    result = ToolResult.text(text, is_error=True)
    result.metadata = {"error": code, **metadata}
    return result


def counted(failures: list[str]) -> str:
    """The distinct failures in order, a repeated one once with its count (an agent may retry a crashing tool)."""
    counts = collections.Counter(failures)  # first-seen order
    return "; ".join(f"{text} ({n} times)" if n > 1 else text for text, n in counts.items())


# -- ORS sessions ----------------------------------------------------------------------------------------------------


class LeaseService(Protocol):
    """What a lease reads of its service (the in-process and the remote ORS services)."""

    @property
    def name(self) -> str: ...
    @property
    def log_dir(self) -> Any: ...
    @property
    def bridge_tools(self) -> bool: ...
    @property
    def max_tool_calls(self) -> int: ...
    @property
    def queue_timeout_s(self) -> float | None: ...
    @property
    def close_timeout_s(self) -> float: ...
    def learn_terminal(self, name: str) -> None: ...


class OrsLease(SharedLease):
    """One live ORS environment session and its accounting, the same in process and on a server.

    A subclass runs the admitted call (`_run_call`), names the tools' hints (`table`) and ends the session
    (`_end_session`).
    """

    service: LeaseService

    def __init__(self, service: Any, env: Any, gate: Gate, label: str) -> None:
        super().__init__(gate, label)
        self.service = service
        #: the environment instance in process, the SDK's session remotely
        self.env = env
        self.finished = False
        self.terminal: ToolResult | None = None
        self.cap_hit = False
        self.last_reward: float | None = None
        self.turns = 0
        self.infra: list[str] = []
        self.tool_errors: list[str] = []
        self.tools: list[ToolSpec] | None = None
        self.ending_in_flight = 0
        #: the event log (`log_dir`) this lease writes under `session_id`, None without one
        self.bridge: bridge.BridgeLog | None = None
        self.session_id = ""

    @property
    def table(self) -> Any:
        """The tools' hints (`platoon.envs.ors.inprocess.ToolTable`)."""
        raise NotImplementedError

    def may_end(self, name: str) -> bool:
        declared = self.table.declared_terminal
        return name in declared if declared else True

    def tool_kind(self, name: str) -> str:
        return "terminal tool" if name in self.table.declared_terminal else "tool"

    def copy_accounting(self, other: OrsLease) -> None:
        self.finished, self.terminal, self.cap_hit = other.finished, other.terminal, other.cap_hit
        self.last_reward, self.turns = other.last_reward, other.turns
        self.infra, self.tool_errors = list(other.infra), list(other.tool_errors)
        self.tools = other.tools

    # -- the event log ------------------------------------------------------------------------

    def start_bridge(
        self, rollout_id: str, task: Task, instruction: str | None, *, sid: str | None = None, **about: Any
    ) -> None:
        """Open the rollout's event log (with `log_dir`) and record the session's start and its task."""
        self.session_id = sid or bridge.session_id()
        log_dir = self.service.log_dir
        if log_dir is None:
            return
        try:
            self.bridge = bridge.open_bridge_log(log_dir, rollout_id)
        except OSError as exc:  # the log is an aid: an unwritable directory must not fail the episode
            log.warning("%s: no bridge event log under %s: %s", self.label, log_dir, exc)
            return
        self.note(
            "session_started",
            {"service": self.service.name, "label": self.label, "task_id": task.id, "rollout_id": rollout_id}
            | about,
        )
        self.note("task_requested", {"via": "open", "task_id": task.id, "prompt": instruction})
        self.save_state()

    def note(self, kind: str, payload: Mapping[str, Any], turn: int | None = None) -> None:
        if self.bridge is not None:
            self.bridge.event(kind, self.session_id, self.turns if turn is None else turn, payload)

    def status(self) -> dict[str, Any]:
        cap = self.service.max_tool_calls
        return {
            "turn": self.turns,
            "finished": self.finished,
            "last_reward": self.last_reward,
            "max_tool_calls": cap,
            "tool_calls_left": max(cap - self.turns, 0) if cap else None,
            "cap_hit": self.cap_hit,
            "closed": self.closed,
        }

    def save_state(self) -> None:
        if self.bridge is not None:
            self.bridge.state(self.session_id, self.status())

    def not_run(self, name: str, result: ToolResult) -> ToolResult:
        """Log a refused call (`tool_not_run`, or `max_tool_calls_exceeded`) and hand its result back."""
        if self.bridge is not None:
            code = result.metadata.get("error")
            kind = "max_tool_calls_exceeded" if code == "max_tool_calls_exceeded" else "tool_not_run"
            self.note(kind, {"name": name, "code": code, "text": result.as_text()})
            self.save_state()
        return result

    # -- calls -------------------------------------------------------------------------------------------------

    def refusal(self) -> ToolResult | None:
        """Why a call may not run now (not counted), or None."""
        if self.closed:
            return error_result("Not run: the environment session is closed.", "session_closed")
        if self.finished:
            return error_result(
                "Not run: the episode has already finished; no further tool calls are accepted.",
                "environment_already_finished",
            )
        cap = self.service.max_tool_calls
        if cap and self.turns >= cap:
            self.finished = True
            self.cap_hit = True
            return error_result(
                f"Not run: the limit of {cap} tool calls is reached; the episode is over.",
                "max_tool_calls_exceeded",
            )
        return None

    async def execute(self, name: str, arguments: dict[str, Any]) -> ToolResult:
        """Run an admitted call (`_execute`), logging it."""
        # Refusals are checked again once admitted: the call we queued behind may have ended the episode.
        refused = self.refusal()
        if refused is not None:
            return self.not_run(name, refused)
        turn = self.turns + 1  # `_execute` counts it before its first await
        self.note("tool_call", {"name": name, "arguments": arguments}, turn)
        result = await self._execute(name, arguments)
        if self.bridge is not None:
            kind = "tool_error" if result.is_error else "tool_result"
            self.note(kind, bridge.result_payload(name, result), turn)
            self.save_state()
        return result

    async def _execute(self, name: str, arguments: dict[str, Any]) -> ToolResult:
        refused = self.refusal()
        if refused is not None:
            return refused
        self.turns += 1
        ending = self.may_end(name)
        self.ending_in_flight += ending
        try:
            return await self._run_call(name, arguments, ending)
        finally:
            self.ending_in_flight -= ending

    async def _run_call(self, name: str, arguments: dict[str, Any], ending: bool) -> ToolResult:
        """Run the counted call on the environment; `ending`: it may end the episode."""
        raise NotImplementedError

    def tool_raised(self, name: str, what: str, ending: bool, *, infra: str) -> ToolResult:
        """The result of a tool that raised: `infra` when it may end the episode, else the policy's error."""
        if ending:
            # A crashed submit must never score 0: the measurement failed, not the policy. Without a declared
            # terminal tool any tool may be the submit, so the failure decides, not a declaration.
            self.infra.append(infra)
            return error_result(f"Tool {name!r} failed in the environment ({what}).", "env_error")
        self.tool_errors.append(f"{name}: {what}")
        return error_result(f"Tool {name!r} raised {what}", "tool_raised")

    def landed(
        self, name: str, blocks: list[dict[str, Any]], metadata: dict[str, Any], finished: Any, reward: Any
    ) -> ToolResult:
        """The result of a call the environment answered, counted: its reward, and whether it ended the episode."""
        result = ToolResult(
            blocks,
            is_error=bool(metadata.get(TOOL_ERROR_KEY)),
            finished=bool(finished),
            reward=reward,
            metadata=metadata,
        )
        number = as_number(reward)
        if number is not None:
            self.last_reward = number
        if result.finished and not self.finished:
            self.finished = True
            self.terminal = result
            if not self.table.declares_terminal:
                self.service.learn_terminal(name)
        return result

    # -- grading -----------------------------------------------------------------------------------------------

    def _grader(self) -> Callable[[], Awaitable[Outcome]] | None:
        """The environment's own grading, run in an exclusive turn; None: the calls decide."""
        return None

    async def grade(self, caller: Any) -> Outcome:
        decided = self._decided()
        if decided is not None:
            return decided
        grader = self._grader()
        if grader is not None:
            try:
                return await self.gate.run(grader, "exclusive", caller=caller, what="grade")
            except EnvBusy as exc:
                return Outcome.infra("env_busy", reason=str(exc))
            except GateClosed:
                return Outcome.infra("env_error", reason="the session closed before it was graded")
        # Without a hook, let calls in flight land first: one of them may be the submit.
        await self.gate.drain(self.service.queue_timeout_s)
        decided = self._decided()
        if decided is not None:
            return decided
        if self.ending_in_flight:
            return Outcome.infra("env_busy", reason="a call that may end the episode is still running")
        return self._fallback()

    def _decided(self) -> Outcome | None:
        if self.terminal is not None:
            result = self.terminal
            if result.metadata.get("invalid"):
                return Outcome.infra(
                    "env_invalid", status="invalid", reason="the environment marked the grade invalid"
                )
            reward = as_number(result.reward)
            if reward is None:
                return Outcome.infra(
                    "no_reward", status="invalid", reason="the finishing result has no numeric reward"
                )
            return Outcome("scored", {"reward": reward})
        cap = self.service.max_tool_calls
        if self.cap_hit or (cap and self.turns >= cap):
            if self.last_reward is None:
                return Outcome(
                    "scored", {"reward": 0.0}, reason="max_tool_calls", metadata={"platoon_zero": True}
                )
            return Outcome("scored", {"reward": self.last_reward}, reason="max_tool_calls")
        return None

    def _fallback(self) -> Outcome:
        if self.infra:
            return Outcome.infra("env_error", reason=counted(self.infra))
        metadata: dict[str, Any] = {"platoon_zero": True}
        if self.tool_errors:
            metadata["tool_errors"] = list(self.tool_errors)
        return Outcome("scored", {"reward": 0.0}, reason="no_submit", metadata=metadata)

    # -- closing -----------------------------------------------------------------------------------------------

    async def _close(self) -> None:
        self.note("session_closing", {"tool_errors": len(self.tool_errors), "infra": list(self.infra)})
        try:
            await self._end_session()
        finally:
            if self.bridge is not None:
                self.save_state()
                self.bridge.release()
                self.bridge = None

    async def _end_session(self) -> None:
        """Drain the calls and end the session where it lives (teardown in process, delete on a server)."""
        raise NotImplementedError


class OrsSession(SessionView):
    """A view of a live ORS session: tools, calls through the gate, grading, forks.

    A subclass lists the environment's own tools (`_env_tools`) and makes `fresh` and `copy` forks.
    """

    sandbox = None
    _lease: OrsLease

    def __init__(
        self,
        lease: OrsLease,
        task: Task,
        instruction: str | None,
        prompt_blocks: list[dict[str, Any]],
        rollout_id: str,
    ) -> None:
        super().__init__(lease, task)
        self._instruction = instruction
        #: the prompt's content blocks (text and images), for multimodal harnesses
        self.prompt_blocks = prompt_blocks
        self._rollout_id = rollout_id

    @property
    def instruction(self) -> str | None:
        return self._instruction

    @property
    def env(self) -> Any:
        """The live `Environment` instance (for tests and debugging; calls should go through `call_tool`)."""
        return self._lease.env

    @property
    def finished(self) -> bool:
        return self._lease.finished

    async def tools(self) -> list[ToolSpec]:
        """Every tool, the SDK's `@terminal` one included (harnesses keep that one from the model, not here), and
        the read-only bridge tools with `bridge_tools: true`."""
        listed = await self._env_tools()
        if not self._lease.service.bridge_tools:
            return listed
        return listed + bridge.bridge_tool_specs([t.name for t in listed])

    async def _env_tools(self) -> list[ToolSpec]:
        raise NotImplementedError

    async def call_tool(
        self, name: str, arguments: Mapping[str, Any], *, on_behalf_of: str | None = None
    ) -> ToolResult:
        """Run a tool; refusals, bad calls and tool failures come back as error results."""
        lease = self._lease
        if not isinstance(arguments, Mapping) or not all(isinstance(k, str) for k in arguments):
            return lease.not_run(
                name,
                error_result(
                    f"Invalid arguments: give a JSON object with string keys; got {type(arguments).__name__}.",
                    "invalid_arguments",
                ),
            )
        if self._closed:
            return lease.not_run(
                name, error_result("Not run: this session view is closed.", "session_closed")
            )
        if name in bridge.BRIDGE_TOOLS and lease.service.bridge_tools:
            listed = await self._env_tools()
            if name not in {t.name for t in listed}:  # the environment's own tool of that name wins
                return self._bridge_tool(name, listed)
        refused = lease.refusal()
        if refused is not None:
            return lease.not_run(name, refused)
        args = dict(arguments)
        try:
            return await lease.gate.run(
                lambda: lease.execute(name, args),
                lease.table.op_class(name),
                caller=on_behalf_of if on_behalf_of is not None else self,
                what=f"tool call {name!r}",
            )
        except EnvBusy as exc:
            log.info("%s: %s", lease.label, exc)
            return lease.not_run(
                name,
                error_result(f"Not run: env busy ({exc}). This call does not count; try again.", "env_busy"),
            )
        except GateClosed:
            return lease.not_run(
                name, error_result("Not run: the environment session is closed.", "session_closed")
            )

    def _bridge_tool(self, name: str, listed: list[ToolSpec]) -> ToolResult:
        """`get_task` / `get_status`: answered from platoon's state, never the environment's; not counted."""
        lease = self._lease
        if name == "get_status":
            return bridge.answer({"session": lease.session_id, **lease.status()})
        lease.note("task_requested", {"via": "get_task", "task_id": self._task.id})
        tools = listed + bridge.bridge_tool_specs([t.name for t in listed])
        return bridge.answer(
            {
                "task_id": self._task.id,
                "prompt": self._instruction,
                "tools": [t.as_openai_tool() for t in tools],
                "completion_policy": bridge.completion_policy(listed),
            }
        )

    async def grade(self) -> Outcome:
        """The outcome, failing closed; never raises."""
        try:
            return await self._lease.grade(self)
        except Exception as exc:  # grading must report, never raise
            return Outcome.infra("env_error", reason=f"grading raised {type(exc).__name__}: {exc}")

    async def fork(self, mode: ForkMode | str = ForkMode.SHARED, *, task: Task | None = None) -> OrsSession:
        """A session for a child: `shared` (same live state), `copy` (a snapshot) or `fresh` (a new session)."""
        mode = ForkMode(mode)
        lease = self._lease
        if lease.closed or self._closed:
            raise EnvSetupError("env_setup", f"{lease.label}: cannot fork a closed session")
        if mode is ForkMode.FRESH:
            return await self._fork_fresh(task or self._task)
        if mode is ForkMode.COPY:
            return await self._copy(task)
        return await self._fork_shared(task)

    async def _fork_fresh(self, task: Task) -> OrsSession:
        raise NotImplementedError

    async def _copy(self, task: Task | None) -> OrsSession:
        raise NotImplementedError

    async def _fork_shared(self, task: Task | None) -> OrsSession:
        self._lease.refs += 1
        return type(self)(
            self._lease, task or self._task, self._instruction, self.prompt_blocks, self._rollout_id
        )
