"""platoon's Kimi, Nemotron-3 and Qwen3.5 renderers reproduce tinker-cookbook 0.3.0's renders (testdata/renders).

Every case of kimi_k2, kimi_k25, kimi_k25_disable_thinking, nemotron3, nemotron3_disable_thinking, qwen3_5 and
qwen3_5_disable_thinking over the toy and the real Qwen3 tokenizer (logic tests: neither is these models' own
vocabulary): prompts, supervised examples, tool prefixes, parses, stops, the gateway adapter, round trips.
"""

from __future__ import annotations

import json
import warnings
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from platoon.renderers import RendererError, get_renderer
from platoon.testing import toy_tokenizer

from .test_golden_renders import renders_dir

REPO = Path(__file__).resolve().parents[3]
RENDERERS = [
    "kimi_k2",
    "kimi_k25",
    "kimi_k25_disable_thinking",
    "nemotron3",
    "nemotron3_disable_thinking",
    "qwen3_5",
    "qwen3_5_disable_thinking",
]
TOKENIZERS = {"toy": "toy", "qwen3": "real_qwen3"}  # golden file suffix -> test id prefix
THINKING = {"kimi_k2", "kimi_k25", "nemotron3", "qwen3_5"}


@cache
def golden(renderer: str, tokenizer: str) -> dict[str, Any]:
    return json.loads((renders_dir() / f"{renderer}--{tokenizer}.json").read_text("utf-8"))


@pytest.fixture
def tokenizer_for(request: pytest.FixtureRequest) -> Any:
    def get(tok: str) -> Any:
        return toy_tokenizer() if tok == "toy" else request.getfixturevalue("qwen3_tokenizer")

    return get


# --------------------------------------------------------------------------------------------------------------
# The golden files


def test_every_written_pair_is_covered() -> None:
    index = json.loads((renders_dir() / "index.json").read_text("utf-8"))
    written = {(p["renderer"], p["tokenizer"]) for p in index["pairs"] if p["status"] == "written"}
    ours = {(p["renderer"], p["tokenizer"]) for p in index["pairs"] if p["renderer"] in RENDERERS}
    assert {pair for pair in ours if pair in written} == {(n, t) for n in RENDERERS for t in TOKENIZERS}


# --------------------------------------------------------------------------------------------------------------
# Render -> sample -> parse through the gateway adapter

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Get the weather.",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
                "required": ["city"],
            },
        },
    }
]


def _target(name: str) -> dict[str, Any]:
    """The assistant turn the "model" writes: Kimi ids are the `functions.name:index` form Kimi models write."""
    kimi = name.startswith("kimi")
    calls = [
        ("get_weather", '{"city": "Oslo", "days": 3}'),
        ("get_weather", '{"city": "Bergen"}'),
    ]
    message: dict[str, Any] = {
        "role": "assistant",
        "content": "Let me look.",
        "tool_calls": [
            {
                "id": f"functions.{fn}:{i}" if kimi else f"call_{i}",
                "type": "function",
                "function": {"name": fn, "arguments": args},
            }
            for i, (fn, args) in enumerate(calls)
        ],
    }
    if name in THINKING:
        message["reasoning_content"] = "I should check the weather."
    return message


@pytest.mark.parametrize("tok", list(TOKENIZERS), ids=list(TOKENIZERS.values()))
@pytest.mark.parametrize("name", RENDERERS)
def test_tool_calls_round_trip_through_the_gateway_adapter(name: str, tok: str, tokenizer_for: Any) -> None:
    renderer = get_renderer(name, tokenizer_for(tok))
    history = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather in Oslo and Bergen?"},
    ]
    target = _target(name)
    prompt = renderer.render_prompt(history, tools=TOOLS)
    full = renderer.apply_tools(renderer.to_renderer_messages([*history, target]), TOOLS)
    model_input = renderer.build_supervised_example(full)[0]
    ids = model_input.to_ints()
    assert (
        ids[: len(prompt)] == prompt
    )  # these targets are what the prompt (and its prefill) lets the model write
    completion = ids[len(prompt) :]
    assert renderer.tokenizer.decode(completion).endswith("<|im_end|>")

    parsed = renderer.parse_completion(completion, "stop")
    assert parsed.ok and parsed.finish_reason == "tool_calls"
    assert (parsed.parsed_tool_calls, parsed.emitted_tool_calls, parsed.unparsed_tool_calls) == (2, 2, 0)
    message = parsed.message
    assert message["content"] == target["content"]
    assert message["reasoning_content"] == target.get("reasoning_content")
    got = [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in message["tool_calls"]]
    assert got == [
        (c["function"]["name"], json.loads(c["function"]["arguments"])) for c in target["tool_calls"]
    ]
    if name.startswith("kimi"):
        assert [c["id"] for c in message["tool_calls"]] == [c["id"] for c in target["tool_calls"]]

    # Rendering the parsed message back gives the very tokens the model wrote.
    again = renderer.apply_tools(renderer.to_renderer_messages([*history, message]), TOOLS)
    assert renderer.build_supervised_example(again)[0].to_ints() == ids

    # Cut by the length limit: the calls are not emitted, their text stays in the content.
    cut = renderer.parse_completion(completion[:-1], "length")
    assert cut.finish_reason == "length" and cut.message["tool_calls"] is None
    assert "get_weather" in cut.message["content"]


