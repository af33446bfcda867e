"""The Qwen3 renderers against Qwen3's own chat template (transformers' `apply_chat_template`, real tokenizer).

`qwen3`, `qwen3_instruct` and `qwen3_disable_thinking` reproduce tinker-cookbook 0.3's renders (the golden files in
testdata/renders); where those are silent they write what the model's template writes. So a conversation renders
to the template's tokens except where a golden case pins the cookbook's different behaviour. Each such difference
is a `Pin`: a rewrite of the template's text into the cookbook's, naming the golden cases that show it.

- Every qwen3-family golden render (5 renderers x the qwen3 and toy tokenizers, prompts and supervised examples)
  equals the template's render plus exactly the pins its case names: each pin is the reference's behaviour, and
  nothing else differs.
- Every conversation below renders to the template's tokens plus the pins it names, and a pinned conversation does
  differ from the template (a pin is never vacuous).
- The `chat_template` renderer renders every conversation exactly as `apply_chat_template` does.

docs/gateway.md ("Where the named renderers differ from the model's template") lists the same differences.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from platoon.renderers import get_renderer
from platoon.testing import toy_tokenizer

from .test_golden_renders import golden

HEAD = "<|im_start|>assistant\n"
Messages = list[dict[str, Any]]


# ---- the pinned differences ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Render:
    """What a rewrite needs to know about the render: the OpenAI messages and tools, whether the last message is
    a supervised target (not a prompt), and whether the template ran with thinking on."""

    messages: Messages
    tools: list[dict[str, Any]] | None
    target: bool
    thinking: bool


@dataclass(frozen=True)
class Pin:
    """A difference from the template that the golden renders pin: `rewrite` turns the template's text into the
    cookbook's (None: the text is the same and only its tokenization differs, see `by_turn`)."""

    key: str
    what: str
    #: the golden case ids (the same in every qwen3-family file) that show it; the first is cited in the docs
    golden_cases: tuple[str, ...]
    rewrite: Callable[[str, Render], str] | None


def _last_query(messages: Messages) -> int:
    # The template's `last_query_index`: the last user message that is not a tool response (tool results are
    # `tool` messages here, so every user message is a query).
    return max((i for i, m in enumerate(messages) if m["role"] == "user"), default=-1)


def _newline_before_first_call(text: str, r: Render) -> str:
    # The template writes no newline between an empty content and the first call; the cookbook writes "\n" + calls.
    return re.sub(
        r"(<\|im_start\|>assistant\n(?:<think>(?:(?!<\|im_).)*?</think>(?:\n\n)?)?)<tool_call>",
        r"\1\n<tool_call>",
        text,
        flags=re.DOTALL,
    )


def _one_turn_per_result(text: str, r: Render) -> str:
    return text.replace(
        "</tool_response>\n<tool_response>", "</tool_response><|im_end|>\n<|im_start|>user\n<tool_response>"
    )


def _drop_reasoning_after_query(text: str, r: Render) -> str:
    # The template keeps the reasoning of assistant turns after the last query; the cookbook drops the thinking of
    # every assistant turn but the last.
    query = _last_query(r.messages)
    for i, message in enumerate(r.messages):
        last = r.target and i == len(r.messages) - 1
        reasoning = message.get("reasoning_content")
        if message["role"] == "assistant" and i > query and reasoning and not last:
            block = HEAD + "<think>\n" + reasoning.strip("\n") + "\n</think>\n\n"
            assert block in text
            text = text.replace(block, HEAD, 1)
    return text


def _keep_inline_think(text: str, r: Render) -> str:
    # The template splits `<think>...</think>` out of a string content and drops it before the last query; the
    # cookbook keeps the string as written.
    query = _last_query(r.messages)
    for i, message in enumerate(r.messages):
        content = message.get("content") or ""
        if message["role"] == "assistant" and i < query and "</think>" in content:
            written = HEAD + content.split("</think>")[-1].lstrip("\n")
            assert written in text
            text = text.replace(written, HEAD + content, 1)
    return text


