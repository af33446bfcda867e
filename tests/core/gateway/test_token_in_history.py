"""Token-in history over the real Qwen3 tokenizer: the next prompt reuses the exact tokens the model sampled.

The forms below are ones real models write and a plain re-render changes (raw UTF-8 arguments, compact JSON, no
newline or a space before `<tool_call>`). With token-in history every prompt extends the previous prompt and its
sampled tokens, only the new messages are rendered, and the trainer builds one datum from the whole conversation.
Where the history cannot be reused, the call records why (`generation["history"]["segment"]`) and gets the plain
render.
"""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path
from typing import Any

import pytest

import platoon.renderers as renderers
import platoon.testing.policy as policy_module
from platoon.gateway import ModelGateway
from platoon.gateway.history import SEGMENT_REASONS

ROOT = Path(__file__).resolve().parents[3]

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "weather",
            "description": "The weather in a city.",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        },
    }
]

#: What the model writes on its first turn; each form re-renders differently from how it was sampled.
FORMS = {
    "raw_utf8": 'Checking.\n<tool_call>\n{"name": "weather", "arguments": {"city": "北京"}}\n</tool_call>',
    "compact_json": 'Checking.\n<tool_call>\n{"name":"weather","arguments":{"city":"Oslo"}}\n</tool_call>',
    "no_newline": '<tool_call>\n{"name": "weather", "arguments": {"city": "Oslo"}}\n</tool_call>',
    "space_before": 'Checking. <tool_call>\n{"name": "weather", "arguments": {"city": "Oslo"}}\n</tool_call>',
}


@pytest.fixture(scope="module")
def qwen3_tokenizer() -> Any:
    from platoon.renderers.tokenizers import TokenizersTokenizer

    base = Path(os.environ.get("PLATOON_TEST_TOKENIZERS") or ROOT / ".cache" / "test-tokenizers")
    path = base / "qwen3"
    if not (path / "tokenizer.json").is_file():
        pytest.fail(
            f"the real Qwen3 tokenizer is not at {path}: run `uv run python scripts/fetch_test_tokenizers.py`"
        )
    return TokenizersTokenizer.from_directory(path, name_or_path="Qwen/Qwen3-8B")


def gateway_over(tokenizer: Any, script: list[Any], renderer: str = "qwen3_instruct", **kwargs: Any) -> Any:
    chosen = renderers.get_renderer(renderer, tokenizer)
    renderers.apply_renderer_kwargs(chosen, kwargs)
    policy = policy_module.ScriptedPolicy(script, tokenizer=tokenizer)
    gateway = ModelGateway(policy, chosen, model_name="Qwen/Qwen3-8B")
    rollout = gateway.open_rollout()
    return gateway, rollout, gateway.open_agent(rollout, goal="the weather")


def converse(gateway: ModelGateway, agent: Any, *, tool_result: str = "sunny") -> list[dict[str, Any]]:
    """user → (tool call → tool result) → answer → user → answer, sending back each reply as it came."""
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You answer weather questions."},
        {"role": "user", "content": "What is the weather?"},
    ]

    async def run() -> None:
        reply = await gateway.chat(agent, messages, tools=TOOLS)
        messages.append(dict(reply.message))
        for call in reply.tool_calls:
            messages.append({"role": "tool", "tool_call_id": call["id"], "content": tool_result})
        reply = await gateway.chat(agent, messages, tools=TOOLS)
        messages.append(dict(reply.message))
        messages.append({"role": "user", "content": "Thanks."})
        await gateway.chat(agent, messages, tools=TOOLS)

    asyncio.run(run())
    return messages


def turns(rollout: Any, agent: Any) -> list[Any]:
    return [rollout.interactions[call.call_id] for call in agent.calls]