@pytest.mark.parametrize("name", RENDERERS)
def test_truncated_completions_never_raise(name: str) -> None:
    renderer = get_renderer(name, toy_tokenizer())
    text = "<think>\nhmm" if name not in THINKING else "still reasoning"
    parsed = renderer.parse_completion(renderer.tokenizer.encode(text), "length")
    assert not parsed.ok and parsed.finish_reason == "length"
    if name in {"kimi_k25", "nemotron3", "qwen3_5"}:
        # the prompt opened a think block the completion never closed
        assert parsed.message["reasoning_content"] == "still reasoning" and parsed.message["content"] == ""
    for cut in ("<tool_call>\n<function=f>", "<|tool_calls_section_begin|><|tool_call_begin|>functions.f:0"):
        parsed = renderer.parse_completion(renderer.tokenizer.encode("Hi " + cut), "length")
        assert parsed.message["tool_calls"] is None


# --------------------------------------------------------------------------------------------------------------
# The multi-turn prefix (extension) property

#: what the model writes after the first prompt, with no reasoning, and whether the next prompt extends
#: prompt + completion. It does not where history drops the think block the prompt opened (qwen3_5, nemotron3:
#: the `<think>\n` prefill) or writes history without the disable-thinking block (qwen3_5_disable_thinking).
PLAIN_REPLY = {
    "kimi_k2": ("<think></think>Hi there.<|im_end|>", True),
    "kimi_k25": ("</think>Hi there.<|im_end|>", True),
    "kimi_k25_disable_thinking": ("Hi there.<|im_end|>", True),
    "nemotron3": ("</think>\nHi there.<|im_end|>", False),
    "nemotron3_disable_thinking": ("Hi there.<|im_end|>", True),
    "qwen3_5": ("</think>\n\nHi there.<|im_end|>", False),
    "qwen3_5_disable_thinking": ("Hi there.<|im_end|>", False),
}
#: the same with reasoning: history drops it in every thinking renderer, so the property never holds
THINKING_REPLY = {
    "kimi_k2": "<think>Greet back.</think>Hi there.<|im_end|>",
    "kimi_k25": "Greet back.</think>Hi there.<|im_end|>",
    "nemotron3": "Greet back.\n</think>\nHi there.<|im_end|>",
    "qwen3_5": "Greet back.\n</think>\n\nHi there.<|im_end|>",
}


def _extends(renderer: Any, reply: str) -> bool:
    first = [{"role": "user", "content": "Hello"}]
    prompt = renderer.build_generation_prompt(first).to_ints()
    completion = renderer.tokenizer.encode(reply)
    message, ok = renderer.parse_response(completion)
    assert ok
    second = renderer.build_generation_prompt([*first, message, {"role": "user", "content": "Bye"}]).to_ints()
    grown = prompt + completion
    return second[: len(grown)] == grown


@pytest.mark.parametrize("tok", list(TOKENIZERS), ids=list(TOKENIZERS.values()))
@pytest.mark.parametrize("name", RENDERERS)
def test_multi_turn_prefix_property(name: str, tok: str, tokenizer_for: Any) -> None:
    renderer = get_renderer(name, tokenizer_for(tok))
    assert renderer.has_extension_property is False  # as the cookbook says for all seven
    reply, holds = PLAIN_REPLY[name]
    assert _extends(renderer, reply) is holds
    if name in THINKING_REPLY:
        assert _extends(renderer, THINKING_REPLY[name]) is False