def _cookbook_tool_spec(text: str, r: Render) -> str:
    # The template writes each OpenAI tool as given; the cookbook writes its three-key ToolSpec (a missing
    # description is "", missing parameters an empty object schema, other keys dropped).
    for tool in r.tools or []:
        function = tool["function"]
        spec = {
            "name": function["name"],
            "description": function.get("description") or "",
            "parameters": function.get("parameters") or {"type": "object", "properties": {}},
        }
        written = json.dumps(tool, ensure_ascii=False)
        assert written in text
        text = text.replace(written, json.dumps({"type": "function", "function": spec}, ensure_ascii=False))
    return text


def _target_turn(text: str, r: Render) -> str:
    # The template writes the last assistant turn as `<think>\n{reasoning}\n</think>\n\n` + content with its
    # leading newlines stripped (an empty block when there is no reasoning) and ends the text with "\n"; the
    # cookbook writes a thinking part as `<think>{thinking}</think>`, no block without one (`qwen3_disable_thinking`
    # opens its turn with the empty block), the content as written, and no newline after the last `<|im_end|>`.
    assert r.target and text.endswith("<|im_end|>\n")
    text = text[:-1]
    message = r.messages[-1]
    reasoning, content = message.get("reasoning_content"), message.get("content") or ""
    start = text.rindex(HEAD) + len(HEAD)
    written = "<think>\n" + (reasoning or "").strip("\n") + "\n</think>\n\n" + content.lstrip("\n")
    if reasoning:
        cookbook = f"<think>{reasoning}</think>" + content
    else:
        cookbook = ("" if r.thinking else "<think>\n\n</think>\n\n") + content
    assert text[start:].startswith(written)
    return text[:start] + cookbook + text[start + len(written) :]


EMPTY_CONTENT_NEWLINE = Pin(
    "a",
    "a newline before the first <tool_call> when the content is empty",
    ("tool_call_roundtrip", "reasoning_tool_call", "tool_call_only_target"),
    _newline_before_first_call,
)
TOOL_RESULT_TURNS = Pin(
    "b", "consecutive tool results in separate user turns", ("parallel_tool_calls",), _one_turn_per_result
)
REASONING_AFTER_QUERY = Pin(
    "e",
    "the reasoning of assistant turns after the last user query is dropped from history",
    ("reasoning_tool_call",),
    _drop_reasoning_after_query,
)
INLINE_THINK = Pin(
    "f",
    "inline <think> in a history assistant string is kept as written",
    ("string_think_content",),
    _keep_inline_think,
)
TOOL_SPEC = Pin(
    "g",
    "tools written as the cookbook's {name, description, parameters} spec",
    ("tools_offered_no_call",),
    _cookbook_tool_spec,
)
TURN_BY_TURN = Pin(
    "h",
    "each turn's header and body are tokenized apart (a body starting with newlines tokenizes differently)",
    ("reasoning_history", "whitespace"),
    None,
)
TARGET_TURN = Pin(
    "i",
    "the supervised target turn: thinking as <think>{text}</think>, no empty block, no final newline",
    ("single_user", "reasoning_last"),
    _target_turn,
)
#: in the order the rewrites apply
PINS = [
    TARGET_TURN,
    TOOL_SPEC,
    REASONING_AFTER_QUERY,
    INLINE_THINK,
    EMPTY_CONTENT_NEWLINE,
    TOOL_RESULT_TURNS,
    TURN_BY_TURN,
]


def apply_pins(text: str, r: Render, pins: list[Pin]) -> str:
    for pin in PINS:
        if pin in pins and pin.rewrite is not None:
            text = pin.rewrite(text, r)
    return text


_TURN_HEADER = re.compile(r"<\|im_start\|>(?:system|user|assistant)\n(?:<think>\n\n</think>\n\n)?")


def encode_by_turn(tokenizer: Any, text: str) -> list[int]:
    """The text tokenized as the renderers do: each turn's header (with a disable-thinking empty block) apart
    from its body."""
    ids: list[int] = []
    pos = 0
    for match in _TURN_HEADER.finditer(text):
        for piece in (text[pos : match.start()], match.group(0)):
            if piece:
                ids.extend(tokenizer.encode(piece, add_special_tokens=False))
        pos = match.end()
    if pos < len(text):
        ids.extend(tokenizer.encode(text[pos:], add_special_tokens=False))
    return ids


