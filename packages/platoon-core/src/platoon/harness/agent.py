"""The agent contract: what a function harness receives (`AgentContext`) and returns (`AgentResult`).

Standard library only, so harness authors can import these types without training dependencies.
The episode runtime implements the protocols; the dataclasses and helpers here are complete as they stand.
"""

from __future__ import annotations

import enum
import json
from collections.abc import Callable, Coroutine, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:  # pragma: no cover - annotations only; importing these at runtime would break "stdlib only"
    from platoon.envs.service import EnvSession, ForkMode, Outcome, ToolResult, ToolSpec
    from platoon.task import Task

__all__ = [
    "CALL_KIND_HEADER",
    "FINAL_ANSWER_META_KEY",
    "LIMIT_MESSAGE",
    "AgentAPI",
    "AgentContext",
    "AgentFn",
    "AgentResult",
    "AgentStatus",
    "Budget",
    "CallKind",
    "ChatReply",
    "LaunchFailure",
    "McpEndpoint",
    "ModelEndpoint",
    "SubagentResult",
    "ToolAccess",
    "final_answer_tool",
    "out_of_steps",
    "terminal_arguments",
    "terminal_tool",
]

#: The fixed text of a run that ran out of steps; byte-identical because judges match its prefix.
LIMIT_MESSAGE = "WARNING: Exhausted budget when running episode. Halting episode; task may be incomplete."

#: The HTTP header that carries a call's kind to the gateway.
CALL_KIND_HEADER = "X-Platoon-Call-Kind"


class AgentStatus(enum.StrEnum):
    """How a harness run ended. `completed` says only that the harness finished: the environment grades."""

    COMPLETED = "completed"
    LIMIT = "limit"
    TIMEOUT = "timeout"
    CANCELLED = "cancelled"
    ERROR = "error"


class CallKind(enum.StrEnum):
    """The kind of a model call: `policy` (a budget step, trained), `aux` (trained, not counted), `judge` (never trained)."""

    POLICY = "policy"
    AUX = "aux"
    JUDGE = "judge"


class ToolAccess(enum.StrEnum):
    """Which environment tools an agent sees: all, all but terminal ones, or only read-only ones."""

    FULL = "full"
    NO_TERMINAL = "no_terminal"
    READ_ONLY = "read_only"


def _member[E: enum.StrEnum](enum_cls: type[E], value: str, what: str) -> E:
    """`enum_cls(value)` with a message that lists the accepted values (the stock one does not)."""
    try:
        return enum_cls(value)
    except ValueError:
        allowed = ", ".join(member.value for member in enum_cls)
        raise ValueError(f"{what} must be one of {allowed}; got {value!r}") from None


@dataclass(frozen=True)
class AgentResult:
    """What a harness returns: `AgentResult("limit", error=LIMIT_MESSAGE)`; the status is the first argument."""

    status: AgentStatus | str = AgentStatus.COMPLETED
    final_message: str | None = None
    error: str | None = None

    def __post_init__(self) -> None:
        # Normalise to the enum so `result.status is AgentStatus.LIMIT` holds; it still compares equal to "limit".
        object.__setattr__(self, "status", _member(AgentStatus, self.status, "AgentResult status"))


@runtime_checkable
class Budget(Protocol):
    """An agent's step budget as a harness sees it (advisory: the harness checks it before each model call)."""

    def remaining(self) -> float:
        """Steps left: `inf` when unbounded; steps reserved for running children are already subtracted."""
        ...

    def used(self) -> int:
        """Policy steps used; under linear budgets this counts the agent's descendants' steps too."""
        ...


@dataclass(frozen=True)
class ChatReply:
    """One model reply: `message` is the assistant message in Chat Completions form."""

    call_id: str
    message: Mapping[str, Any]
    finish_reason: str | None = None

    @property
    def text(self) -> str:
        """The message content when it is a string, else `""` (never None)."""
        content = self.message.get("content")
        return content if isinstance(content, str) else ""

    @property
    def reasoning(self) -> str | None:
        """The message's `reasoning_content`, or None."""
        reasoning = self.message.get("reasoning_content")
        return reasoning if reasoning else None

    @property
    def tool_calls(self) -> tuple[dict[str, Any], ...]:
        """OpenAI tool-call dicts (`id`, `type: function`, `function.name`, `function.arguments` as JSON text)."""
        calls = self.message.get("tool_calls") or ()
        return tuple(_openai_tool_call(call) for call in calls)


def _openai_tool_call(call: Any) -> dict[str, Any]:
    # Calls may arrive nested (OpenAI), flat ({name, arguments}) or with mapping arguments (the renderers' form);
    # harnesses get one shape so they can json.loads the arguments unconditionally.
    if not isinstance(call, Mapping):
        call = {
            "id": getattr(call, "id", None),
            "function": getattr(call, "function", None) or call,
        }
    function = call.get("function")
    if function is None:
        function = call
    if not isinstance(function, Mapping):
        function = {
            "name": getattr(function, "name", None),
            "arguments": getattr(function, "arguments", None),
        }
    arguments = function.get("arguments")
    if arguments is None:
        arguments = "{}"
    elif not isinstance(arguments, str):
        arguments = json.dumps(arguments)
    return {
        "id": call.get("id"),
        "type": "function",
        "function": {"name": function.get("name"), "arguments": arguments},
    }