# --------------------------------------------------------------------------------------------------------------
# Family details beyond the golden cases


def test_kimi_needs_single_token_markers() -> None:
    from tokenizers import Regex
    from tokenizers import Tokenizer as RawTokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import Split

    from platoon.renderers import TokenizersTokenizer

    # One token per character and no chat markers: `<think>` and `<|im_end|>` are several tokens.
    raw = RawTokenizer(WordLevel({chr(c): c for c in range(32, 127)} | {"[UNK]": 127}, unk_token="[UNK]"))
    raw.pre_tokenizer = Split(Regex("."), behavior="isolated")
    plain = TokenizersTokenizer(raw, name_or_path="plain")
    with pytest.raises(RendererError, match="<think>"):
        get_renderer("kimi_k25", plain)
    with pytest.raises(RendererError, match="<\\|im_end\\|>"):
        get_renderer("kimi_k2", plain).get_stop_sequences()


def test_kimi_tool_message_without_name_or_id_warns() -> None:
    renderer = get_renderer("kimi_k2", toy_tokenizer())
    messages = [{"role": "user", "content": "x"}, {"role": "tool", "content": "42"}]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        # an earlier test's socket finalised by the garbage collector here is not the renderer's warning
        warnings.simplefilter("ignore", ResourceWarning)
        text = renderer.tokenizer.decode(renderer.build_generation_prompt(messages).to_ints())
    assert [str(w.message).split(".")[0] for w in caught] == [
        "Tool message missing 'name' field",
        "Tool message missing 'tool_call_id' field",
    ]
    assert "<|im_system|>tool<|im_middle|>## Return of \n42<|im_end|>" in text


def test_kimi_multipart_content() -> None:
    parts = [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]
    messages = [{"role": "user", "content": parts}]
    with pytest.raises(RendererError):
        get_renderer("kimi_k2", toy_tokenizer()).build_generation_prompt(messages)
    chunks = get_renderer("kimi_k25", toy_tokenizer()).generation_prompt_chunks(messages)
    assert chunks[3:6] == [[ord("a")], [ord("b")], [258]]  # part by part, as the cookbook encodes them


KIMI_TOOL = {
    "name": "search",
    "description": "Search things.\nTwo lines.",
    "parameters": {
        "type": "object",
        "$defs": {
            "Filter": {
                "type": "object",
                "description": "A filter.",
                "properties": {"tag": {"type": "string"}},
            }
        },
        "properties": {
            "query": {"type": "string", "description": "What to find", "minLength": 1, "maxLength": 80},
            "limit": {"type": "integer", "minimum": 1, "default": 10},
            "mode": {"enum": ["fast", "exact", 3]},
            "tags": {"type": "array", "items": {"type": "string", "description": "one tag"}, "maxItems": 5},
            "ids": {"type": "array", "items": {"type": "integer"}},
            "filter": {"$ref": "#/$defs/Filter"},
            "either": {"anyOf": [{"type": "string"}, {"type": "null"}]},
            "nullable": {"type": ["number", "null"], "default": "none"},
            "extra": {"type": "object", "additionalProperties": {"type": "boolean"}},
            "anything": {},
        },
        "required": ["query", "mode"],
        "additionalProperties": False,
    },
}
#: tinker-cookbook 0.3.0's `encode_tools_to_typescript_style` output for KIMI_TOOL
KIMI_TOOL_TS = (
    "# Tools\n\n## functions\nnamespace functions {\n"
    "// A filter.\ninterface Filter {\n  tag?: string\n}\n"
    "// Search things.\n// Two lines.\n"
    "type search = (_: {\n"
    '  mode: "fast" | "exact" | 3,\n'
    "  // What to find\n  // maxLength: 80, minLength: 1\n  query: string,\n"
    "  anything?: any,\n"
    "  either?: string | null,\n"
    "  extra?: {\n    [k: string]: boolean\n  },\n"
    "  filter?: Filter,\n"
    "  ids?: Array<number>,\n"
    "  // minimum: 1\n  // Default: 10\n  limit?: number,\n"
    '  // Default: "none"\n  nullable?: number | null,\n'
    "  // maxItems: 5\n  tags?: Array<\n    // one tag\n    string\n  >,\n"
    "  [k: string]: never\n"
    "}) => any;\n}\n"
)