# ---- fixtures ------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def hf_tokenizer(qwen3_tokenizer_dir: Path) -> Any:
    """The real Qwen3 tokenizer through transformers: it carries Qwen3's chat template."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(qwen3_tokenizer_dir))


def template_text(
    hf_tokenizer: Any, messages: Messages, tools: Any, *, prompt: bool = True, thinking: bool = True
) -> str:
    """`apply_chat_template`'s text (null content as "", which the template needs)."""
    cleaned = [dict(m, content=m.get("content") or "") for m in messages]
    kwargs = {} if thinking else {"enable_thinking": False}
    text = hf_tokenizer.apply_chat_template(
        cleaned, tools=tools, add_generation_prompt=prompt, tokenize=False, **kwargs
    )
    return str(text)


# ---- 1. the golden renders are the template's render plus their pins ------------------------------------------

FAMILY = ["qwen3", "qwen3_instruct", "qwen3_disable_thinking", "qwen3_vl", "qwen3_vl_instruct"]
GOLDEN_CASES = [
    "single_user",
    "system_user",
    "multi_turn",
    "tool_call_roundtrip",
    "parallel_tool_calls",
    "tools_offered_no_call",
    "tool_call_only_target",
    "reasoning_last",
    "reasoning_history",
    "reasoning_tool_call",
    "unicode",
    "whitespace",
    "string_think_content",
]


def golden_pins(case_id: str, kind: str) -> list[Pin]:
    """The pins a golden case names, plus the target-turn pin for every supervised example."""
    pins = [p for p in PINS if case_id in p.golden_cases and p is not TARGET_TURN]
    return [*pins, TARGET_TURN] if kind == "supervised_example" else pins


@pytest.mark.parametrize("tok", ["qwen3", "toy"])
@pytest.mark.parametrize("name", FAMILY)
def test_golden_renders_are_the_template_plus_their_pins(
    name: str, tok: str, hf_tokenizer: Any, qwen3_tokenizer: Any
) -> None:
    tokenizer = qwen3_tokenizer if tok == "qwen3" else toy_tokenizer()
    thinking = name != "qwen3_disable_thinking"
    cases = {c["id"]: c for c in golden(name, tok)["cases"]}
    assert sorted(cases) == sorted(GOLDEN_CASES)
    shown: set[tuple[str, str]] = set()  # (case, pin key) where the pin changes one of the case's renders
    for case_id, case in cases.items():
        for kind in ("generation_prompt", "supervised_example"):
            target = kind == "supervised_example"
            messages = case["conversation"] if target else case["conversation"][:-1]
            r = Render(messages, case["tools"], target, thinking)
            text = template_text(hf_tokenizer, messages, case["tools"], prompt=not target, thinking=thinking)
            pins = golden_pins(case_id, kind)
            pinned = apply_pins(text, r, pins)
            where = f"{name}--{tok}.json {case_id} {kind}"
            assert encode_by_turn(tokenizer, pinned) == case[kind]["ids"], where
            if tokenizer.encode(pinned, add_special_tokens=False) != case[kind]["ids"]:
                # The cookbook's newline before a call starts that body with "\n" too (tokenized apart).
                assert {TURN_BY_TURN, EMPTY_CONTENT_NEWLINE} & set(pins), f"{where}: differs in tokenization"
                shown.add((case_id, TURN_BY_TURN.key))
            for pin in pins:
                if pin.rewrite is not None and pin.rewrite(text, r) != text:
                    shown.add((case_id, pin.key))
    # Each pin is a real difference in every case it names (tokenization shows only over a BPE tokenizer).
    for pin in PINS:
        if pin is TURN_BY_TURN and tok == "toy":
            continue
        for case_id in pin.golden_cases:
            assert (case_id, pin.key) in shown, (
                f"{name}--{tok}.json: pin {pin.key} does not show in {case_id}"
            )


# ---- 2. ordinary conversations --------------------------------------------------------------------------------

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather for a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
CLOCK = {
    "type": "function",
    "function": {
        "name": "get_time",
        "description": "The local time in a timezone.",
        "parameters": {"type": "object", "properties": {"tz": {"type": "string"}}, "required": ["tz"]},
    },
}
METEO = {
    "type": "function",
    "function": {
        "name": "météo",
        "description": "Donne la météo — 天気",
        "parameters": {
            "type": "object",
            "properties": {"ville": {"type": "string", "description": "Nom de la ville, ex. Zürich"}},
            "required": ["ville"],
        },
    },
}