@dataclass(frozen=True)
class ModelEndpoint:
    """An OpenAI-compatible endpoint scoped to one agent: `<gateway>/s/<agent secret>/v1`.

    `api_key` is the same secret and never appears in `repr`.
    """

    base_url: str
    api_key: str = field(repr=False)
    model: str

    def headers(self, kind: CallKind | str = CallKind.POLICY) -> dict[str, str]:
        """The extra request headers for a call of `kind`: `{"X-Platoon-Call-Kind": kind}`."""
        return {CALL_KIND_HEADER: _member(CallKind, kind, "call kind").value}


@dataclass(frozen=True)
class McpEndpoint:
    """The agent's environment tools over MCP (streamable HTTP): `<gateway>/s/<secret>/mcp` plus auth headers.

    `headers` carry the agent's secret (`Authorization: Bearer <secret>`), so they are kept out of `repr`.
    """

    url: str
    headers: Mapping[str, str] = field(default_factory=dict, repr=False)


class LaunchFailure(str):
    """The message of a subagent that was never launched (rejected budget, finished parent, failed fork, ...).

    A `str` subclass so it reads as the message while `isinstance(result.message, LaunchFailure)` tells it apart.
    """

    __slots__ = ()


@dataclass(frozen=True)
class SubagentResult:
    """What `ctx.agents.spawn(...)` returns; never raised, even when the launch failed.

    `agent_id` and `trajectory_id` are `""` for a rejected launch, whose `message` is a `LaunchFailure`.
    `outcome` is the child's own `Outcome`, or None when it shares the episode's.
    """

    agent_id: str
    trajectory_id: str
    goal: str
    result: AgentResult
    outcome: Outcome | None = None
    message: str = ""

    @property
    def launched(self) -> bool:
        """Whether a child agent was actually opened."""
        return bool(self.agent_id)

    @property
    def ok(self) -> bool:
        """Launched and finished with status `completed`."""
        return self.launched and self.result.status == AgentStatus.COMPLETED

    @classmethod
    def rejected(cls, goal: str, message: str) -> SubagentResult:
        """A failed launch: empty ids, status `error` carrying `message`, the message marked as a `LaunchFailure`."""
        failure = LaunchFailure(message)
        return cls(
            agent_id="",
            trajectory_id="",
            goal=goal,
            result=AgentResult(AgentStatus.ERROR, error=str(failure)),
            outcome=None,
            message=failure,
        )


@runtime_checkable
class AgentAPI(Protocol):
    """`ctx.agents`: launching subagents."""

    async def spawn(
        self,
        goal: str,
        *,
        harness: Any = None,
        max_steps: int | None = None,
        fork: ForkMode | str | None = None,
        access: ToolAccess | str | None = None,
        role: str = "subagent",
        options: Mapping[str, Any] | None = None,
        task_misc: Mapping[str, Any] | None = None,
    ) -> SubagentResult:
        """Run a child agent on `goal` and return its result; launch failures are returned, never raised.

        Defaults: the parent's harness and options, `agents.child_max_steps`, `agents.child_access` (never more
        than the parent's access), the fork mode from `fork`, else `agents.fork`, else the session's default.
        `harness` names a function harness (a TOML spec raises `TypeError`). A linear budget reserves
        `max_steps + 1` on the parent until the child returns. Concurrent spawns (`asyncio.gather`) are safe;
        cancelling the call cancels the child unless `keep_children()` was called.
        """
        ...

    def keep_children(self) -> None:
        """Let children keep running when their spawn call is cancelled; the parent waits for them at its end."""
        ...


