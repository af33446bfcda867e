"""What the gateway records: the exact tokens of every model call, and each agent's ordered calls.

These records are the single source a rollout's trajectories are built from: training uses the
prompt and sampled tokens stored here, never a re-rendering.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from platoon.envs.service import Outcome
    from platoon.harness.agent import AgentResult
    from platoon.task import Task


@dataclass(frozen=True)
class Interaction:
    """The exact tokens of one sampled call: what training reads (keyed by call id in the rollout's map)."""

    call_id: str
    prompt_tokens: tuple[int, ...]
    sampled_tokens: tuple[int, ...]
    logprobs: tuple[float, ...]
    stop_reason: str  # "stop" or "length"
    routing_id: str | None = None
    #: the service's id of the sampled sequence (SDKs from 0.38): a datum names it to use its stability record
    sequence_id: str | None = None


@dataclass
class CallRecord:
    """One model call of one agent, in the order the agent made it."""

    call_id: str
    kind: str  # "policy", "aux" or "judge"
    model: str
    message: dict[str, Any]  # the assistant message: content, tool_calls, reasoning_content
    finish_reason: str  # "stop", "length" or "tool_calls"
    usage: dict[str, int]  # prompt_tokens, completion_tokens, total_tokens
    started: float  # perf_counter at the start and end of the call
    ended: float
    #: stop_reason, generated_tokens, parse_success, parsed/emitted/recovered/unparsed_tool_calls, finish_reason
    generation: dict[str, Any] = field(default_factory=dict)
    #: harness annotations (`ctx.annotate_step`): merged into the trajectory step's misc
    step_misc: dict[str, Any] = field(default_factory=dict)


@dataclass
class AgentRecord:
    """One agent of a rollout's tree, as the gateway knows it; the runtime fills result and outcome."""

    agent_id: str
    secret: str
    rollout_id: str
    trajectory_id: str
    role: str = "policy"
    parent: AgentRecord | None = None
    depth: int = 0
    fork_step: int | None = None  # the parent's call count when this agent was opened
    goal: str | None = None
    task: Task | None = None
    max_steps: int | None = None
    access: str = "full"
    calls: list[CallRecord] = field(default_factory=list)
    misc: dict[str, Any] = field(default_factory=dict)  # harness annotations and counters
    result: AgentResult | None = None
    outcome: Outcome | None = None  # the agent's own outcome, when it has one
    gateway_errors: int = 0
    context_overflows: int = 0
    closed: bool = False
    started: float | None = None
    ended: float | None = None

    @property
    def policy_calls(self) -> int:
        return sum(1 for call in self.calls if call.kind == "policy")

    def last_call(self) -> CallRecord | None:
        """The agent's last recorded policy or aux call (the "anchor" of a spawn)."""
        for call in reversed(self.calls):
            if call.kind != "judge":
                return call
        return None