def user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


def system(text: str) -> dict[str, Any]:
    return {"role": "system", "content": text}


def assistant(text: str | None, **extra: Any) -> dict[str, Any]:
    return {"role": "assistant", "content": text, **extra}


def call(n: int, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    # Arguments as a client sends them: a JSON string, non-ASCII written as is.
    body = {"name": name, "arguments": json.dumps(arguments, ensure_ascii=False)}
    return {"id": f"call_{n}", "type": "function", "function": body}


def result(n: int, text: str) -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": f"call_{n}", "content": text}


@dataclass(frozen=True)
class Conversation:
    id: str
    messages: Messages
    tools: list[dict[str, Any]] | None = None
    pins: tuple[Pin, ...] = ()

    @property
    def has_reasoning(self) -> bool:
        return any(m.get("reasoning_content") or "<think>" in (m.get("content") or "") for m in self.messages)


A, B, E, F, H = EMPTY_CONTENT_NEWLINE, TOOL_RESULT_TURNS, REASONING_AFTER_QUERY, INLINE_THINK, TURN_BY_TURN
CONVERSATIONS = [
    Conversation("plain", [user("What is the capital of France?")]),
    Conversation("system", [system("Be brief."), user("Hi")]),
    Conversation(
        "multi_turn", [system("Be brief."), user("Hi, I am Ada."), assistant("Hello Ada!"), user("My name?")]
    ),
    Conversation(
        "unicode", [user("Écris こんにちは 👋🏽"), assistant("こんにちは ✓ — «bonjour»"), user("Merci")]
    ),
    Conversation(
        "tools_offered_no_call",
        [system("You help."), user("A joke?"), assistant("No."), user("Please")],
        [WEATHER, CLOCK],
    ),
    Conversation("tools_without_system", [user("Weather in Oslo?")], [WEATHER]),
    Conversation(
        "call_with_content",
        [
            system("Bot."),
            user("Paris?"),
            assistant("Let me check.", tool_calls=[call(1, "get_weather", {"city": "Paris"})]),
            result(1, "18C"),
        ],
        [WEATHER],
    ),
    Conversation(
        "call_null_content",
        [
            user("Paris?"),
            assistant(None, tool_calls=[call(1, "get_weather", {"city": "Paris"})]),
            result(1, "18C"),
        ],
        [WEATHER],
        (A,),
    ),
    Conversation(
        "parallel_calls",
        [
            user("Tokyo weather and Berlin time?"),
            assistant(
                "Both.",
                tool_calls=[
                    call(1, "get_weather", {"city": "Tokyo"}),
                    call(2, "get_time", {"tz": "Europe/Berlin"}),
                ],
            ),
            result(1, "22C"),
            result(2, "14:05"),
        ],
        [WEATHER, CLOCK],
        (B,),
    ),
    Conversation(
        "parallel_calls_null_content",
        [
            user("Tokyo weather and Berlin time?"),
            assistant(
                None,
                tool_calls=[
                    call(1, "get_weather", {"city": "Tokyo"}),
                    call(2, "get_time", {"tz": "Europe/Berlin"}),
                ],
            ),
            result(1, "22C"),
            result(2, "14:05"),
        ],
        [WEATHER, CLOCK],
        (A, B),
    ),
    Conversation(
        "three_results",
        [
            user("Three cities?"),
            assistant("Sure.", tool_calls=[call(i, "get_weather", {"city": c}) for i, c in enumerate("XYZ")]),
            result(0, "1"),
            result(1, "2"),
            result(2, "3"),
        ],
        [WEATHER],
        (B,),
    ),
    Conversation(
        "non_ascii_arguments",
        [
            user("Beijing?"),
            assistant("Checking.", tool_calls=[call(1, "get_weather", {"city": "北京"})]),
            result(1, "晴"),
        ],
        [WEATHER],
    ),
    Conversation("non_ascii_schema", [system("Réponds en français."), user("Météo à Zürich ?")], [METEO]),
    Conversation(
        "non_ascii_call_and_schema",
        [
            user("Zürich ?"),
            assistant("Je regarde.", tool_calls=[call(1, "météo", {"ville": "Zürich"})]),
            result(1, "☀️ 22 °C"),
        ],
        [METEO],
    ),
    Conversation(
        "nested_arguments",
        [
            user("Forecast?"),
            assistant(
                "Ok.",
                tool_calls=[
                    call(
                        1,
                        "get_weather",
                        {"city": "Paris", "opts": {"days": [1, 2], "unit": None, "hourly": True}},
                    )
                ],
            ),
            result(1, '{"ok": true}'),
        ],
        [WEATHER],
    ),
    Conversation(
        "two_rounds_of_tools",
        [
            system("Bot."),
            user("Paris?"),
            assistant("On it.", tool_calls=[call(1, "get_weather", {"city": "Paris"})]),
            result(1, "18C"),
            assistant("18C in Paris."),
            user("And Rome?"),
            assistant("Again.", tool_calls=[call(2, "get_weather", {"city": "Rome"})]),
            result(2, "25C"),
        ],
        [WEATHER],
    ),
    Conversation(
        "two_rounds_null_content",
        [
            user("Paris?"),
            assistant(None, tool_calls=[call(1, "get_weather", {"city": "Paris"})]),
            result(1, "18C"),
            assistant("18C."),
            user("Rome?"),
            assistant(None, tool_calls=[call(2, "get_weather", {"city": "Rome"})]),
            result(2, "25C"),
        ],
        [WEATHER],
        (A,),
    ),
    Conversation(
        "reasoning_before_the_last_query",
        [user("2 + 2?"), assistant("4", reasoning_content="Simple addition."), user("Times 3?")],
    ),
    Conversation(
        "reasoning_after_the_last_query",
        [
            user("Rain in London?"),
            assistant(
                "Checking.",
                reasoning_content="I should look it up.",
                tool_calls=[call(1, "get_weather", {"city": "London"})],
            ),
            result(1, "rain"),
        ],
        [WEATHER],
        (E,),
    ),
    Conversation(
        "reasoning_after_the_last_query_null_content",
        [
            user("Rain in London?"),
            assistant(
                None,
                reasoning_content="I should look it up.",
                tool_calls=[call(1, "get_weather", {"city": "London"})],
            ),
            result(1, "rain"),
        ],
        [WEATHER],
        (E, A),
    ),
    Conversation(
        "reasoning_on_both_sides_of_the_last_query",
        [
            user("Paris?"),
            assistant(
                "Ok.", reasoning_content="Look it up.", tool_calls=[call(1, "get_weather", {"city": "Paris"})]
            ),
            result(1, "18C"),
            assistant("18C.", reasoning_content="Answer."),
            user("Rome?"),
        ],
        [WEATHER],
    ),
    Conversation(
        "inline_think_in_history",
        [user("Hi"), assistant("<think>\nhmm\n</think>\n\nHello!"), user("Bye")],
        pins=(F,),
    ),
    Conversation(
        "inline_think_after_the_last_query",
        [
            user("Rain?"),
            assistant(
                "<think>\nLook it up.\n</think>\n\nChecking.",
                tool_calls=[call(1, "get_weather", {"city": "London"})],
            ),
            result(1, "rain"),
        ],
        [WEATHER],
    ),
    Conversation(
        "content_starting_with_newlines", [user("2 + 2?"), assistant("\n\n4"), user("Times 3?")], pins=(H,)
    ),
]
NAMED = ["qwen3", "qwen3_instruct", "qwen3_disable_thinking"]


def _conversation_params() -> list[Any]:
    params = []
    for name in NAMED:
        for conversation in CONVERSATIONS:
            # Qwen3-Instruct-2507 writes no reasoning: its conversations with reasoning are not meaningful.
            if name == "qwen3_instruct" and conversation.has_reasoning:
                continue
            params.append(pytest.param(name, conversation, id=f"{name}/{conversation.id}"))
    return params


def test_the_conversations_cover_the_brief() -> None:
    assert len(CONVERSATIONS) >= 20
    # The tool-spec (g) and target-turn (i) pins show in the goldens above, not in generation prompts here.
    pinned = {pin.key for c in CONVERSATIONS for pin in c.pins}
    assert pinned == {"a", "b", "e", "f", "h"}


@pytest.mark.parametrize(("name", "conversation"), _conversation_params())
def test_named_renderer_renders_the_template_but_for_its_pins(
    name: str, conversation: Conversation, hf_tokenizer: Any, qwen3_tokenizer: Any
) -> None:
    thinking = name != "qwen3_disable_thinking"
    renderer = get_renderer(name, qwen3_tokenizer)
    got = renderer.render_prompt(conversation.messages, tools=conversation.tools)
    text = template_text(hf_tokenizer, conversation.messages, conversation.tools, thinking=thinking)
    template_ids = hf_tokenizer.encode(text, add_special_tokens=False)
    if not conversation.pins:
        assert got == template_ids, qwen3_tokenizer.decode(got)
        return
    r = Render(conversation.messages, conversation.tools, False, thinking)
    pins = list(conversation.pins)
    pinned = apply_pins(text, r, pins)
    expected = encode_by_turn(qwen3_tokenizer, pinned)
    assert got == expected, qwen3_tokenizer.decode(got)
    assert got != template_ids  # the pin is a real difference here
    for pin in pins:
        if pin.rewrite is not None:
            assert pin.rewrite(text, r) != text, f"{pin.key} does not apply to {conversation.id}"


@pytest.mark.parametrize("conversation", CONVERSATIONS, ids=lambda c: c.id)
def test_chat_template_renders_exactly_the_template(conversation: Conversation, hf_tokenizer: Any) -> None:
    renderer = get_renderer("chat_template", hf_tokenizer)
    text = template_text(hf_tokenizer, conversation.messages, conversation.tools)
    assert renderer.render_prompt(conversation.messages, tools=conversation.tools) == hf_tokenizer.encode(
        text, add_special_tokens=False
    )


@pytest.mark.parametrize(
    "arguments",
    ['{"city":"Paris"}', '{"city": "\\u5317\\u4eac"}', '{"days": 1e1, "city": "Paris"}'],
    ids=["compact", "ascii_escaped", "exponent"],
)
def test_argument_strings_are_rendered_as_the_template_renders_their_object(
    arguments: str, hf_tokenizer: Any, qwen3_tokenizer: Any
) -> None:
    """The one place both renderers differ from `apply_chat_template` given OpenAI messages: an arguments string
    that is not in `tojson`'s form. The template writes a string verbatim; `chat_template` parses it into an object
    first (as vLLM does, for templates that iterate arguments) and `qwen3` re-serialises it (the cookbook's
    json.loads/json.dumps), so both write what the template writes for the object."""
    as_string = [
        user("Weather?"),
        assistant(
            "Ok.",
            tool_calls=[
                {"id": "c", "type": "function", "function": {"name": "get_weather", "arguments": arguments}}
            ],
        ),
        result(0, "r"),
    ]
    as_object = json.loads(json.dumps(as_string))
    as_object[1]["tool_calls"][0]["function"]["arguments"] = json.loads(arguments)
    verbatim = hf_tokenizer.encode(
        template_text(hf_tokenizer, as_string, [WEATHER]), add_special_tokens=False
    )
    of_object = hf_tokenizer.encode(
        template_text(hf_tokenizer, as_object, [WEATHER]), add_special_tokens=False
    )
    assert verbatim != of_object
    assert get_renderer("chat_template", hf_tokenizer).render_prompt(as_string, tools=[WEATHER]) == of_object
    assert get_renderer("qwen3", qwen3_tokenizer).render_prompt(as_string, tools=[WEATHER]) == of_object


def test_a_lone_surrogate_in_arguments_still_renders(qwen3_tokenizer: Any) -> None:
    """Non-ASCII is written as is, but a lone surrogate (which JSON can decode, UTF-8 cannot encode) keeps its
    escape, so the prompt still renders."""
    messages = [
        user("x"),
        assistant(
            "Ok.",
            tool_calls=[
                {"id": "c", "type": "function", "function": {"name": "f", "arguments": '{"s": "\\ud800 é"}'}}
            ],
        ),
        result(0, "r"),
    ]
    text = qwen3_tokenizer.decode(get_renderer("qwen3", qwen3_tokenizer).render_prompt(messages))
    assert '{"name": "f", "arguments": {"s": "\\ud800 \\u00e9"}}' in text