def test_kimi_k25_typescript_tool_declaration() -> None:
    renderer = get_renderer("kimi_k25", toy_tokenizer())
    prefix = renderer.create_conversation_prefix_with_tools([KIMI_TOOL])
    assert prefix == [
        {"role": "tool_declare", "content": KIMI_TOOL_TS},
        {"role": "system", "content": "You are Kimi, an AI assistant created by Moonshot AI."},
    ]


def test_kimi_k25_self_referencing_schema() -> None:
    from platoon.renderers.kimi import encode_tools_typescript

    tool = {
        "name": "tree",
        "parameters": {
            "type": "object",
            "properties": {
                "value": {"type": "string"},
                "children": {"type": "array", "items": {"$ref": "#"}},
            },
        },
    }
    text = encode_tools_typescript([{"type": "function", "function": tool}])
    assert text == (
        "# Tools\n\n## functions\nnamespace functions {\n"
        "interface parameters {\n  value?: string,\n  children?: Array<parameters>\n}\n"
        "type tree = (_: parameters) => any;\n}\n"
    )
    assert encode_tools_typescript([{"type": "plugin"}]) == ""


NEMOTRON_TOOL = {
    "name": "book",
    "description": "  Book a table. ",
    "parameters": {
        "type": "object",
        "properties": {
            "people": {"type": "integer", "description": " How many ", "minimum": 1, "default": 2},
            "when": {"type": ["string", "null"], "enum": ["lunch", "dinner"]},
            "notes": {"type": "array", "items": {"type": "string"}},
        },
        "required": ["people"],
        "additionalProperties": False,
    },
    "strict": True,
}
#: tinker-cookbook 0.3.0's `_format_nemotron3_tool_declaration` output for NEMOTRON_TOOL
NEMOTRON_TOOL_XML = (
    "<function>\n<name>book</name>\n<description>Book a table.</description>\n<parameters>\n"
    "<parameter>\n<name>people</name>\n<type>integer</type>\n<description>How many</description>\n"
    "<minimum>1</minimum>\n<default>2</default>\n</parameter>\n"
    "<parameter>\n<name>when</name>\n<type>['string', 'null']</type>\n<enum>[\"lunch\", \"dinner\"]</enum>\n"
    "</parameter>\n"
    '<parameter>\n<name>notes</name>\n<type>array</type>\n<items>{"type": "string"}</items>\n</parameter>\n'
    '<additionalProperties>False</additionalProperties>\n<required>["people"]</required>\n</parameters>\n'
    "<strict>True</strict>\n</function>"
)


def test_nemotron3_xml_tool_declaration() -> None:
    renderer = get_renderer("nemotron3", toy_tokenizer())
    [system] = renderer.create_conversation_prefix_with_tools([NEMOTRON_TOOL], "Be kind.")
    assert system["content"].startswith(
        "Be kind.\n\n# Tools\n\nYou have access to the following functions:\n\n<tools>\n" + NEMOTRON_TOOL_XML
    )
    assert renderer.create_conversation_prefix_with_tools([], "Only this.") == [
        {"role": "system", "content": "Only this."}
    ]


@pytest.mark.parametrize("name", ["qwen3_5", "nemotron3"])
def test_xml_tool_call_values(name: str) -> None:
    """Scalars are written with Python's `str` and read back as JSON where they parse (the cookbook's rule)."""
    renderer = get_renderer(name, toy_tokenizer())
    call = {"name": "f", "arguments": '{"n": 1.5, "ok": true, "none": null, "s": "x", "obj": {"a": [1]}}'}
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": "", "tool_calls": [call]},
    ]
    text = renderer.tokenizer.decode(renderer.build_supervised_example(messages)[0].to_ints())
    assert "<parameter=ok>\nTrue\n</parameter>" in text and "<parameter=none>\nNone\n</parameter>" in text
    assert '<parameter=obj>\n{"a": [1]}\n</parameter>' in text
    bad: dict[str, Any] = {
        "role": "assistant",
        "content": "",
        "tool_calls": [{"name": "f", "arguments": "[1]"}],
    }
    with pytest.raises(RendererError, match="JSON object"):
        renderer.build_supervised_example([messages[0], bad])
