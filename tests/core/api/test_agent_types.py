"""The agent contract of `platoon.harness.agent`: types, helpers and the stdlib-only rule."""

from __future__ import annotations

import dataclasses
import json
import math
import subprocess
import sys
import textwrap

import pytest

from platoon.envs.service import Outcome, ToolSpec
from platoon.harness.agent import (
    CALL_KIND_HEADER,
    LIMIT_MESSAGE,
    AgentAPI,
    AgentContext,
    AgentResult,
    AgentStatus,
    Budget,
    CallKind,
    ChatReply,
    LaunchFailure,
    McpEndpoint,
    ModelEndpoint,
    SubagentResult,
    ToolAccess,
    out_of_steps,
    terminal_arguments,
    terminal_tool,
)


def test_agent_module_imports_only_the_standard_library() -> None:
    code = textwrap.dedent(
        """
        import sys
        import platoon.harness.agent as agent
        heavy = sorted(
            m for m in sys.modules
            if m.split(".")[0] in {"pydantic", "openreward", "torch", "transformers", "tinker", "yaml", "typer"}
            or m.startswith("platoon.config")
        )
        print(heavy)
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_limit_message_and_header_are_byte_exact() -> None:
    assert LIMIT_MESSAGE == (
        "WARNING: Exhausted budget when running episode. Halting episode; task may be incomplete."
    )
    assert CALL_KIND_HEADER == "X-Platoon-Call-Kind"


def test_enums_have_the_spec_values() -> None:
    assert [s.value for s in AgentStatus] == ["completed", "limit", "timeout", "cancelled", "error"]
    assert [k.value for k in CallKind] == ["policy", "aux", "judge"]
    assert [a.value for a in ToolAccess] == ["full", "no_terminal", "read_only"]
    assert AgentStatus.LIMIT == "limit" and str(ToolAccess.READ_ONLY) == "read_only"


def test_agent_result_status_is_first_positional_and_defaults_to_completed() -> None:
    assert AgentResult().status == "completed"
    limited = AgentResult("limit", error=LIMIT_MESSAGE)
    assert limited.status is AgentStatus.LIMIT
    assert limited.error == LIMIT_MESSAGE and limited.final_message is None
    assert AgentResult("error", "partial", "ValueError: x") == AgentResult(
        status="error", final_message="partial", error="ValueError: x"
    )


def test_agent_result_is_frozen_and_validates_its_status() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        AgentResult().status = "error"  # type: ignore[misc]
    with pytest.raises(ValueError, match="AgentResult status must be one of completed, limit, timeout"):
        AgentResult("done")


def test_chat_reply_properties() -> None:
    reply = ChatReply(
        call_id="c1",
        message={
            "role": "assistant",
            "content": "hello",
            "reasoning_content": "thinking",
            "tool_calls": [
                {"id": "t1", "type": "function", "function": {"name": "guess", "arguments": '{"n": 3}'}},
                {"id": "t2", "function": {"name": "finish", "arguments": {"answer": "x"}}},
                {"id": "t3", "name": "flat", "arguments": None},
            ],
        },
        finish_reason="tool_calls",
    )
    assert reply.text == "hello"
    assert reply.reasoning == "thinking"
    for call in reply.tool_calls:
        assert isinstance(json.loads(call["function"]["arguments"]), dict)
    assert reply.tool_calls == (
        {"id": "t1", "type": "function", "function": {"name": "guess", "arguments": '{"n": 3}'}},
        {"id": "t2", "type": "function", "function": {"name": "finish", "arguments": '{"answer": "x"}'}},
        {"id": "t3", "type": "function", "function": {"name": "flat", "arguments": "{}"}},
    )
    with pytest.raises(dataclasses.FrozenInstanceError):
        reply.call_id = "c2"  # type: ignore[misc]


def test_chat_reply_without_text_reasoning_or_calls() -> None:
    reply = ChatReply("c", {"role": "assistant", "content": [{"type": "text", "text": "x"}]}, "stop")
    assert reply.text == ""
    assert reply.reasoning is None
    assert reply.tool_calls == ()
    assert ChatReply("c", {"content": None, "tool_calls": None}).text == ""


def test_model_endpoint_hides_the_key_and_builds_headers() -> None:
    endpoint = ModelEndpoint("http://127.0.0.1:9/s/secret-abc/v1", "secret-abc", "qwen")
    assert "secret-abc/v1" in repr(endpoint)  # the URL is shown
    assert "api_key" not in repr(endpoint)
    assert endpoint.headers() == {"X-Platoon-Call-Kind": "policy"}
    assert endpoint.headers("judge") == {"X-Platoon-Call-Kind": "judge"}
    assert endpoint.headers(CallKind.AUX) == {"X-Platoon-Call-Kind": "aux"}
    assert type(endpoint.headers("aux")[CALL_KIND_HEADER]) is str
    with pytest.raises(ValueError, match="call kind must be one of policy, aux, judge"):
        endpoint.headers("train")


def test_mcp_endpoint_keeps_the_bearer_out_of_repr() -> None:
    mcp = McpEndpoint("http://gw/s/sek/mcp", {"Authorization": "Bearer sek"})
    assert mcp.headers["Authorization"] == "Bearer sek"
    assert "Bearer" not in repr(mcp)


def test_subagent_result_launched_and_ok() -> None:
    done = SubagentResult("a1", "t1", "craft", AgentResult(), Outcome("scored", {"reward": 1.0}), "made it")
    assert done.launched and done.ok
    limited = SubagentResult("a2", "t2", "craft", AgentResult("limit"), None, "")
    assert limited.launched and not limited.ok


def test_rejected_subagent_result_marks_a_launch_failure() -> None:
    msg = "Not enough budget to launch subagent for goal craft. ..."
    rejected = SubagentResult.rejected("craft", msg)
    assert rejected.agent_id == "" and rejected.trajectory_id == ""
    assert not rejected.launched and not rejected.ok
    assert rejected.result.status == "error"
    assert rejected.message == msg
    assert isinstance(rejected.message, LaunchFailure) and isinstance(rejected.message, str)
    assert not isinstance(SubagentResult("a", "t", "g", AgentResult()).message, LaunchFailure)


class _Budget:
    def __init__(self, remaining: float) -> None:
        self._remaining = remaining

    def remaining(self) -> float:
        return self._remaining

    def used(self) -> int:
        return 0


class _Ctx:
    def __init__(self, remaining: float = math.inf, max_steps: int | None = None) -> None:
        self.budget = _Budget(remaining)
        self.max_steps = max_steps


def test_out_of_steps() -> None:
    assert not out_of_steps(_Ctx(), 1000)  # type: ignore[arg-type]
    assert out_of_steps(_Ctx(remaining=0), 0)  # type: ignore[arg-type]
    assert out_of_steps(_Ctx(remaining=-1), 0)  # type: ignore[arg-type]
    assert not out_of_steps(_Ctx(max_steps=3), 2)  # type: ignore[arg-type]
    assert out_of_steps(_Ctx(max_steps=3), 3)  # type: ignore[arg-type]
    # 0 is an unbounded allocation, like None
    assert not out_of_steps(_Ctx(max_steps=0), 5)  # type: ignore[arg-type]


def test_terminal_tool_and_arguments() -> None:
    look = ToolSpec("look", "Look around.", {"type": "object", "properties": {}}, read_only=True)
    submit = ToolSpec(
        "submit", "Submit.", {"type": "object", "properties": {"answer": {}, "why": {}}}, terminal=True
    )
    other = ToolSpec("end", "End.", None, terminal=True)
    assert terminal_tool([look, submit, other]) is submit
    assert terminal_tool([look]) is None
    assert terminal_tool([]) is None
    assert terminal_arguments(submit, "42") == {"answer": "42"}
    assert terminal_arguments(look, "42") == {}
    assert terminal_arguments(other, "42") == {}


def test_protocols_are_runtime_checkable() -> None:
    assert isinstance(_Budget(1.0), Budget)
    assert not isinstance(object(), AgentContext)
    assert not isinstance(object(), AgentAPI)

    class _Agents:
        async def spawn(self, goal: str, **kwargs: object) -> SubagentResult:
            raise NotImplementedError

        def keep_children(self) -> None:
            pass

    assert isinstance(_Agents(), AgentAPI)


def test_agent_context_protocol_names_every_member() -> None:
    members = {
        "agent_id",
        "trajectory_id",
        "parent_agent_id",
        "depth",
        "role",
        "task",
        "session",
        "instruction",
        "max_steps",
        "access",
        "options",
        "endpoint",
        "mcp",
        "budget",
        "agents",
        "chat",
        "list_tools",
        "call_tool",
        "annotate",
        "annotate_step",
    }
    assert members <= set(dir(AgentContext))
    for name in members:
        assert getattr(AgentContext, name).__doc__, name
