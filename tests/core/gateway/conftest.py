"""Fakes for the gateway's tests: a character-level tokenizer, a trivial renderer and a scripted Tinker sampler."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
import tinker

from platoon.testing import sample_response

EOS = 256  # the fake renderer's only stop token


class CharTokenizer:
    """One id per character (code points below 256); id 256 is the end-of-turn token."""

    def encode(self, text: str) -> list[int]:
        return [ord(ch) for ch in text]

    def decode(self, ids: list[int]) -> str:
        return "".join("<eot>" if i == EOS else chr(i) for i in ids)


@dataclass
class Parsed:
    message: dict[str, Any]
    ok: bool
    finish_reason: str
    parsed_tool_calls: int = 0
    emitted_tool_calls: int = 0
    recovered_tool_calls: int = 0
    unparsed_tool_calls: int = 0


class FakeRenderer:
    """`role:content` lines then `assistant:`; completions may hold `THINK:<text>|` and `CALL <json>` lines.

    Unlike the real renderers it emits every parsed call, so the tests see the gateway enforce the emit rule.
    """

    def __init__(self) -> None:
        self.tokenizer = CharTokenizer()
        self.render_calls: list[dict[str, Any]] = []

    def render_prompt(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None = None,
        *,
        enable_thinking: bool = True,
    ) -> list[int]:
        self.render_calls.append({"messages": messages, "tools": tools, "enable_thinking": enable_thinking})
        text = ""
        if tools:
            text += "tools:" + ",".join(t["function"]["name"] for t in tools) + "\n"
        for message in messages:
            text += f"{message['role']}:{message.get('content') or ''}\n"
        text += "assistant:" if enable_thinking else "assistant:/nothink"
        return self.tokenizer.encode(text)

    def stop_token_ids(self) -> list[int]:
        return [EOS]

    def parse_completion(self, tokens: list[int], stop_reason: str) -> Parsed:
        body = tokens[:-1] if tokens and tokens[-1] == EOS else tokens
        text = self.tokenizer.decode(body)
        reasoning = None
        if text.startswith("THINK:") and "|" in text:
            reasoning, text = text[len("THINK:") :].split("|", 1)
        lines, calls, unparsed = [], [], []
        for line in text.split("\n"):
            if line.startswith("CALL "):
                try:
                    data = json.loads(line[5:])
                    calls.append(
                        {
                            "type": "function",
                            "function": {"name": data["name"], "arguments": data["arguments"]},
                        }
                    )
                except (ValueError, KeyError):
                    unparsed.append(line)
                    lines.append(line)  # like the real renderers: unparsed blocks stay visible in the content
            else:
                lines.append(line)
        message = {
            "role": "assistant",
            "content": "\n".join(lines),
            "tool_calls": calls or None,
            "reasoning_content": reasoning,
        }
        finish = "tool_calls" if calls else ("length" if stop_reason == "length" else "stop")
        return Parsed(message, not unparsed, finish, len(calls), len(calls), 0, len(unparsed))


@dataclass
class Reply:
    """One scripted sample: text, stop reason, whether the stop token is appended, a delay, extra sequences."""

    text: str
    stop_reason: str = "stop"
    eos: bool | None = None  # default: appended when the stop reason is "stop"
    delay: float = 0.0
    raises: BaseException | None = None
    sequences: int = 1
    routing_id: str | None = None


@dataclass
class FakeSampler:
    """A Tinker sampler answering from a script (or a function of the decoded prompt); records every request."""

    script: list[Reply | str] | Callable[[str], Reply | str] = field(default_factory=list)
    requests: list[dict[str, Any]] = field(default_factory=list)
    logprob: float = -0.5
    on_sample: Callable[[], None] | None = None

    async def sample_async(
        self, *, prompt: tinker.ModelInput, num_samples: int, sampling_params: tinker.SamplingParams
    ) -> tinker.SampleResponse:
        assert num_samples == 1
        tokens = prompt.to_ints()
        self.requests.append({"prompt": tokens, "params": sampling_params})
        reply = self.script(CharTokenizer().decode(tokens)) if callable(self.script) else self.script.pop(0)
        if isinstance(reply, str):
            reply = Reply(reply)
        if self.on_sample is not None:
            self.on_sample()
        if reply.delay:
            await asyncio.sleep(reply.delay)
        if reply.raises is not None:
            raise reply.raises
        out = CharTokenizer().encode(reply.text)
        if reply.eos if reply.eos is not None else reply.stop_reason == "stop":
            out.append(EOS)
        # one sequence (with the routing id a service may send), as many times as the reply asks
        one = sample_response(
            out, stop_reason=reply.stop_reason, routing_id=reply.routing_id, logprob=self.logprob
        )
        return tinker.SampleResponse(sequences=list(one.sequences) * reply.sequences)


@pytest.fixture
def renderer() -> FakeRenderer:
    return FakeRenderer()


@pytest.fixture
def sampler() -> FakeSampler:
    return FakeSampler()


@pytest.fixture
def make_gateway(renderer: FakeRenderer, sampler: FakeSampler) -> Callable[..., Any]:
    from platoon.gateway import ModelGateway

    def make(**settings: Any) -> ModelGateway:
        settings.setdefault("model_name", "fake/model")
        return ModelGateway(sampler, renderer, **settings)

    return make
