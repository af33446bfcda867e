"""The gateway core: refusals, sampling precedence, rendering, the context window, sampling, parsing, recording."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from typing import Any

import pytest

from platoon.gateway import (
    AgentClosed,
    ContextWindowExceeded,
    GatewayError,
    ModelGateway,
    PermissionDenied,
    SampleTimeout,
    resolve_sample_timeout,
)
from platoon.gateway.core import CALL_ID_PREFIX, AuthenticationFailed, SamplingFailed
from platoon.harness.agent import ChatReply

from .conftest import EOS, CharTokenizer, FakeRenderer, FakeSampler, Reply

USER = [{"role": "user", "content": "hi"}]


def chat(
    gateway: ModelGateway, agent: Any, messages: list[dict[str, Any]] = USER, **kwargs: Any
) -> ChatReply:
    return asyncio.run(gateway.chat(agent, messages, **kwargs))


def open_root(gateway: ModelGateway, **rollout: Any) -> Any:
    recorder = gateway.open_rollout(**rollout)
    return recorder, gateway.open_agent(recorder, goal="find it")


# ---- recording ----------------------------------------------------------------------------------------------


def test_a_call_records_the_exact_prompt_sampled_tokens_and_logprobs(make_gateway, sampler, renderer):
    gateway = make_gateway()
    sampler.script = [Reply("hello", routing_id="r-7")]
    rollout, agent = open_root(gateway)
    reply = chat(gateway, agent)

    assert isinstance(reply, ChatReply)
    assert reply.call_id.startswith(CALL_ID_PREFIX)
    assert reply.text == "hello" and reply.finish_reason == "stop" and reply.tool_calls == ()
    assert reply.message == {
        "role": "assistant",
        "content": "hello",
        "tool_calls": None,
        "reasoning_content": None,
    }

    prompt = CharTokenizer().encode("user:hi\nassistant:")
    interaction = rollout.interactions[reply.call_id]
    assert interaction.prompt_tokens == tuple(prompt) == tuple(sampler.requests[0]["prompt"])
    assert interaction.sampled_tokens == (*CharTokenizer().encode("hello"), EOS)
    assert interaction.logprobs == (-0.5,) * 6
    assert interaction.stop_reason == "stop" and interaction.routing_id == "r-7"

    (call,) = agent.calls
    assert call.call_id == reply.call_id and call.kind == "policy" and call.model == "fake/model"
    assert call.message == reply.message and call.message is not reply.message
    assert call.finish_reason == "stop"
    assert call.usage == {
        "prompt_tokens": len(prompt),
        "completion_tokens": 6,
        "total_tokens": len(prompt) + 6,
    }
    assert call.started <= call.ended
    assert call.generation == {
        "stop_reason": "stop",
        "generated_tokens": 6,
        "parse_success": True,
        "parsed_tool_calls": 0,
        "emitted_tool_calls": 0,
        "recovered_tool_calls": 0,
        "unparsed_tool_calls": 0,
        "finish_reason": "stop",
        "history": {"extends": None, "reused_tokens": 0, "segment": "first_call"},
    }
    assert agent.policy_calls == 1 and agent.last_call() is call


def test_calls_are_recorded_in_order_with_their_kinds(make_gateway, sampler):
    gateway = make_gateway()
    sampler.script = ["a", "b", "c"]
    rollout, agent = open_root(gateway)
    ids = [chat(gateway, agent, kind=kind).call_id for kind in ("policy", "aux", "judge")]
    assert [call.call_id for call in agent.calls] == ids == list(rollout.interactions)
    assert [call.kind for call in agent.calls] == ["policy", "aux", "judge"]
    assert agent.policy_calls == 1 and agent.last_call() is agent.calls[1]  # the anchor skips judge calls


def test_reasoning_and_tools_reach_the_renderer_and_the_reply(make_gateway, sampler, renderer):
    gateway = make_gateway()
    sampler.script = ["THINK:hmm|answer", "THINK:|plain"]
    _, agent = open_root(gateway)
    tools = [{"type": "function", "function": {"name": "search", "parameters": {}}}]
    reply = chat(gateway, agent, tools=tools)
    assert reply.reasoning == "hmm" and reply.text == "answer"
    assert renderer.render_calls[0]["tools"] == tools
    assert sampler.requests[0]["prompt"][: len("tools:search")] == CharTokenizer().encode("tools:search")
    assert chat(gateway, agent).message["reasoning_content"] is None  # empty reasoning -> None


# ---- tool calls and finish reasons -------------------------------------------------------------------------


CALL = 'CALL {"name": "search", "arguments": {"q": "x"}}'


def test_tool_calls_are_emitted_with_ids_when_a_stop_token_was_sampled(make_gateway, sampler):
    gateway = make_gateway()
    sampler.script = [f"looking\n{CALL}"]
    _, agent = open_root(gateway)
    reply = chat(gateway, agent)
    assert reply.finish_reason == "tool_calls" and reply.text == "looking"
    (tool_call,) = reply.tool_calls
    assert tool_call["type"] == "function" and tool_call["id"].startswith("call_")
    assert tool_call["function"]["name"] == "search"
    assert json.loads(tool_call["function"]["arguments"]) == {"q": "x"}
    assert agent.calls[0].generation["parsed_tool_calls"] == 1
    assert agent.calls[0].generation["emitted_tool_calls"] == 1


def test_truncated_responses_never_run_tools(make_gateway, sampler):
    # The fake renderer emits every parsed call: the gateway enforces the rule whatever the renderer does.
    gateway = make_gateway()
    sampler.script = [
        Reply(CALL, stop_reason="length"),  # cut off by the completion budget
        Reply(CALL, stop_reason="stop", eos=False),  # stopped without the end-of-turn token
        Reply(CALL, stop_reason="length", eos=True),  # a stop token, but the budget ran out
    ]
    _, agent = open_root(gateway)
    assert [chat(gateway, agent).finish_reason for _ in range(3)] == ["length", "stop", "length"]
    for call in agent.calls:
        assert call.message["tool_calls"] is None
        assert call.generation["parsed_tool_calls"] == 1 and call.generation["emitted_tool_calls"] == 0
        # what the model wrote stays visible
        assert json.loads(call.message["content"]) == {"name": "search", "arguments": '{"q": "x"}'}


def test_unparsed_tool_blocks_are_counted(make_gateway, sampler):
    gateway = make_gateway()
    sampler.script = ["text\nCALL {broken"]
    _, agent = open_root(gateway)
    reply = chat(gateway, agent)
    assert reply.finish_reason == "stop" and reply.tool_calls == ()
    assert reply.text == "text\nCALL {broken"
    generation = agent.calls[0].generation
    assert generation["unparsed_tool_calls"] == 1 and generation["parse_success"] is False


def test_a_caller_stop_list_replaces_the_renderer_stops(make_gateway, sampler):
    gateway = make_gateway()
    sampler.script = [Reply("ab", eos=False), "cd", Reply(CALL, eos=False), Reply(CALL + "\n\xff", eos=False)]
    _, agent = open_root(gateway)
    chat(gateway, agent, stop="END")
    chat(gateway, agent)
    by_string = chat(gateway, agent, stop=["END"])
    by_token = chat(gateway, agent, stop=[255])
    stops = [request["params"].stop for request in sampler.requests]
    assert stops == [["END"], [EOS], ["END"], [255]]
    # a stop string is not a stop token: the calls are not run; a caller's stop token ends the turn
    assert by_string.finish_reason == "stop" and by_string.tool_calls == ()
    assert by_token.finish_reason == "tool_calls" and len(by_token.tool_calls) == 1


# ---- sampling precedence -----------------------------------------------------------------------------------


def params(sampler: FakeSampler, index: int = -1) -> dict[str, Any]:
    p = sampler.requests[index]["params"]
    return {
        "max_tokens": p.max_tokens,
        "temperature": p.temperature,
        "top_k": p.top_k,
        "top_p": p.top_p,
        "seed": p.seed,
    }


def test_sampling_defaults_then_agent_defaults_then_the_request(make_gateway, sampler):
    gateway = make_gateway(max_tokens=100, temperature=0.7, top_k=20, top_p=0.9, seed=3)
    sampler.script = lambda prompt: "ok"
    rollout = gateway.open_rollout()
    root = gateway.open_agent(rollout, sampling={"temperature": 0.5, "max_tokens": 50})
    chat(gateway, root)
    assert params(sampler) == {"max_tokens": 50, "temperature": 0.5, "top_k": 20, "top_p": 0.9, "seed": 3}
    chat(gateway, root, temperature=0.1, top_p=0.5, top_k=5, seed=9, max_completion_tokens=7, max_tokens=8)
    assert params(sampler) == {"max_tokens": 7, "temperature": 0.1, "top_k": 5, "top_p": 0.5, "seed": 9}
    chat(gateway, root, max_tokens=8, temperature=None)  # None means "not given"
    assert params(sampler)["max_tokens"] == 8 and params(sampler)["temperature"] == 0.5
    child = gateway.open_agent(rollout, parent=root)  # children inherit the sampling defaults
    chat(gateway, child)
    assert params(sampler) == {"max_tokens": 50, "temperature": 0.5, "top_k": 20, "top_p": 0.9, "seed": 3}


def test_config_precedence_overrides_policy_calls_only(make_gateway, sampler):
    gateway = make_gateway(max_tokens=100, temperature=0.7, top_k=20, top_p=0.9)
    sampler.script = lambda prompt: "ok"
    config = {"temperature": 0.2, "top_p": None, "max_completion_tokens": 30}
    _, agent = open_root(gateway, sampling_precedence="config", config_sampling=config)
    chat(gateway, agent, temperature=1.5, top_p=0.3, top_k=4, seed=11, max_tokens=9, stop=["X"])
    # the config's temperature, the gateway's top_p/top_k for unset ones, the config's budget; own seed and stop
    assert params(sampler) == {"max_tokens": 30, "temperature": 0.2, "top_k": 20, "top_p": 0.9, "seed": 11}
    assert sampler.requests[-1]["params"].stop == ["X"]
    for kind in ("aux", "judge"):
        chat(gateway, agent, kind=kind, temperature=1.5, top_p=0.3, top_k=4, max_tokens=9)
        assert params(sampler) == {
            "max_tokens": 9,
            "temperature": 1.5,
            "top_k": 4,
            "top_p": 0.3,
            "seed": None,
        }


def test_config_precedence_without_a_budget_keeps_the_calls_own(make_gateway, sampler):
    gateway = make_gateway(max_tokens=100)
    sampler.script = lambda prompt: "ok"
    _, agent = open_root(gateway, sampling_precedence="config", config_sampling={})
    chat(gateway, agent, max_tokens=9, temperature=0.1)
    assert params(sampler)["max_tokens"] == 9 and params(sampler)["temperature"] == 1.0


@pytest.mark.parametrize(
    "bad",
    [
        {"temperature": 3},
        {"top_p": 1.5},
        {"max_tokens": -1},
        {"top_k": "5"},
        {"n": 2},
        {"stop": [1.5]},
        {"frobnicate": 1},
    ],
)
def test_bad_sampling_parameters_are_invalid_requests(make_gateway, sampler, bad):
    gateway = make_gateway()
    _, agent = open_root(gateway)
    with pytest.raises(GatewayError) as err:
        chat(gateway, agent, **bad)
    assert err.value.status == 400 and err.value.kind == "invalid_request_error"
    assert sampler.requests == [] and agent.calls == []


def test_transport_only_parameters_are_accepted(make_gateway, sampler):
    gateway = make_gateway()
    sampler.script = ["ok"]
    _, agent = open_root(gateway)
    chat(gateway, agent, n=1, tool_choice="auto", stream=False, logprobs=True)
    assert len(agent.calls) == 1


def test_render_kwargs_from_chat_template_kwargs_and_reasoning_effort(make_gateway, sampler, renderer):
    gateway = make_gateway()
    sampler.script = lambda prompt: "ok"
    _, agent = open_root(gateway)
    chat(gateway, agent, chat_template_kwargs={"enable_thinking": False, "unknown_flag": 1})
    chat(gateway, agent, reasoning_effort="none")
    chat(gateway, agent, extra_body={"chat_template_kwargs": {"enable_thinking": False}})
    chat(
        gateway,
        agent,
        chat_template_kwargs={"enable_thinking": True},
        extra_body={"chat_template_kwargs": {"enable_thinking": False}},
    )
    chat(gateway, agent, reasoning_effort="high")
    assert [c["enable_thinking"] for c in renderer.render_calls] == [False, False, False, True, True]
    assert CharTokenizer().decode(sampler.requests[0]["prompt"]).endswith("assistant:/nothink")


# ---- the context window ------------------------------------------------------------------------------------


def test_the_completion_budget_is_fitted_to_the_context_window(make_gateway, sampler):
    prompt_len = len("user:hi\nassistant:")
    gateway = make_gateway(max_tokens=100, context_window_length=prompt_len + 10)
    sampler.script = lambda prompt: "ok"
    _, agent = open_root(gateway)
    chat(gateway, agent)
    assert params(sampler)["max_tokens"] == 10
    chat(gateway, agent, max_tokens=4)
    assert params(sampler)["max_tokens"] == 4


@pytest.mark.parametrize("spare", [0, -5])
def test_a_prompt_that_fills_the_window_is_a_context_window_error(make_gateway, sampler, spare):
    prompt_len = len("user:hi\nassistant:")
    gateway = make_gateway(context_window_length=prompt_len + spare)
    _, agent = open_root(gateway)
    with pytest.raises(ContextWindowExceeded) as err:
        chat(gateway, agent)
    assert err.value.status == 400 and err.value.code == "context_length_exceeded"
    assert err.value.prompt_tokens == prompt_len and err.value.window == prompt_len + spare
    assert f"maximum context length is {prompt_len + spare} tokens" in str(err.value)
    assert f"resulted in {prompt_len} tokens" in str(err.value)
    assert agent.context_overflows == 1 and agent.calls == [] and sampler.requests == []


# ---- refusals ---------------------------------------------------------------------------------------------


def test_an_unknown_kind_is_refused(make_gateway, sampler):
    gateway = make_gateway()
    _, agent = open_root(gateway)
    with pytest.raises(GatewayError) as err:
        chat(gateway, agent, kind="oracle")
    assert err.value.status == 400 and sampler.requests == []


def test_judge_calls_are_refused_and_counted_when_judges_are_off(make_gateway, sampler):
    gateway = make_gateway()
    sampler.script = ["ok", "fine"]
    _, agent = open_root(gateway, judges=False)
    for _ in range(2):
        with pytest.raises(PermissionDenied) as err:
            chat(gateway, agent, kind="judge")
        assert err.value.status == 403 and err.value.kind == "permission_error"
    assert agent.misc["judges_refused"] == 2 and sampler.requests == []
    chat(gateway, agent)
    chat(gateway, agent, kind="aux")
    assert [call.kind for call in agent.calls] == ["policy", "aux"]


def test_policy_only_agents_and_their_children_make_policy_calls_only(make_gateway, sampler):
    gateway = make_gateway()
    sampler.script = ["ok", "ok"]
    rollout = gateway.open_rollout()
    root = gateway.open_agent(rollout, policy_only=True)
    child = gateway.open_agent(rollout, parent=root)
    for agent in (root, child):
        for kind in ("aux", "judge"):
            with pytest.raises(PermissionDenied):
                chat(gateway, agent, kind=kind)
        chat(gateway, agent)
    assert "judges_refused" not in root.misc


def test_a_closed_agent_is_refused_with_410(make_gateway, sampler):
    gateway = make_gateway()
    _rollout, agent = open_root(gateway)
    assert gateway.agent_for_key(agent.secret) is agent
    gateway.close_agent(agent)
    assert agent.closed and agent.ended is not None
    with pytest.raises(AgentClosed) as err:
        chat(gateway, agent)
    assert err.value.status == 410 and sampler.requests == []
    with pytest.raises(AgentClosed):
        gateway.agent_for_key(agent.secret)
    with pytest.raises(AuthenticationFailed) as unknown:
        gateway.agent_for_key("nope")
    assert unknown.value.status == 401


def test_an_agent_closed_while_sampling_gets_its_reply_but_nothing_is_recorded(make_gateway, sampler):
    gateway = make_gateway()
    rollout, agent = open_root(gateway)
    sampler.script = ["late"]
    sampler.on_sample = lambda: gateway.close_agent(agent)
    reply = chat(gateway, agent)
    assert reply.text == "late"
    assert agent.calls == [] and rollout.interactions == {}


def test_shut_down_closes_every_agent_and_refuses_new_ones(make_gateway, sampler):
    gateway = make_gateway()
    rollout, root = open_root(gateway)
    child = gateway.open_agent(rollout, parent=root)
    gateway.shut_down()
    assert root.closed and child.closed
    with pytest.raises(AgentClosed):
        chat(gateway, child)
    with pytest.raises(AgentClosed):
        gateway.open_agent(rollout, parent=root)
    with pytest.raises(AgentClosed):
        gateway.open_rollout()
    with pytest.raises(AgentClosed):
        gateway.agent_for_key(root.secret)


# ---- sampling failures -------------------------------------------------------------------------------------


def test_a_sample_timeout_is_a_504_timeout_error_and_a_gateway_error(make_gateway, sampler):
    gateway = make_gateway(sample_timeout_seconds=0.05)
    sampler.script = [Reply("slow", delay=1.0)]
    _, agent = open_root(gateway)
    with pytest.raises(SampleTimeout) as err:
        chat(gateway, agent)
    assert isinstance(err.value, TimeoutError)
    assert err.value.status == 504 and err.value.code == "sample_timeout"
    assert agent.gateway_errors == 1 and agent.calls == []


@pytest.mark.parametrize("reply", [Reply("x", raises=RuntimeError("boom")), Reply("x", sequences=2)])
def test_sampler_failures_are_counted_and_raised_as_gateway_errors(make_gateway, sampler, reply):
    gateway = make_gateway()
    sampler.script = [reply]
    _, agent = open_root(gateway)
    with pytest.raises(SamplingFailed) as err:
        chat(gateway, agent)
    assert err.value.status == 500 and isinstance(err.value, GatewayError)
    assert agent.gateway_errors == 1 and agent.calls == []


def test_resolve_sample_timeout_precedence(monkeypatch):
    monkeypatch.delenv("TINKER_SAMPLE_TIMEOUT_SECONDS", raising=False)
    assert resolve_sample_timeout(None) == 600.0
    monkeypatch.setenv("TINKER_SAMPLE_TIMEOUT_SECONDS", "42")
    assert resolve_sample_timeout(None) == 42.0
    assert resolve_sample_timeout(7) == 7.0  # the config key wins
    for bad in ("nan", "0", "-1", "soon", "inf"):
        monkeypatch.setenv("TINKER_SAMPLE_TIMEOUT_SECONDS", bad)
        with pytest.raises(ValueError, match="TINKER_SAMPLE_TIMEOUT_SECONDS"):
            resolve_sample_timeout(None)
    with pytest.raises(ValueError, match="sample_timeout_seconds"):
        resolve_sample_timeout(0)


# ---- agents ------------------------------------------------------------------------------------------------


def test_children_fork_at_the_parents_step_count_and_never_widen_access(make_gateway, sampler):
    gateway = make_gateway()
    sampler.script = ["a", "b", "c"]
    rollout = gateway.open_rollout("r-1", judges=True)
    root = gateway.open_agent(rollout, goal="g", max_steps=5, access="no_terminal")
    for kind in ("policy", "judge", "aux"):
        chat(gateway, root, kind=kind)
    child = gateway.open_agent(rollout, parent=root, role="subagent", goal="sub")
    wide = gateway.open_agent(rollout, parent=child, access="full")
    narrow = gateway.open_agent(rollout, parent=child, access="read_only")
    assert rollout.rollout_id == "r-1" and rollout.agents == [root, child, wide, narrow]
    assert rollout.root() is root and rollout.agent(child.agent_id) is child
    assert (root.depth, child.depth, wide.depth) == (0, 1, 2)
    assert (
        root.fork_step is None and child.fork_step == 2 and wide.fork_step == 0
    )  # judge calls are not steps
    assert (child.access, wide.access, narrow.access) == ("no_terminal", "no_terminal", "read_only")
    assert child.parent is root and child.role == "subagent" and child.goal == "sub"
    ids = {a.agent_id for a in rollout.agents} | {a.trajectory_id for a in rollout.agents}
    assert len(ids) == 8 and len({a.secret for a in rollout.agents}) == 4
    assert all(len(a.secret) >= 43 for a in rollout.agents)  # 256 random bits, URL-safe
    with pytest.raises(ValueError, match="root"):
        gateway.open_agent(rollout)
    with pytest.raises(ValueError, match="access"):
        gateway.open_agent(rollout, parent=root, access="everything")


def test_rollouts_are_separate(make_gateway, sampler):
    gateway = make_gateway()
    sampler.script = ["a", "b"]
    first, a = open_root(gateway)
    second, b = open_root(gateway)
    chat(gateway, a)
    chat(gateway, b)
    assert len(first.interactions) == len(second.interactions) == 1
    assert first.rollout_id != second.rollout_id
    with pytest.raises(ValueError):
        gateway.open_agent(second, parent=a)
    gateway.release_rollout(first)
    assert a.closed and not b.closed


def test_importing_the_gateway_does_not_import_tinker():
    code = (
        "import sys, platoon.gateway, platoon.gateway.core, platoon.gateway.trace; "
        "from platoon.gateway import ModelGateway, build_collection; "
        "assert 'tinker' not in sys.modules, 'tinker imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_the_renderer_is_a_constructor_input(sampler):
    renderer = FakeRenderer()
    gateway = ModelGateway(sampler, renderer, model_name="m")
    assert gateway.tokenizer is renderer.tokenizer and gateway.model_name == "m"
    assert gateway.defaults == {
        "max_tokens": 4096,
        "temperature": 1.0,
        "top_k": -1,
        "top_p": 1.0,
        "seed": None,
    }
