"""The gateway adapter every renderer offers: `render_prompt`, `stop_token_ids`, `parse_completion`.

Round trips (render -> a scripted completion -> parse -> the OpenAI message), the emit rules for tool calls, the
multi-turn prefix property, and that nothing a model writes makes parsing raise.
"""

from __future__ import annotations

import itertools
import json
import random
import re
from typing import Any

import pytest

from platoon.renderers import ParsedCompletion, get_renderer
from platoon.testing import Completion, ScriptedPolicy, tool_call, toy_renderer, toy_tokenizer

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the weather.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
QWEN3_FAMILY = ["qwen3", "qwen3_instruct", "qwen3_disable_thinking", "qwen3_vl", "qwen3_vl_instruct"]


def _parse(text: str, stop_reason: str = "stop", renderer: Any = None, stop: bool = True) -> ParsedCompletion:
    renderer = renderer or toy_renderer()
    tokens = toy_tokenizer().encode(text) + ([258] if stop else [])
    return renderer.parse_completion(tokens, stop_reason)


# ---- render_prompt -------------------------------------------------------------------------------------------


def test_render_prompt_is_the_generation_prompt():
    renderer = toy_renderer()
    ids = renderer.render_prompt(
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    )
    assert toy_tokenizer().decode(ids) == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    )
    assert all(isinstance(t, int) for t in ids)


