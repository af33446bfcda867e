"""The scripted policy of platoon.testing and its pytest plugin fixtures."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import tinker

from platoon.testing import (
    Completion,
    PolicyCall,
    ScriptedPolicy,
    ScriptExhaustedError,
    last_user_message,
    rules,
    sample_response,
    tool_call,
    toy_renderer,
    toy_tokenizer,
)


def _prompt(*users: str) -> tinker.ModelInput:
    renderer = toy_renderer()
    return renderer.build_generation_prompt([{"role": "user", "content": u} for u in users])


def test_sample_returns_a_real_sample_response_with_the_stop_token():
    policy = ScriptedPolicy(["Hi!"])
    params = tinker.SamplingParams(max_tokens=50)
    response = policy.sample(_prompt("hello"), 1, params)
    assert isinstance(response, tinker.SampleResponse)
    (sequence,) = response.sequences
    assert isinstance(sequence, tinker.SampledSequence)
    assert sequence.tokens == [72, 105, 33, 258] and sequence.stop_reason == "stop"
    assert sequence.logprobs == [-0.25] * 4
    (call,) = policy.calls
    assert isinstance(call, PolicyCall)
    assert call.text == "Hi!" and call.tokens == [72, 105, 33, 258] and call.sampling_params is params
    assert (
        call.prompt == toy_tokenizer().decode(_prompt("hello").to_ints())
        and call.last_user_message == "hello"
    )
    assert call.prompt_tokens == _prompt("hello").to_ints()
    assert policy.prompts == [call.prompt] and policy.remaining == 0


def test_sample_async_and_the_completion_options():
    policy = ScriptedPolicy(
        [Completion("abc", stop_reason="length", routing_id="r-1", logprob=-1.0), "x"], logprob=-0.5
    )
    first = asyncio.run(policy.sample_async(_prompt("a"), 1, tinker.SamplingParams()))
    (sequence,) = first.sequences
    assert sequence.tokens == [97, 98, 99] and sequence.stop_reason == "length"  # no stop token on length
    assert sequence.logprobs == [-1.0] * 3
    assert sequence.routing_id == "r-1"  # type: ignore[attr-defined]
    second = asyncio.run(policy.sample_async(_prompt("b"), 1, tinker.SamplingParams()))
    assert second.sequences[0].logprobs == [-0.5, -0.5]


def test_max_tokens_cuts_like_a_sampler():
    policy = ScriptedPolicy(["abcdef"])
    (sequence,) = policy.sample(_prompt("a"), 1, tinker.SamplingParams(max_tokens=3)).sequences
    assert sequence.tokens == [97, 98, 99] and sequence.stop_reason == "length"


def test_delay_sleeps_asynchronously():
    policy = ScriptedPolicy([Completion("slow", delay=0.2), Completion("fast")])

    async def both() -> list[str]:
        order: list[str] = []

        async def one(tag: str) -> None:
            await policy.sample_async(_prompt(tag), 1, None)
            order.append(tag)

        await asyncio.gather(one("a"), one("b"))
        return order

    assert asyncio.run(both()) == ["b", "a"]  # the delayed first answer did not block the second


def test_script_exhaustion_names_the_call_and_the_prompt_tail():
    policy = ScriptedPolicy(["only"])
    policy.sample(_prompt("one"), 1, None)
    long_question = "q" * 400 + " the end?"
    with pytest.raises(ScriptExhaustedError) as caught:
        policy.sample(_prompt(long_question), 1, None)
    message = str(caught.value)
    assert isinstance(caught.value, AssertionError)
    assert "call 2" in message and "the end?" in message
    assert "q" * 300 not in message.replace("\\n", "")  # only the last 300 prompt characters


def test_function_script_sees_the_decoded_prompt():
    seen: list[str] = []

    def script(prompt: str) -> str:
        seen.append(prompt)
        return f"echo {last_user_message(prompt)}"

    policy = ScriptedPolicy(script)
    assert policy.remaining is None and policy.script is script
    for word in ("a", "b", "c"):
        response = policy.sample(_prompt(word), 1, None)
        assert toy_tokenizer().decode(response.sequences[0].tokens) == f"echo {word}<|im_end|>"
    assert seen == policy.prompts and len(seen) == 3


def test_rules_answer_by_the_last_user_message():
    answer = rules(
        {"What is 2": "4", "Weather": Completion(tool_call("get_weather", city="Paris")), "": "fallback"}
    )
    policy = ScriptedPolicy(answer)
    assert policy.sample(_prompt("What is 2+2?"), 1, None).sequences[0].tokens[:-1] == toy_tokenizer().encode(
        "4"
    )
    text = toy_tokenizer().decode(
        policy.sample(_prompt("hi", "Weather in Paris?"), 1, None).sequences[0].tokens
    )
    assert (
        text == '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call><|im_end|>'
    )
    strict = ScriptedPolicy(rules({"yes": "y"}))
    with pytest.raises(AssertionError, match="no rule matches the last user message 'maybe'"):
        strict.sample(_prompt("maybe"), 1, None)
    assert ScriptedPolicy(rules({}, default="d")).sample(_prompt("z"), 1, None).sequences[0].tokens == [
        100,
        258,
    ]


def test_tool_call_text():
    assert tool_call("f") == '<tool_call>\n{"name": "f", "arguments": {}}\n</tool_call>'
    assert (
        tool_call("f", {"a": 1}, b=2)
        == '<tool_call>\n{"name": "f", "arguments": {"a": 1, "b": 2}}\n</tool_call>'
    )
    assert toy_tokenizer().encode(tool_call("f"))[0] == 259


def test_last_user_message():
    assert last_user_message("") == ""
    prompt = toy_tokenizer().decode(_prompt("first", "second\nline").to_ints())
    assert last_user_message(prompt) == "second\nline"


def test_a_lone_str_or_completion_is_a_type_error():
    with pytest.raises(TypeError, match="wrap it in a list"):
        ScriptedPolicy("hello")
    with pytest.raises(TypeError):
        ScriptedPolicy(Completion("hello"))  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="script item 1"):
        ScriptedPolicy(["ok", 3])  # type: ignore[list-item]
    with pytest.raises(TypeError):
        ScriptedPolicy(lambda prompt: 3).sample(_prompt("x"), 1, None)  # type: ignore[arg-type,return-value]


def test_num_samples_must_be_one_and_completion_is_checked():
    with pytest.raises(ValueError, match="num_samples"):
        ScriptedPolicy(["x"]).sample(_prompt("x"), 2, None)
    with pytest.raises(ValueError):
        Completion("x", stop_reason="eos")  # type: ignore[arg-type]


def test_stop_token_and_tokenizer_can_be_given():
    policy = ScriptedPolicy(["x"], stop_token=256)
    assert policy.sample([1, 2, 3], 1, None).sequences[0].tokens == [120, 256]
    assert policy.calls[0].prompt == "\x01\x02\x03"


def test_sample_response():
    response = sample_response([1, 2], stop_reason="length", routing_id="abc", logprob=-0.1)
    (sequence,) = response.sequences
    assert (sequence.tokens, sequence.stop_reason) == ([1, 2], "length")
    assert sequence.logprobs == pytest.approx([-0.1, -0.1])  # SDK 0.38 keeps logprobs as float32
    assert sequence.routing_id == "abc"  # type: ignore[attr-defined]
    assert sample_response([3]).sequences[0].stop_reason == "stop"


def test_pytest_plugin_fixtures(tmp_path: Path):
    (tmp_path / "test_uses_plugin.py").write_text(
        textwrap.dedent(
            """
            def test_fixtures(toy_tokenizer, toy_renderer, serve_policy):
                assert toy_tokenizer.eos_token_id == 258
                assert toy_renderer.name == "qwen3_instruct" and toy_renderer.tokenizer is toy_tokenizer
                assert callable(serve_policy)
            """
        )
    )
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "platoon.testing",
            "-p",
            "no:cacheprovider",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "1 passed" in done.stdout