@pytest.mark.parametrize("form", FORMS)
def test_every_prompt_extends_the_previous_prompt_and_its_sampled_tokens(qwen3_tokenizer, form):
    gateway, rollout, agent = gateway_over(qwen3_tokenizer, [FORMS[form], "Sunny.", "Bye."])
    converse(gateway, agent)
    recorded = turns(rollout, agent)
    first = agent.calls[0].generation["history"]
    assert first == {"extends": None, "reused_tokens": 0, "segment": "first_call"}
    new_parts = [
        "\n<|im_start|>user\n<tool_response>\nsunny\n</tool_response><|im_end|>\n<|im_start|>assistant\n",
        "\n<|im_start|>user\nThanks.<|im_end|>\n<|im_start|>assistant\n",
    ]
    for previous, call, turn, new in zip(
        recorded[:-1], agent.calls[1:], recorded[1:], new_parts, strict=True
    ):
        prefix = previous.prompt_tokens + previous.sampled_tokens
        assert turn.prompt_tokens[: len(prefix)] == prefix
        # Only the new messages were rendered after the reused tokens.
        assert qwen3_tokenizer.decode(list(turn.prompt_tokens[len(prefix) :])) == new
        assert call.generation["history"] == {
            "extends": previous.call_id,
            "reused_tokens": len(prefix),
            "segment": None,
        }


def test_a_plain_re_render_of_the_same_conversation_breaks_the_prefix(qwen3_tokenizer):
    """Why the feature exists: with token_in_history off, compact JSON comes back re-serialised."""
    gateway, rollout, agent = gateway_over(
        qwen3_tokenizer, [FORMS["compact_json"], "Sunny.", "Bye."], token_in_history=False
    )
    converse(gateway, agent)
    first, second, _ = turns(rollout, agent)
    prefix = first.prompt_tokens + first.sampled_tokens
    assert second.prompt_tokens[: len(prefix)] != prefix
    rendered = qwen3_tokenizer.decode(list(second.prompt_tokens))
    assert '{"name": "weather", "arguments": {"city": "Oslo"}}' in rendered  # what the model did not write
    assert agent.calls[1].generation["history"]["segment"] == "opted_out"


def test_the_trainer_builds_one_datum_holding_exactly_the_sampled_tokens(qwen3_tokenizer):
    from platoon.envs.service import Outcome
    from platoon.gateway.trace import build_collection
    from platoon.train.tinker.datums import trajectory_datums

    gateway, rollout, agent = gateway_over(qwen3_tokenizer, [FORMS["raw_utf8"], "Sunny.", "Bye."])
    converse(gateway, agent)
    agent.closed = True
    collection = build_collection(rollout, episode_outcome=Outcome("scored", {"reward": 1.0}))
    (trajectory,) = collection.trajectories.values()
    (datum,) = trajectory_datums(trajectory, rollout.interactions, advantage=1.0)
    recorded = turns(rollout, agent)
    last = recorded[-1]
    sequence = [*last.prompt_tokens, *last.sampled_tokens]
    targets = datum.loss_fn_inputs["target_tokens"].tolist()
    mask = datum.loss_fn_inputs["mask"].tolist()
    assert targets == sequence[1:]
    sampled = {i for turn in recorded for i in _span_of(sequence, turn)}
    assert [i + 1 for i, m in enumerate(mask) if m == 1.0] == sorted(sampled)


def _span_of(sequence: list[int], turn: Any) -> range:
    start = len(turn.prompt_tokens)
    assert tuple(sequence[start : start + len(turn.sampled_tokens)]) == turn.sampled_tokens
    return range(start, start + len(turn.sampled_tokens))


def test_an_edited_history_is_rendered_whole_and_recorded_as_a_new_segment(qwen3_tokenizer):
    gateway, rollout, agent = gateway_over(qwen3_tokenizer, [FORMS["compact_json"], "Sunny."])
    messages: list[dict[str, Any]] = [{"role": "user", "content": "What is the weather?"}]

    async def run() -> None:
        reply = await gateway.chat(agent, messages, tools=TOOLS)
        edited = dict(reply.message, content="I will check the weather.")  # the harness rewrote the turn
        messages.append(edited)
        messages.append({"role": "tool", "tool_call_id": reply.tool_calls[0]["id"], "content": "sunny"})
        await gateway.chat(agent, messages, tools=TOOLS)

    asyncio.run(run())
    second = agent.calls[1]
    assert second.generation["history"]["segment"] == "no_matching_call"
    plain = gateway.renderer.render_prompt(messages, tools=TOOLS)
    assert list(rollout.interactions[second.call_id].prompt_tokens) == plain