@runtime_checkable
class AgentContext(Protocol):
    """What a function harness receives: `async def fn(ctx: AgentContext) -> AgentResult`."""

    @property
    def agent_id(self) -> str:
        """This agent's id."""
        ...

    @property
    def trajectory_id(self) -> str:
        """The trajectory this agent's calls are recorded on."""
        ...

    @property
    def parent_agent_id(self) -> str | None:
        """The spawning agent's id; None for the root."""
        ...

    @property
    def depth(self) -> int:
        """0 for the root, parent's depth + 1 for a child."""
        ...

    @property
    def role(self) -> str:
        """`policy` for the root; a child's spawn role (default `subagent`); `verifier` or `judge` for those agents."""
        ...

    @property
    def task(self) -> Task:
        """The task; a child's task is a fork of its parent's."""
        ...

    @property
    def session(self) -> EnvSession:
        """The environment session the agent acts on."""
        ...

    @property
    def instruction(self) -> str:
        """The goal text: the explicit goal, else the session's instruction, else the task goal, else `""`."""
        ...

    @property
    def max_steps(self) -> int | None:
        """The agent's step allocation; None (or 0) means unbounded."""
        ...

    @property
    def access(self) -> ToolAccess:
        """Which tools the agent sees: `full`, `no_terminal` or `read_only`."""
        ...

    @property
    def options(self) -> Mapping[str, Any]:
        """Read-only harness options (the entry's `harness_options` for the phase, or spawn's `options`), unchecked."""
        ...

    @property
    def endpoint(self) -> ModelEndpoint:
        """The agent-scoped OpenAI-compatible endpoint; raises when the rollout serves no HTTP."""
        ...

    @property
    def mcp(self) -> McpEndpoint | None:
        """The agent's tools over MCP; None when the rollout has no HTTP server."""
        ...

    @property
    def budget(self) -> Budget:
        """The agent's step budget."""
        ...

    @property
    def agents(self) -> AgentAPI:
        """Subagents: `spawn(...)` and `keep_children()`."""
        ...

    async def chat(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        tools: Sequence[Mapping[str, Any]] | None = None,
        kind: CallKind | str = CallKind.POLICY,
        **sampling: Any,
    ) -> ChatReply:
        """One model call, recorded on this agent.

        Messages and tools are Chat Completions shapes; extra keyword arguments are sampling parameters. The call
        takes the same render -> sample -> parse -> record path as HTTP calls, so a context-window overflow
        raises the same error and is counted on the agent.
        """
        ...

    async def list_tools(self) -> list[ToolSpec]:
        """The session's tools filtered by access (`no_terminal` hides terminal tools, `read_only` shows read-only ones)."""
        ...

    async def call_tool(self, name: str, arguments: Mapping[str, Any]) -> ToolResult:
        """Call an environment tool; a tool this agent cannot see returns an error result, unsent and unrecorded."""
        ...

    def annotate(self, **misc: Any) -> None:
        """Merge `misc` into this agent's trajectory misc."""
        ...

    def annotate_step(self, **misc: Any) -> None:
        """Merge `misc` into the step misc of the last recorded call; `RuntimeError` before any call.

        `exclude_from_training=True` keeps that call's tokens out of training while the step stays visible.
        """
        ...


#: A function harness: `async def fn(ctx: AgentContext) -> AgentResult` (a coroutine function, so the runtime
#: can run it as a task).
AgentFn = Callable[[AgentContext], Coroutine[Any, Any, AgentResult]]


def out_of_steps(ctx: AgentContext, steps_taken: int) -> bool:
    """True when the budget has nothing left, or `steps_taken` reached `ctx.max_steps` (when set and non-zero)."""
    if ctx.budget.remaining() <= 0:
        return True
    # max_steps of 0 means unbounded, so only a positive allocation caps the count here.
    return bool(ctx.max_steps) and steps_taken >= ctx.max_steps  # type: ignore[operator]


#: The tool meta key by which an environment marks the one tool it keeps from the model to receive the model's
#: final plain reply: the ORS SDK's `@terminal` tool (`{"arg": <the argument that receives the reply>}`).
FINAL_ANSWER_META_KEY = "openreward.dev/terminal-tool"


def terminal_tool(tools: Iterable[ToolSpec]) -> ToolSpec | None:
    """The first tool flagged terminal (one that may end the episode), or None.

    Terminal is not hidden: an environment may offer its terminal tools to the model (an ORS `exclusive` tool, a
    `submit` named in `platoon_terminal_tools`). The tool a harness hides is `final_answer_tool(tools)`.
    """
    return next((tool for tool in tools if getattr(tool, "terminal", False)), None)


def final_answer_tool(tools: Iterable[ToolSpec]) -> ToolSpec | None:
    """The tool the environment keeps from the model and hands the model's final plain reply to, or None.

    It is the ORS SDK's `@terminal` tool (its meta carries `FINAL_ANSWER_META_KEY`). A harness leaves it out of
    the tools it offers and, when the model answers without a tool call, calls it with
    `terminal_arguments(tool, reply)`; every other tool, terminal or not, stays offered to the model.
    """
    for tool in tools:
        meta = getattr(tool, "meta", None)
        if isinstance(meta, Mapping) and FINAL_ANSWER_META_KEY in meta:
            return tool
    return None


def terminal_arguments(tool: ToolSpec, message: str) -> dict[str, Any]:
    """`{<argument>: message}` for a tool that receives a plain reply, or `{}` when its schema has no properties.

    The argument is the one the tool's final-answer meta names (`FINAL_ANSWER_META_KEY`), else the first property
    of its input schema.
    """
    meta = getattr(tool, "meta", None)
    descriptor = meta.get(FINAL_ANSWER_META_KEY) if isinstance(meta, Mapping) else None
    if isinstance(descriptor, Mapping) and isinstance(descriptor.get("arg"), str):
        return {descriptor["arg"]: message}
    schema = getattr(tool, "input_schema", None)
    properties = schema.get("properties") if isinstance(schema, Mapping) else None
    if not properties:
        return {}
    return {next(iter(properties)): message}
