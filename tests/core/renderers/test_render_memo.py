"""The gateway's memo of an agent's message renders (platoon.renderers.memo) never changes a prompt.

Every golden conversation of every written renderer/tokenizer pair is sent as a harness sends it (the first
message, then each longer prefix, then all of them again), through one agent's history, and each prompt must equal
the renderer's plain render of the same request. The other tests change what a render depends on between calls.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import fields
from typing import Any

import pytest

from platoon.gateway.history import AgentHistory, build_prompt
from platoon.renderers import RenderContext, RendererError, get_renderer
from platoon.renderers.memo import RENDER_MEMO, RenderMemo, Unkeyable, content_key, key_or_none
from platoon.renderers.qwen3 import Qwen3InstructRenderer
from platoon.testing import toy_tokenizer

from .test_golden_renders_more import all_written_pairs, golden, make_renderer
from .test_golden_renders_more import tokenizer_for as tokenizer_for  # the fixture, used by name


def _plain(renderer: Any, messages: list[dict[str, Any]], tools: Any) -> Any:
    try:
        return renderer.render_prompt(messages, tools=tools)
    except RendererError as exc:
        return f"RendererError: {exc}"


def _memoized(renderer: Any, history: AgentHistory, messages: list[dict[str, Any]], tools: Any) -> Any:
    try:
        return build_prompt(renderer, history, messages, tools, {}).rendered
    except RendererError as exc:
        return f"RendererError: {exc}"


@pytest.mark.parametrize(("name", "tok"), all_written_pairs(), ids=lambda v: str(v))
def test_every_golden_conversation_renders_alike_through_the_memo(
    name: str, tok: str, tokenizer_for: Callable[[str], Any]
) -> None:
    renderer = make_renderer(name, tok, tokenizer_for(tok))
    history = AgentHistory()  # one agent for every conversation: the memo also meets messages at other places
    cases = golden(name, tok)["cases"]
    compared = 0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the goldens' warnings are checked in test_golden_renders_more
        for _ in range(2):  # the second round finds every render in the memo
            for case in [*cases, *reversed(cases)]:
                conversation = case["conversation"]
                for end in range(1, len(conversation) + 1):
                    messages = conversation[:end]
                    expected = _plain(renderer, messages, case["tools"])
                    assert _memoized(renderer, history, messages, case["tools"]) == expected, (
                        case["id"],
                        end,
                    )
                    compared += 1
    assert compared > 0


def _qwen3(**kwargs: Any) -> Any:
    return get_renderer("qwen3", toy_tokenizer(), renderer_kwargs=kwargs)


THINKING_TURN = [
    {"role": "user", "content": "Pick a number."},
    {"role": "assistant", "content": "Seven.", "reasoning_content": "Any will do."},
    {"role": "user", "content": "Why?"},
]


def test_a_renderer_setting_changed_between_calls_is_rendered_with() -> None:
    renderer = _qwen3()
    history = AgentHistory()
    stripped = _memoized(renderer, history, THINKING_TURN, None)
    renderer.strip_thinking_from_history = False
    kept = _memoized(renderer, history, THINKING_TURN, None)
    assert kept == _plain(renderer, THINKING_TURN, None)
    assert kept != stripped
    assert "Any will do." in renderer.tokenizer.decode(kept)


def test_a_message_edited_in_place_between_calls_renders_as_it_reads_now() -> None:
    renderer = _qwen3()
    history = AgentHistory()
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    first = _memoized(renderer, history, messages, None)
    messages[1]["content"] = "Hello"
    second = _memoized(renderer, history, messages, None)
    assert second == _plain(renderer, messages, None)
    assert second != first


def test_prompts_and_chunks_handed_out_are_the_callers_own() -> None:
    # The memo's renders are shared with every later call: what a caller does to its prompt must not reach them.
    renderer = _qwen3()
    history = AgentHistory()
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    first = build_prompt(renderer, history, messages, None, {})
    first.tokens[:] = [0] * len(first.tokens)
    assert build_prompt(renderer, history, messages, None, {}).tokens == _plain(renderer, messages, None)
    converted = renderer.to_renderer_messages(messages)
    expected = renderer.generation_prompt_chunks(converted)
    active = RENDER_MEMO.set(history.renders)
    try:
        for chunk in renderer.generation_prompt_chunks(converted):
            chunk[:] = [0] * len(chunk)
        again = renderer.generation_prompt_chunks(converted)
    finally:
        RENDER_MEMO.reset(active)
    assert again == expected


@pytest.mark.parametrize(
    ("one", "other"),
    [
        (1, True),
        (1, 1.0),
        (0.0, -0.0),
        ([1], (1,)),
        ({"a": 1, "b": 2}, {"b": 2, "a": 1}),
        ("1", 1),
        (None, ""),
    ],
)
def test_content_keys_tell_apart_what_renders_differently(one: Any, other: Any) -> None:
    assert content_key(one) != content_key(other)
    assert content_key(one) == content_key(one)
    # A renderer writes tool arguments given as an object with json.dumps: each of these renders differently.
    renderer = _qwen3()
    history = AgentHistory()
    for value in (one, other):
        messages = [
            {"role": "user", "content": "Go"},
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [{"id": "c1", "function": {"name": "f", "arguments": {"x": value}}}],
            },
            {"role": "tool", "tool_call_id": "c1", "content": "ok"},
        ]
        assert _memoized(renderer, history, messages, None) == _plain(renderer, messages, None)


def test_a_value_without_a_content_key_is_rendered_every_time() -> None:
    class Opaque:
        def __str__(self) -> str:
            return "opaque"

    with pytest.raises(Unkeyable):
        content_key({"role": "user", "content": Opaque()})
    assert key_or_none([Opaque()]) is None
    renderer = _qwen3()
    messages = [{"role": "user", "content": "a"}, {"role": "tool", "tool_call_id": "c", "content": "b"}]
    messages[1]["name"] = Opaque()  # type: ignore[assignment]
    history = AgentHistory()
    assert _memoized(renderer, history, messages, None) == _plain(renderer, messages, None)


class CountingRenderer(Qwen3InstructRenderer):
    """qwen3_instruct, counting the messages it renders."""

    def __init__(self, tokenizer: Any) -> None:
        super().__init__(tokenizer)
        self.rendered = 0

    def render_message(self, message: Any, ctx: RenderContext) -> Any:
        self.__dict__["rendered"] += 1  # not through setattr: a changed setting would empty the memo
        return super().render_message(message, ctx)


def _react_conversation(turns: int) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "Guess the number."},
        {"role": "user", "content": "Between 1 and 100."},
    ]
    for turn in range(turns):
        call = {
            "id": f"c{turn}",
            "type": "function",
            "function": {"name": "guess", "arguments": f'{{"n": {turn}}}'},
        }
        messages.append({"role": "assistant", "content": "", "tool_calls": [call]})
        messages.append({"role": "tool", "tool_call_id": f"c{turn}", "content": "Too low."})
    return messages


TOOLS = [
    {"type": "function", "function": {"name": "guess", "parameters": {"type": "object", "properties": {}}}}
]


def test_a_growing_conversation_renders_only_its_new_messages() -> None:
    renderer = CountingRenderer(toy_tokenizer())
    history = AgentHistory()
    per_call = []
    for turns in range(1, 30):
        messages = _react_conversation(turns)
        before = renderer.rendered
        assert _memoized(renderer, history, messages, TOOLS) == _plain(renderer, messages, TOOLS)
        per_call.append(renderer.rendered - before - (len(messages) + 1))  # less the plain render's own
    # The new assistant turn and tool result, the message that was last before, and the generation suffix.
    assert max(per_call[1:]) <= 4


class EncodeCountingRenderer(Qwen3InstructRenderer):
    """qwen3_instruct, counting its encodes (two a message render: the header and the text) and leaving its
    rendering methods as they are, so that its renders are memoized on the little they read (`_turn_memo`)."""

    def __init__(self, tokenizer: Any) -> None:
        super().__init__(tokenizer)
        self.__dict__["encoded"] = 0

    def _encode(self, text: str) -> list[int]:
        self.__dict__["encoded"] += 1
        return super()._encode(text)


def test_a_qwen3_conversation_renders_each_new_message_once() -> None:
    renderer = EncodeCountingRenderer(toy_tokenizer())
    assert renderer._turn_memo() and not CountingRenderer(toy_tokenizer())._turn_memo()
    plain = Qwen3InstructRenderer(toy_tokenizer())
    history = AgentHistory()
    per_call = []
    for turns in range(1, 30):
        messages = _react_conversation(turns)
        before = renderer.encoded
        assert _memoized(renderer, history, messages, TOOLS) == _plain(plain, messages, TOOLS)
        per_call.append((renderer.encoded - before) / 2)
    # The new assistant turn and tool result only: the message that was last and the suffix keep their renders.
    assert per_call[1:] == [2] * 28


def test_a_full_memo_is_emptied_and_renders_stay_right() -> None:
    renderer = _qwen3()
    history = AgentHistory(renders=RenderMemo(limit=8))
    for turns in range(1, 12):
        messages = _react_conversation(turns)
        assert _memoized(renderer, history, messages, TOOLS) == _plain(renderer, messages, TOOLS)
        memo = history.renders
        assert len(memo.renders) + len(memo.converted) + len(memo.prefixes) + len(memo.suffixes) <= 8 + 64
        assert len(memo.ids) <= 8 + 64


def test_the_memo_keys_every_field_of_the_render_context() -> None:
    """`Renderer.generation_prompt_chunks` keys a render on these fields: a new one must join the key."""
    assert [f.name for f in fields(RenderContext)] == ["idx", "is_last", "prev_message", "last_user_index"]


def test_the_message_before_is_part_of_a_render(tokenizer_for: Callable[[str], Any]) -> None:
    """DeepSeek writes no role token for an answer that follows a tool result: the same answer at the same place
    renders differently after another message."""
    renderer = make_renderer("deepseekv3", "deepseek_v3", tokenizer_for("deepseek_v3"))
    history = AgentHistory()
    after_tool = [
        {"role": "user", "content": "Check."},
        {"role": "tool", "tool_call_id": "c1", "content": "ok"},
        {"role": "assistant", "content": "Done."},
        {"role": "tool", "tool_call_id": "c2", "content": "ok"},
    ]
    after_answer = [after_tool[0], {"role": "assistant", "content": "Sure."}, *after_tool[2:]]
    for messages in (after_tool, after_answer):
        assert _memoized(renderer, history, messages, None) == _plain(renderer, messages, None)