def test_reasoning_the_renderer_drops_from_history_starts_a_new_segment(qwen3_tokenizer):
    thinking = "<think>\nThe user wants the weather.\n</think>\n\n" + FORMS["compact_json"]
    gateway, rollout, agent = gateway_over(qwen3_tokenizer, [thinking, "Sunny.", "Bye."], renderer="qwen3")
    messages = converse(gateway, agent)
    assert agent.calls[0].message["reasoning_content"].strip() == "The user wants the weather."
    history = [call.generation["history"] for call in agent.calls]
    if history[1]["segment"] is None:
        # The renderer keeps the reasoning of turns after the last user query (as Qwen3's own template does):
        # the tool loop extends; the next user turn drops it from the history, which re-renders differently.
        assert history[1]["extends"] == agent.calls[0].call_id
        assert history[2]["segment"] == "history_rerendered"
        dropped = agent.calls[2]
    else:
        assert history[1]["segment"] == "reasoning_dropped"
        dropped = agent.calls[1]
    prompt = list(rollout.interactions[dropped.call_id].prompt_tokens)
    assert "The user wants the weather." not in qwen3_tokenizer.decode(prompt)
    count = agent.calls.index(dropped)
    sent = messages[: [i for i, m in enumerate(messages) if m["role"] == "assistant"][count]]
    assert prompt == gateway.renderer.render_prompt(sent, tools=TOOLS)


def test_a_prefill_history_does_not_keep_starts_a_segment_named_for_it(qwen3_tokenizer):
    # qwen3_disable_thinking prefills an empty think block that history does not keep: every later call is a new
    # segment, and the record says why (not "history_rerendered": the earlier messages render as they did).
    gateway, _rollout, agent = gateway_over(
        qwen3_tokenizer, [FORMS["compact_json"], "Sunny.", "Bye."], renderer="qwen3_disable_thinking"
    )
    converse(gateway, agent)
    assert [call.generation["history"]["segment"] for call in agent.calls] == [
        "first_call",
        "prefill_dropped",
        "prefill_dropped",
    ]


def test_a_turn_cut_at_the_completion_budget_is_not_reused(qwen3_tokenizer):
    gateway, rollout, agent = gateway_over(qwen3_tokenizer, ["a long answer that is cut", "Done."])
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Talk."}]

    async def run() -> None:
        reply = await gateway.chat(agent, messages, max_tokens=3)
        assert reply.finish_reason == "length"
        messages.extend([dict(reply.message), {"role": "user", "content": "Go on."}])
        await gateway.chat(agent, messages)

    asyncio.run(run())
    # Not reused: the plain render closes the cut turn with `<|im_end|>` (it happens to extend the cut tokens).
    assert agent.calls[1].generation["history"]["reused_tokens"] == 0
    assert list(rollout.interactions[agent.calls[1].call_id].prompt_tokens) == gateway.renderer.render_prompt(
        messages
    )


def test_a_client_that_reserialises_arguments_and_pads_the_text_still_matches(qwen3_tokenizer):
    gateway, _rollout, agent = gateway_over(qwen3_tokenizer, [FORMS["compact_json"], "Sunny."])
    messages: list[dict[str, Any]] = [{"role": "user", "content": "What is the weather?"}]

    async def run() -> None:
        reply = await gateway.chat(agent, messages, tools=TOOLS)
        call = reply.tool_calls[0]
        arguments = json.dumps(json.loads(call["function"]["arguments"]), indent=2)
        messages.append(
            {
                "role": "assistant",
                "content": reply.message["content"] + "\n",
                "tool_calls": [{**call, "function": {**call["function"], "arguments": arguments}}],
            }
        )
        messages.append({"role": "tool", "tool_call_id": call["id"], "content": "sunny"})
        await gateway.chat(agent, messages, tools=TOOLS)

    asyncio.run(run())
    assert agent.calls[1].generation["history"]["extends"] == agent.calls[0].call_id


def test_every_segment_reason_is_documented():
    text = (ROOT / "docs" / "gateway.md").read_text()
    for key in SEGMENT_REASONS:
        assert f"`{key}`" in text, f"docs/gateway.md does not explain the segment reason {key}"