def test_render_prompt_folds_tools_into_the_leading_system_message():
    renderer = toy_renderer()
    text = toy_tokenizer().decode(
        renderer.render_prompt(
            [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Weather?"}],
            tools=[WEATHER],
        )
    )
    assert text.startswith("<|im_start|>system\nBe brief.\n\n# Tools\n\n")
    assert (
        '{"type": "function", "function": {"name": "get_weather", "description": "Get the weather."' in text
    )
    assert text.count("<|im_start|>system") == 1
    # Without a system message the tools block is the system message; with no tools nothing is added.
    text = toy_tokenizer().decode(renderer.render_prompt([{"role": "user", "content": "x"}], tools=[WEATHER]))
    assert text.startswith("<|im_start|>system\n# Tools\n")
    assert renderer.render_prompt([{"role": "user", "content": "x"}], tools=[]) == renderer.render_prompt(
        [{"role": "user", "content": "x"}]
    )


def test_render_prompt_converts_openai_messages():
    renderer = get_renderer("qwen3", toy_tokenizer())
    messages: list[dict[str, Any]] = [
        {"role": "developer", "content": [{"type": "text", "text": "Rules."}]},
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
        {"role": "assistant", "content": None, "tool_calls": []},
        {"role": "user", "content": "c"},
        {
            "role": "assistant",
            "content": None,
            "reasoning_content": "think",
            "tool_calls": [
                {"id": "1", "type": "function", "function": {"name": "f", "arguments": '{"x":1}'}}
            ],
        },
        {"role": "tool", "tool_call_id": "1", "name": "f", "content": "ok"},
    ]
    text = toy_tokenizer().decode(renderer.render_prompt(messages))
    assert text == (
        "<|im_start|>system\nRules.<|im_end|>\n<|im_start|>user\nab<|im_end|>\n<|im_start|>assistant\n<|im_end|>\n"
        "<|im_start|>user\nc<|im_end|>\n"
        # history thinking is stripped by qwen3; JSON-string arguments are re-serialised as the cookbook does
        '<|im_start|>assistant\n\n<tool_call>\n{"name": "f", "arguments": {"x": 1}}\n</tool_call><|im_end|>\n'
        "<|im_start|>user\n<tool_response>\nok\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
    )


def test_render_prompt_keeps_malformed_history_arguments():
    renderer = toy_renderer()
    call = {"id": "1", "type": "function", "function": {"name": "f", "arguments": "{not json"}}
    text = toy_tokenizer().decode(
        renderer.render_prompt(
            [{"role": "user", "content": "x"}, {"role": "assistant", "content": "", "tool_calls": [call]}]
        )
    )
    assert '{"name": "f", "arguments": "{not json"}' in text


def test_render_prompt_refuses_images():
    from platoon.renderers import RendererError

    message = {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:,"}}]}
    with pytest.raises(RendererError, match="only text content"):
        toy_renderer().render_prompt([message])


@pytest.mark.parametrize("name", QWEN3_FAMILY)
def test_stop_token_ids(name: str):
    assert get_renderer(name, toy_tokenizer()).stop_token_ids() == [258]


# ---- parse_completion ----------------------------------------------------------------------------------------


def test_plain_answer():
    parsed = _parse("Paris.")
    assert parsed.message == {
        "role": "assistant",
        "content": "Paris.",
        "tool_calls": None,
        "reasoning_content": None,
    }
    assert (parsed.ok, parsed.finish_reason) == (True, "stop")
    assert (parsed.parsed_tool_calls, parsed.emitted_tool_calls, parsed.unparsed_tool_calls) == (0, 0, 0)


def test_tool_calls_are_openai_dicts_with_minted_ids():
    text = (
        "Checking.\n" + tool_call("get_weather", city="Paris") + "\n" + tool_call("get_time", {"tz": "UTC"})
    )
    parsed = _parse(text)
    assert parsed.finish_reason == "tool_calls" and parsed.ok
    assert parsed.message["content"] == "Checking."
    calls = parsed.message["tool_calls"]
    assert [c["function"] for c in calls] == [
        {"name": "get_weather", "arguments": '{"city": "Paris"}'},
        {"name": "get_time", "arguments": '{"tz": "UTC"}'},
    ]
    assert all(c["type"] == "function" and re.fullmatch(r"call_[0-9a-f]{24}", c["id"]) for c in calls)
    assert calls[0]["id"] != calls[1]["id"]
    assert (parsed.parsed_tool_calls, parsed.emitted_tool_calls, parsed.recovered_tool_calls) == (2, 2, 0)


def test_a_sampled_tool_call_id_is_kept():
    parsed = _parse('<tool_call>\n{"name": "f", "arguments": {}, "id": "abc"}\n</tool_call>')
    assert parsed.message["tool_calls"][0]["id"] == "abc"


def test_reasoning_is_split_and_empty_reasoning_is_none():
    parsed = _parse("<think>\nHmm.\n</think>\n\nFour.")
    assert parsed.message["reasoning_content"] == "\nHmm.\n"
    assert parsed.message["content"] == "\n\nFour."
    assert _parse("<think></think>Four.").message["reasoning_content"] is None


def test_no_stop_token_means_not_ok_and_no_tool_calls():
    text = "Let me check.\n" + tool_call("get_weather", city="Oslo")
    parsed = _parse(text, "length", stop=False)
    assert not parsed.ok and parsed.finish_reason == "length"
    assert parsed.message["tool_calls"] is None
    assert parsed.message["content"] == text  # the call's raw text (with its newline) is shown as written
    assert (parsed.parsed_tool_calls, parsed.emitted_tool_calls) == (1, 0)


def test_stop_reason_length_never_emits_tool_calls():
    text = "\n" + tool_call("f")
    parsed = _parse(text, "length")
    assert parsed.ok and parsed.finish_reason == "length"
    assert parsed.message["tool_calls"] is None and parsed.message["content"] == text


def test_truncated_inside_reasoning():
    parsed = _parse("<think>\nStill thinking", "length", stop=False)
    assert parsed.message["reasoning_content"] == "\nStill thinking"
    assert parsed.message["content"] == "" and parsed.finish_reason == "length"


def test_unparsed_tool_blocks_are_appended_to_the_content():
    bad = '<tool_call>\n{"name": "f", "arguments": {"x": }\n</tool_call>'
    parsed = _parse("I will call.\n" + bad)
    assert parsed.message["content"] == "I will call.\n" + bad
    assert parsed.message["tool_calls"] is None and parsed.finish_reason == "stop"
    assert (parsed.parsed_tool_calls, parsed.unparsed_tool_calls) == (0, 1)
    # A good call and a bad one: the good one is emitted, the bad one's text is shown.
    parsed = _parse(bad + "\n" + tool_call("g"))
    assert parsed.message["content"] == bad and len(parsed.message["tool_calls"]) == 1
    assert (parsed.parsed_tool_calls, parsed.emitted_tool_calls, parsed.unparsed_tool_calls) == (1, 1, 1)


def test_an_unclosed_tool_block_is_unparsed():
    parsed = _parse('Sure.\n<tool_call>\n{"name": "f", "argu')
    assert parsed.message["content"] == 'Sure.\n<tool_call>\n{"name": "f", "argu'
    assert parsed.unparsed_tool_calls == 1 and parsed.message["tool_calls"] is None


def test_text_after_the_first_stop_token_is_not_part_of_the_turn():
    tok = toy_tokenizer()
    parsed = toy_renderer().parse_completion(tok.encode("One.<|im_end|>Two.<|im_end|>"), "stop")
    assert parsed.message["content"] == "One." and parsed.ok


@pytest.mark.parametrize("name", QWEN3_FAMILY)
def test_malformed_output_never_raises(name: str):
    renderer = get_renderer(name, toy_tokenizer())
    rng = random.Random(7)
    pieces = [
        "<tool_call>",
        "</tool_call>",
        "<think>",
        "</think>",
        "{",
        "}",
        '"name"',
        ":",
        '"arguments"',
        "\n",
        "x",
        "é",
    ]
    for _ in range(300):
        text = "".join(rng.choice(pieces) for _ in range(rng.randint(0, 12)))
        tokens = toy_tokenizer().encode(text) + rng.choice([[], [258], [258, 97, 258]])
        tokens += rng.choice([[], [rng.randrange(0, 265)], [230]])  # stray ids, a cut UTF-8 sequence
        for reason in ("stop", "length"):
            parsed = renderer.parse_completion(tokens, reason)
            assert isinstance(parsed.message["content"], str)
            assert parsed.finish_reason in ("stop", "length", "tool_calls")
            for call in parsed.message["tool_calls"] or []:
                json.loads(call["function"]["arguments"])
    deep = "<tool_call>" + '{"name": "f", "arguments": ' + "[" * 5000 + "]" * 5000 + "}</tool_call>"
    assert renderer.parse_completion([*toy_tokenizer().encode(deep), 258], "stop").unparsed_tool_calls == 1


# ---- round trips through a scripted completion ---------------------------------------------------------------


def _turn(
    renderer: Any, policy: ScriptedPolicy, messages: list[dict[str, Any]], tools: Any = None
) -> tuple[list[int], list[int], ParsedCompletion]:
    prompt = renderer.render_prompt(messages, tools=tools)
    sequence = policy.sample(prompt, 1, None).sequences[0]
    return prompt, list(sequence.tokens), renderer.parse_completion(sequence.tokens, sequence.stop_reason)


def test_round_trip_render_sample_parse():
    renderer = toy_renderer()
    policy = ScriptedPolicy(["Let me look.\n" + tool_call("get_weather", city="Paris"), "It is sunny."])
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Weather in Paris?"}]
    _, _, parsed = _turn(renderer, policy, messages, [WEATHER])
    assert parsed.finish_reason == "tool_calls" and parsed.message["content"] == "Let me look."
    assert policy.calls[0].last_user_message == "Weather in Paris?"
    call = parsed.message["tool_calls"][0]
    messages += [
        parsed.message,
        {"role": "tool", "tool_call_id": call["id"], "name": "get_weather", "content": "sunny"},
    ]
    _, _, parsed = _turn(renderer, policy, messages, [WEATHER])
    assert parsed.message == {
        "role": "assistant",
        "content": "It is sunny.",
        "tool_calls": None,
        "reasoning_content": None,
    }
    assert policy.calls[1].last_user_message == "<tool_response>\nsunny\n</tool_response>"


CANONICAL_SCRIPT = [
    "Hello! How can I help?",
    "Let me check.\n" + tool_call("get_weather", city="Paris", unit="celsius"),
    "\n" + tool_call("get_weather", city="Oslo") + "\n" + tool_call("get_weather", city="Rome"),
    "  It is 18°C in Paris, 5 in Oslo, 20 in Rome.\n\n",
]


def _conversation(renderer: Any, script: list[str]) -> list[tuple[list[int], list[int]]]:
    """Play `script` as an agent would: every reply goes back into the history, tool calls get results."""
    policy = ScriptedPolicy(script)
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Hi there."},
    ]
    turns = []
    for i in range(len(script)):
        prompt, tokens, parsed = _turn(renderer, policy, messages, [WEATHER])
        turns.append((prompt, tokens))
        messages.append(parsed.message)
        for call in parsed.message["tool_calls"] or []:
            messages.append(
                {"role": "tool", "tool_call_id": call["id"], "content": f"result {call['id'][-4:]}"}
            )
        if not parsed.message["tool_calls"]:
            messages.append({"role": "user", "content": f"Next question {i}."})
    return turns


def _assert_prefix_property(turns: list[tuple[list[int], list[int]]]) -> None:
    for (prompt, sampled), (next_prompt, _) in itertools.pairwise(turns):
        assert next_prompt[: len(prompt) + len(sampled)] == prompt + sampled


@pytest.mark.parametrize("name", QWEN3_FAMILY)
def test_multi_turn_prefix_property_without_thinking(name: str):
    """Each prompt extends the previous prompt plus its sampled tokens, when the model writes the renderer's
    own format (the newline before each `<tool_call>`) and does not think. qwen3_disable_thinking is the
    exception: its generation prompt opens the turn with an empty think block that history turns do not have."""
    turns = _conversation(get_renderer(name, toy_tokenizer()), CANONICAL_SCRIPT)
    if name == "qwen3_disable_thinking":
        prompt, sampled = turns[0]
        assert toy_tokenizer().decode(prompt).endswith("<think>\n\n</think>\n\n")
        assert turns[1][0][: len(prompt) + len(sampled)] != prompt + sampled
    else:
        _assert_prefix_property(turns)


def test_prefix_property_with_thinking_needs_history_thinking_kept():
    """With thinking, qwen3 (as the HF template) drops `<think>` blocks from history turns, so a later prompt does
    not extend an earlier completion; keeping them (`strip_thinking_from_history=False`) restores the property,
    since the reasoning and content come back verbatim."""
    script = [
        "<think>\nGreeting.\n</think>\n\nHello!",
        "<think>\nNeed weather.\n</think>\n\n" + tool_call("get_weather", city="Paris"),
        "Done.",
    ]
    stripped = _conversation(get_renderer("qwen3", toy_tokenizer()), script)
    prompt, sampled = stripped[0]
    assert stripped[1][0][: len(prompt) + len(sampled)] != prompt + sampled
    kept = get_renderer("qwen3", toy_tokenizer(), renderer_kwargs={"strip_thinking_from_history": False})
    assert kept.has_extension_property
    _assert_prefix_property(_conversation(kept, script))


def test_a_non_canonical_tool_call_still_parses_but_breaks_the_prefix():
    """`tool_call()` text without the leading newline parses fine; the history re-renders it in the renderer's
    format (with the newline), so that turn is not a prefix of the next prompt."""
    turns = _conversation(toy_renderer(), [tool_call("get_weather", city="Paris"), "Sunny."])
    prompt, sampled = turns[0]
    assert turns[1][0][: len(prompt) + len(sampled)] != prompt + sampled


def test_completion_dataclass_fields():
    parsed = _parse("x")
    assert set(vars(parsed)) == {
        "message", "ok", "finish_reason", "parsed_tool_calls", "emitted_tool_calls", "recovered_tool_calls",
        "unparsed_tool_calls", "unemitted_content",
    }  # fmt: skip
    assert Completion("x").stop_reason == "stop"
