"""The context window's cheap bound: a prompt that cannot fit is refused before it renders, and the bound never
exceeds the real prompt length (real tokenizers and renderers, text built to defeat it)."""

from __future__ import annotations

import asyncio
import os
import unicodedata
from pathlib import Path
from typing import Any

import pytest

from platoon.gateway.core import ContextWindowExceeded
from platoon.gateway.measure import TokenSpan, prompt_token_floor, token_span
from platoon.renderers.base import get_renderer
from platoon.renderers.tokenizers import TokenizersTokenizer
from platoon.renderers.toy import toy_renderer
from platoon.testing import make_gateway

ROOT = Path(__file__).resolve().parents[3]


class CountingRenderer:
    """The toy renderer, counting its renders."""

    def __init__(self) -> None:
        self.inner = toy_renderer()
        self.tokenizer = self.inner.tokenizer
        self.renders = 0

    def render_prompt(self, messages: list[dict[str, Any]], tools: Any = None, **kwargs: Any) -> list[int]:
        self.renders += 1
        return list(self.inner.render_prompt(messages, tools=tools, **kwargs))

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def test_a_prompt_that_cannot_fit_is_refused_before_it_renders():
    renderer = CountingRenderer()
    gateway = make_gateway(["fits"], renderer=renderer, context_window_length=1000)
    rollout = gateway.open_rollout()
    agent = gateway.open_agent(rollout)
    gateway.set_call_cap(agent, 1)
    long = [{"role": "user", "content": "word " * 20_000}]
    with pytest.raises(ContextWindowExceeded) as caught:
        asyncio.run(gateway.chat(agent, long))
    assert renderer.renders == 0  # refused on the bound: nothing rendered
    refused = caught.value
    assert refused.at_least and refused.window == 1000 and refused.prompt_tokens >= 1000
    assert "resulted in at least" in refused.message and refused.code == "context_length_exceeded"
    assert refused.prompt_tokens <= len(renderer.inner.render_prompt(long))  # a true lower bound
    assert agent.context_overflows == 1 and agent.gateway_errors == 0 and agent.calls == []

    # Under the bound but over the window: rendered, and the exact count refuses it.
    near = [{"role": "user", "content": "word " * 300}]
    with pytest.raises(ContextWindowExceeded) as caught:
        asyncio.run(gateway.chat(agent, near))
    assert renderer.renders == 1 and not caught.value.at_least
    assert caught.value.prompt_tokens == len(renderer.inner.render_prompt(near))
    assert agent.context_overflows == 2

    # The refused calls gave their budgeted step back: the one step left samples a prompt that fits.
    reply = asyncio.run(gateway.chat(agent, [{"role": "user", "content": "hi"}]))
    assert reply.message["content"] == "fits"


def test_the_bound_is_skipped_without_a_readable_vocabulary():
    class Opaque:  # a tokenizer with no `tokenizers` backend (a slow or tiktoken-based one)
        def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
            return list(text.encode())

    assert token_span(Opaque()) is None
    assert token_span(None) is None


def _tokenizer_dir(name: str) -> Path:
    base = Path(os.environ.get("PLATOON_TEST_TOKENIZERS") or ROOT / ".cache" / "test-tokenizers")
    path = base / name
    if not (path / "tokenizer.json").is_file():
        pytest.fail(
            f"the real {name} tokenizer is not at {path}: run `uv run python scripts/fetch_test_tokenizers.py` once",
            pytrace=False,
        )
    return path


#: Texts built against the bound: runs of the longest token (128 spaces), decomposed Hangul that NFC composes
#: three bytes into one, combining marks, 4-byte letters, emoji, special-token text, whitespace that templates trim.
TEXTS = {
    "plain": "The quick brown fox jumps over the lazy dog. " * 200,
    "space_runs": (" " * 128 + "x") * 100,
    "decomposed_hangul": unicodedata.normalize("NFD", "한국어 텍스트 ") * 300,
    "combining_marks": "e\u0301" * 1000,
    "math_letters": "\U0001d400\U0001d401\U0001d402 " * 300,  # mathematical bold A, B, C
    "emoji": "🙂" * 500,
    "special_token_text": "<|im_start|><|endoftext|><|eot_id|><|start|>" * 100,
    "trimmed_whitespace": "\n" * 3000 + "x" + " " * 3000,
    "digits": "1234567890" * 300,
}
RENDERERS = {
    "qwen3": ["qwen3", "qwen3_instruct", "role_colon"],
    "llama3": ["llama3"],
    "deepseek_v3": ["deepseekv3"],
    "gpt_oss": ["gpt_oss_no_sysprompt"],
}
SPANS = {
    "qwen3": TokenSpan(max_bytes=128, shrink=3),  # NFC
    "llama3": TokenSpan(max_bytes=128, shrink=1),
    "deepseek_v3": TokenSpan(max_bytes=128, shrink=1),
    "gpt_oss": TokenSpan(max_bytes=128, shrink=1),
}


@pytest.mark.parametrize("tokenizer_name", sorted(RENDERERS))
def test_the_bound_never_exceeds_the_real_prompt_length(tokenizer_name: str):
    tokenizer = TokenizersTokenizer.from_directory(_tokenizer_dir(tokenizer_name))
    span = token_span(tokenizer)
    assert span == SPANS[tokenizer_name]
    for renderer_name in RENDERERS[tokenizer_name]:
        renderer = get_renderer(renderer_name, tokenizer)
        for name, text in TEXTS.items():
            call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
            messages = [
                {"role": "system", "content": text},
                {"role": "user", "content": text},
                {"role": "assistant", "content": "ok", "tool_calls": [call]},
                {"role": "tool", "tool_call_id": "c1", "name": "f", "content": text},
                {"role": "user", "content": [{"type": "text", "text": text}]},
            ]
            floor = prompt_token_floor(messages, span)
            length = len(renderer.render_prompt(messages))
            assert 0 < floor <= length, (renderer_name, name, floor, length)
