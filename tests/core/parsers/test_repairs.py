"""Parser repairs (issue 17): each class of failure the independent vectors found, tested on its own.

The inputs are written from each format's documentation (Qwen3-Coder's XML call format, Meta's Llama 3.1 JSON tool
calling with `<|python_tag|>`, Mistral's `[TOOL_CALLS]` forms for tokenizers v3/v7 and v11+, Kimi K2's call ids,
OpenAI's Harmony messages, DeepSeek V3.1's tool-call section) and from the forms other servers document reading.

1. qwen3_coder: a parameter missing its `</parameter>` never swallows the next parameter.
2. llama3: JSON calls among prose, after `<|python_tag|>`s, after an invalid object.
3. mistral: `[TOOL_CALLS]NAME{json}` and text before the `[...]` list.
4. Malformed calls reach the agent exactly as sampled, in place (parse_completion and the gateway).
5. kimi_k2: an id that names no function leaves its call unparsed.
6. gpt-oss: every message is read, with or without `<|start|>` between them.
7. Schema typing: `float`, `double`, `int`, `bool`, `dict`, `list` read as JSON Schema's types.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from platoon.renderers.base import get_renderer
from platoon.renderers.chat_template import ChatTemplateRenderer
from platoon.renderers.tool_parsers import ParseResult, get_parser
from platoon.renderers.tool_parsers._common import schema_types, type_value

from .conftest import tokenizer_dir

DS = {k: f"<\uff5ctool\u2581{k.replace('_', chr(0x2581))}\uff5c>" for k in
      ("calls_begin", "calls_end", "call_begin", "call_end", "sep")}  # fmt: skip
KIMI = {
    "section": "<|tool_calls_section_begin|>",
    "section_end": "<|tool_calls_section_end|>",
    "call": "<|tool_call_begin|>",
    "args": "<|tool_call_argument_begin|>",
    "call_end": "<|tool_call_end|>",
}


def tool(name: str, **properties: Any) -> dict[str, Any]:
    return {
        "type": "function",
        "function": {"name": name, "parameters": {"type": "object", "properties": properties}},
    }


WRITE_FILE = tool(
    "write_file", path={"type": "string"}, content={"type": "string"}, overwrite={"type": "boolean"}
)


def calls(result: ParseResult) -> list[tuple[str, dict[str, Any]]]:
    return [(c.name, c.arguments) for c in result.tool_calls]


# ---- 1. qwen3_coder: a missing </parameter> never swallows the next parameter ------------------------------


def coder_call(*params: str) -> str:
    return "<tool_call>\n<function=write_file>\n" + "".join(params) + "</function>\n</tool_call>"


@pytest.mark.parametrize("tools", [[WRITE_FILE], None], ids=["schema", "no-schema"])
def test_coder_a_missing_close_tag_ends_the_value_where_the_next_parameter_opens(tools: Any) -> None:
    text = coder_call(
        "<parameter=path>\n/tmp/a.txt\n",  # no </parameter>
        "<parameter=content>\nhello\n</parameter>\n",
    )
    result = get_parser("qwen3_coder").parse(text, tools=tools)
    assert calls(result) == [("write_file", {"path": "/tmp/a.txt", "content": "hello"})]
    assert result.tool_calls[0].recovered and not result.unparsed


def test_coder_a_missing_close_tag_in_the_middle_of_three() -> None:
    text = coder_call(
        "<parameter=path>\n/tmp/a.txt\n</parameter>\n",
        "<parameter=content>\nline 1\nline 2\n",  # no </parameter>
        "<parameter=overwrite>\ntrue\n</parameter>\n",
    )
    result = get_parser("qwen3_coder").parse(text, tools=[WRITE_FILE])
    assert calls(result) == [
        ("write_file", {"path": "/tmp/a.txt", "content": "line 1\nline 2", "overwrite": True})
    ]
    assert result.tool_calls[0].recovered


def test_coder_a_parameter_swallowed_mid_line_leaves_the_block_unparsed() -> None:
    # No line of its own: there is no honest place to split the value, so nothing runs.
    text = coder_call("<parameter=path>\n/tmp/a.txt<parameter=content>\nhello\n</parameter>\n")
    for tools in ([WRITE_FILE], None):
        result = get_parser("qwen3_coder").parse("Writing.\n" + text, tools=tools)
        assert result.tool_calls == [] and [u.raw_text for u in result.unparsed] == [text]
        assert result.content == "Writing."


def test_coder_literal_markup_in_a_value_is_kept() -> None:
    # Markup of a parameter already given, or of a key the schema does not declare, is the value's own text.
    given = coder_call(
        "<parameter=path>\n/tmp/a.txt\n</parameter>\n",
        "<parameter=content>\nx\n<parameter=path>\ny\n</parameter>\n",
    )
    undeclared = coder_call("<parameter=content>\n<parameter=colour>\nred\n</parameter>\n")
    literal_close = coder_call("<parameter=content>\nsee </parameter> here\n</parameter>\n")
    for text, content in (
        (given, "x\n<parameter=path>\ny"),
        (undeclared, "<parameter=colour>\nred"),
        (literal_close, "see </parameter> here"),
    ):
        result = get_parser("qwen3_coder").parse(text, tools=[WRITE_FILE])
        assert result.tool_calls[0].arguments["content"] == content
        assert not result.tool_calls[0].recovered


def test_coder_a_clean_call_is_not_recovered() -> None:
    text = coder_call("<parameter=path>\n/a\n</parameter>\n", "<parameter=overwrite>\nfalse\n</parameter>\n")
    result = get_parser("qwen3_coder").parse(text, tools=[WRITE_FILE])
    assert calls(result) == [("write_file", {"path": "/a", "overwrite": False})]
    assert not result.tool_calls[0].recovered


# ---- 2. llama3: the JSON forms other servers read ----------------------------------------------------------

WEATHER = '{"name": "get_weather", "parameters": {"city": "Paris"}}'
TIME = '{"name": "get_time", "parameters": {"tz": "UTC"}}'


@pytest.mark.parametrize(
    ("text", "content"),
    [
        (WEATHER + "\nI will report back.", "I will report back."),  # followed by prose
        ("Let me check. " + WEATHER, "Let me check."),  # preceded by prose
        ("Checking.<|python_tag|>" + WEATHER, "Checking."),  # text, then the python tag
        ("<|python_tag|>" + WEATHER, ""),
    ],
)
def test_llama3_one_call_among_prose(text: str, content: str) -> None:
    result = get_parser("llama3").parse(text)
    assert calls(result) == [("get_weather", {"city": "Paris"})]
    assert result.content == content and not result.unparsed


@pytest.mark.parametrize(
    "text",
    [
        f"<|python_tag|>{WEATHER}<|python_tag|>{TIME}",
        f"<|python_tag|>{WEATHER}; {TIME}",
        f"{WEATHER};{TIME}",
        f"[{WEATHER}, {TIME}]",
    ],
)
def test_llama3_several_calls(text: str) -> None:
    result = get_parser("llama3").parse(text)
    assert calls(result) == [("get_weather", {"city": "Paris"}), ("get_time", {"tz": "UTC"})]
    assert result.content == "" and not result.unparsed


def test_llama3_an_invalid_object_before_a_valid_one() -> None:
    bad = '{"name": "get_weather", "parameters": {"city": }}'
    result = get_parser("llama3").parse(f"{bad} {TIME}")
    assert calls(result) == [("get_time", {"tz": "UTC"})]
    assert [u.raw_text for u in result.unparsed] == [bad]  # call-like: shown as unparsed
    result = get_parser("llama3").parse(f"{{not json}} {TIME}")
    assert calls(result) == [("get_time", {"tz": "UTC"})]
    assert result.content == "{not json}" and not result.unparsed  # not call-like: prose


def test_llama3_and_mistral_read_long_values_and_markers_inside_strings() -> None:
    # Objects are read in windows that grow with the value: long values and escapes at any offset decode whole.
    long_text = 'x\\"y' * 3000 + "\u00e9" * 500  # escaped backslashes, quotes and \u escapes in the JSON
    call = json.dumps({"name": "write", "parameters": {"text": long_text, "n": 1}})
    result = get_parser("llama3").parse("Writing. " + call + " Done.")
    assert calls(result) == [("write", {"text": long_text, "n": 1})]
    assert result.content == "Writing.  Done."
    marker = get_parser("mistral").parse('[TOOL_CALLS]echo{"text": "[TOOL_CALLS] is a marker"}')
    assert calls(marker) == [("echo", {"text": "[TOOL_CALLS] is a marker"})]


def test_llama3_objects_that_are_not_calls_stay_content() -> None:
    for text in ('{"name": "Bob"}', 'The answer is {"x": 1}.', "Use <|python_tag|> then code."):
        result = get_parser("llama3").parse(text)
        assert result.tool_calls == [] and result.unparsed == [] and result.content == text


# ---- 3. mistral: [TOOL_CALLS]NAME{json}, and text before the list ------------------------------------------


def test_mistral_name_then_json_without_args_marker() -> None:
    result = get_parser("mistral").parse('[TOOL_CALLS]get_weather{"city": "Paris"}')
    assert calls(result) == [("get_weather", {"city": "Paris"})]
    assert len(result.tool_calls[0].id or "") == 9
    result = get_parser("mistral").parse('Sure.[TOOL_CALLS]add{"a": 1}[TOOL_CALLS]mul {"a": 2}')
    assert calls(result) == [("add", {"a": 1}), ("mul", {"a": 2})] and result.content == "Sure."


def test_mistral_text_before_the_list() -> None:
    result = get_parser("mistral").parse('[TOOL_CALLS]  here: [{"name": "add", "arguments": {"a": 1}}] done')
    assert calls(result) == [("add", {"a": 1})]
    assert result.tool_calls[0].recovered  # not the format's own form
    assert result.content == "here:  done"  # the text the model wrote stays visible


def test_mistral_documented_forms_still_read() -> None:
    parse = get_parser("mistral").parse
    assert calls(parse('[TOOL_CALLS] [{"name": "add", "arguments": {"a": 1}}]')) == [("add", {"a": 1})]
    v11 = parse('[TOOL_CALLS]f[CALL_ID]abcdefghi[ARGS]{"x": 1}')
    assert calls(v11) == [("f", {"x": 1})] and v11.tool_calls[0].id == "abcdefghi"
    assert calls(parse('[TOOL_CALLS]f[ARGS]{"x": 1}')) == [("f", {"x": 1})]


def test_mistral_a_list_with_one_bad_call_is_one_unparsed_block() -> None:
    text = '[TOOL_CALLS][{"name": "add", "arguments": {"a": 1}}, {"nam": "x"}]'
    result = get_parser("mistral").parse(text)
    assert result.tool_calls == [] and [u.raw_text for u in result.unparsed] == [text]


# ---- 4. in place: the agent sees the sampled text, only the emitted calls (and reasoning) taken out -----------


def chat_template(tokenizer: Any, parser: str) -> ChatTemplateRenderer:
    renderer = get_renderer("chat_template", tokenizer, renderer_kwargs={"tool_call_parser": parser})
    assert isinstance(renderer, ChatTemplateRenderer)
    return renderer


def agent_sees(renderer: Any, text: str, stop_reason: str = "stop", tools: Any = None) -> Any:
    tokens = renderer.tokenizer.encode(text, add_special_tokens=False)
    if stop_reason == "stop":
        tokens.append(renderer.stop_token_ids()[0])
    if isinstance(renderer, ChatTemplateRenderer):
        return renderer.parse_completion(tokens, stop_reason, tools=tools)
    return renderer.parse_completion(tokens, stop_reason)


def test_in_place_hermes(qwen3_hf_tokenizer: Any) -> None:
    renderer = chat_template(qwen3_hf_tokenizer, "hermes")
    bad = '<tool_call>\n{"name": "f", "arguments": {"x": }}\n</tool_call>'
    good = '<tool_call>\n{"name": "g", "arguments": {}}\n</tool_call>'
    text = f"Before.\n{bad}\nBetween.\n{good}\nAfter."
    parsed = agent_sees(renderer, text)
    assert parsed.message["content"] == f"Before.\n{bad}\nBetween.\n\nAfter."
    assert (parsed.emitted_tool_calls, parsed.unparsed_tool_calls) == (1, 1)
    # Cut at the length limit nothing is emitted: the agent sees every byte the model wrote.
    assert agent_sees(renderer, text, "length").message["content"] == text


def test_in_place_pythonic(qwen3_hf_tokenizer: Any) -> None:
    renderer = chat_template(qwen3_hf_tokenizer, "pythonic")
    text = '[get_weather(city="Paris"), get_time(tz=UTC), list_files()]'
    parsed = agent_sees(renderer, text)
    assert parsed.message["content"] == "[get_time(tz=UTC)]"  # brackets kept around the call that failed
    assert (parsed.emitted_tool_calls, parsed.unparsed_tool_calls) == (2, 1)
    assert agent_sees(renderer, text, "length").message["content"] == text
    truncated = '[get_weather(city="Paris"), get_ti'
    assert agent_sees(renderer, truncated, "length").message["content"] == truncated


def test_in_place_deepseek_v31(qwen3_hf_tokenizer: Any) -> None:
    renderer = chat_template(qwen3_hf_tokenizer, "deepseekv31")
    good = f'{DS["call_begin"]}get_weather{DS["sep"]}{{"city": "Paris"}}{DS["call_end"]}'
    bad = f'{DS["call_begin"]}get_time{DS["sep"]}{{"tz": }}{DS["call_end"]}'
    text = f"On it.\n\n{DS['calls_begin']}{good}\n{bad}{DS['calls_end']}"
    parsed = agent_sees(renderer, text)
    assert parsed.message["content"] == f"On it.\n\n{DS['calls_begin']}{bad}{DS['calls_end']}"
    assert (parsed.emitted_tool_calls, parsed.unparsed_tool_calls) == (1, 1)
    assert agent_sees(renderer, text, "length").message["content"] == text


def test_in_place_a_truncated_deepseek_section_keeps_its_marker(qwen3_hf_tokenizer: Any) -> None:
    renderer = chat_template(qwen3_hf_tokenizer, "deepseekv31")
    text = f'Sure.{DS["calls_begin"]}{DS["call_begin"]}get_weather{DS["sep"]}{{"city": "Paris"}}'
    parsed = agent_sees(renderer, text, "length")
    assert parsed.message["content"] == text and parsed.message["tool_calls"] is None
    assert (parsed.parsed_tool_calls, parsed.unparsed_tool_calls) == (1, 0)


def test_in_place_kimi(qwen3_hf_tokenizer: Any) -> None:
    renderer = chat_template(qwen3_hf_tokenizer, "kimi_k2")
    good = f'{KIMI["call"]}functions.get_weather:0{KIMI["args"]}{{"city": "Paris"}}{KIMI["call_end"]}'
    bad = f'{KIMI["call"]}functions.get_time:1{KIMI["args"]}{{"tz": }}{KIMI["call_end"]}'
    text = f"Checking.{KIMI['section']}\n{good}\n{bad}\n{KIMI['section_end']}"
    parsed = agent_sees(renderer, text)
    assert parsed.message["content"] == f"Checking.{KIMI['section']}\n{bad}\n{KIMI['section_end']}"
    assert agent_sees(renderer, text, "length").message["content"] == text


def test_in_place_llama3_and_mistral(qwen3_hf_tokenizer: Any) -> None:
    renderer = chat_template(qwen3_hf_tokenizer, "llama3")
    bad = '{"name": "get_weather", "parameters": {"city": }}'
    text = f"Checking.<|python_tag|>{bad}<|python_tag|>{TIME}\nDone."
    parsed = agent_sees(renderer, text)
    assert parsed.message["content"] == f"Checking.<|python_tag|>{bad}\nDone."
    renderer = chat_template(qwen3_hf_tokenizer, "mistral")
    text = '[TOOL_CALLS]add{"a": 1}[TOOL_CALLS]mul{"a": }\nDone.'
    parsed = agent_sees(renderer, text)
    assert parsed.message["content"] == '[TOOL_CALLS]mul{"a": }\nDone.'


def test_in_place_parse_response_lists_unparsed_and_keeps_them_in_place(qwen3_hf_tokenizer: Any) -> None:
    renderer = chat_template(qwen3_hf_tokenizer, "hermes")
    bad = "<tool_call>\n{oops}\n</tool_call>"
    text = f"A.\n{bad}\nB."
    message, ok = renderer.parse_response(agent_sees_tokens(renderer, text))
    assert ok and message["content"] == [{"type": "text", "text": text}]
    assert [u.raw_text for u in message["unparsed_tool_calls"]] == [bad]


def agent_sees_tokens(renderer: Any, text: str) -> list[int]:
    return [*renderer.tokenizer.encode(text, add_special_tokens=False), renderer.stop_token_ids()[0]]


# ---- 4 (named renderers, real tokenizers): the gateway adapter keeps blocks in place ---------------------------


@pytest.fixture(scope="module")
def qwen3_tokenizer() -> Any:
    from platoon.renderers.tokenizers import TokenizersTokenizer

    return TokenizersTokenizer.from_directory(tokenizer_dir("qwen3"), name_or_path="Qwen/Qwen3-8B")


@pytest.fixture(scope="module")
def deepseek_tokenizer() -> Any:
    from tokenizers import Tokenizer

    from platoon.renderers.tokenizers import TokenizersTokenizer

    return TokenizersTokenizer(
        Tokenizer.from_file(str(tokenizer_dir("deepseek_v3") / "tokenizer.json")),
        name_or_path="deepseek-ai/DeepSeek-V3.1",
        bos_token="<\uff5cbegin▁of▁sentence\uff5c>",
        eos_token="<\uff5cend▁of▁sentence\uff5c>",
    )


@pytest.fixture(scope="module")
def gpt_oss_tokenizer() -> Any:
    from platoon.renderers.tokenizers import TokenizersTokenizer

    return TokenizersTokenizer.from_directory(tokenizer_dir("gpt_oss"), name_or_path="openai/gpt-oss-20b")


@pytest.mark.parametrize("name", ["qwen3", "qwen3_instruct", "qwen3_5"])
def test_named_qwen_in_place(qwen3_tokenizer: Any, name: str) -> None:
    renderer = get_renderer(name, qwen3_tokenizer)
    bad = '<tool_call>\n{"name": "f", "arguments": {"x": }}\n</tool_call>'
    good = '<tool_call>\n{"name": "g", "arguments": {}}\n</tool_call>'
    text = f"<think>\nhm\n</think>\n\nBefore.\n{bad}\nMiddle.\n{good}"
    parsed = agent_sees(renderer, text)
    assert parsed.message["tool_calls"] and parsed.message["reasoning_content"]
    assert parsed.message["content"].endswith(f"Before.\n{bad}\nMiddle.")
    cut = agent_sees(renderer, text, "length")
    assert cut.message["content"].endswith(f"Before.\n{bad}\nMiddle.\n{good}")


def test_named_deepseek_in_place(deepseek_tokenizer: Any) -> None:
    renderer = get_renderer("deepseekv3", deepseek_tokenizer)
    good = f'{DS["call_begin"]}get_weather{DS["sep"]}{{"city": "Paris"}}{DS["call_end"]}'
    bad = f'{DS["call_begin"]}get_time{DS["sep"]}{{"tz": }}{DS["call_end"]}'
    text = f"On it.{DS['calls_begin']}{good}{bad}{DS['calls_end']}"
    parsed = agent_sees(renderer, text)
    assert parsed.message["content"] == f"On it.{DS['calls_begin']}{bad}{DS['calls_end']}"
    assert (parsed.emitted_tool_calls, parsed.unparsed_tool_calls) == (1, 1)
    assert agent_sees(renderer, text, "length").message["content"] == text
    truncated = f"On it.{DS['calls_begin']}{good}"  # a section never closed: one unparsed block, in place
    assert agent_sees(renderer, truncated, "length").message["content"] == truncated


def test_named_gpt_oss_in_place(gpt_oss_tokenizer: Any) -> None:
    renderer = get_renderer("gpt_oss_no_sysprompt", gpt_oss_tokenizer)
    call = "<|start|>assistant to=functions.f<|channel|>commentary <|constrain|>json<|message|>{bad"
    text = f"<|channel|>analysis<|message|>think<|end|><|start|>assistant<|channel|>final<|message|>A<|end|>{call}"
    parsed = agent_sees(renderer, text)  # the sample ends on <|call|>, the stop token
    assert parsed.message["content"] == "A" + call
    assert parsed.message["reasoning_content"] == "think" and parsed.unparsed_tool_calls == 1


def test_named_kimi_in_place_and_ids_that_name_no_function() -> None:
    from platoon.testing import toy_tokenizer

    renderer = get_renderer("kimi_k2", toy_tokenizer())
    good = f'{KIMI["call"]}functions.get_weather:0{KIMI["args"]}{{"city": "Paris"}}{KIMI["call_end"]}'
    bad = f"{KIMI['call']}functions.0:1{KIMI['args']}{{}}{KIMI['call_end']}"
    text = f"Checking.{KIMI['section']}{good}{bad}{KIMI['section_end']}"
    parsed = agent_sees(renderer, text)
    names = [c["function"]["name"] for c in parsed.message["tool_calls"]]
    assert names == ["get_weather"] and parsed.unparsed_tool_calls == 1
    assert parsed.message["content"] == f"Checking.{KIMI['section']}{bad}{KIMI['section_end']}"


# ---- 4 (through the gateway): the reply the agent gets -------------------------------------------------------


def test_the_gateway_reply_keeps_malformed_calls_in_place() -> None:
    import platoon.renderers as renderers
    import platoon.testing.policy as policy_module
    from platoon.gateway import ModelGateway

    tokenizer = renderers.get_tokenizer("platoon/toy")
    bad = '<tool_call>\n{"name": "search", "arguments": {"q": }}\n</tool_call>'
    good = policy_module.tool_call("search", {"q": "needle"})
    script = [f"Looking.\n{bad}\nThen:\n{good}\nDone.", f"Looking.\n{good}\nDone."]
    policy = policy_module.ScriptedPolicy(script, tokenizer=tokenizer)
    gateway = ModelGateway(
        policy, renderers.get_renderer("qwen3_instruct", tokenizer), model_name="platoon/toy"
    )
    agent = gateway.open_agent(gateway.open_rollout())
    messages = [{"role": "user", "content": "find it"}]
    tools = [tool("search", q={"type": "string"})]

    first = asyncio.run(gateway.chat(agent, messages, tools=tools))
    assert first.text == f"Looking.\n{bad}\nThen:\nDone."
    assert [json.loads(c["function"]["arguments"]) for c in first.tool_calls] == [{"q": "needle"}]
    assert agent.calls[0].generation["unparsed_tool_calls"] == 1
    # A caller's stop list withholds the calls (a stop string is not a stop token): they stay where written.
    second = asyncio.run(gateway.chat(agent, messages, tools=tools, stop=["NEVER"]))
    assert second.tool_calls == () and second.text == f"Looking.\n{good}\nDone."


# ---- 5. kimi_k2: ids that name no function --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("call_id", "name"),
    [
        ("functions.get_weather:0", "get_weather"),
        ("get_weather:3", "get_weather"),
        ("functions.web-search:1", "web-search"),
        ("functions.ns.tool:2", "ns.tool"),
        ("invalid.0", None),
        ("functions.invalid.0", None),
        ("functions.0:1", None),
        ("0:0", None),
        ("functions.:1", None),
        ("get_weather", None),
    ],
)
def test_kimi_ids(call_id: str, name: str | None) -> None:
    block = f"{KIMI['call']}{call_id}{KIMI['args']}{{}}{KIMI['call_end']}"
    result = get_parser("kimi_k2").parse(f"{KIMI['section']}{block}{KIMI['section_end']}")
    if name is None:
        assert result.tool_calls == [] and [u.raw_text for u in result.unparsed] == [block]
    else:
        assert [(c.name, c.id) for c in result.tool_calls] == [(name, call_id)]


# ---- 6. gpt-oss: every message is read ---------------------------------------------------------------------


def test_gpt_oss_messages_without_start_between_them() -> None:
    text = (
        "<|channel|>analysis<|message|>Need the weather.<|end|>"
        '<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"city": "Paris"}<|call|>'
    )
    result = get_parser("gpt-oss").parse(text)
    assert calls(result) == [("get_weather", {"city": "Paris"})] and result.reasoning == "Need the weather."


def test_gpt_oss_several_messages_mixed() -> None:
    text = (
        "<|channel|>analysis<|message|>a<|end|>"
        "<|channel|>final<|message|>Hello.<|end|>"
        "<|start|>assistant<|channel|>analysis<|message|>b<|end|>"
        '<|channel|>commentary to=functions.f <|constrain|>json<|message|>{"x": 1}<|end|>'
        "<|start|>assistant to=functions.g<|channel|>commentary json<|message|>{}"
    )
    result = get_parser("gpt-oss").parse(text)
    assert calls(result) == [("f", {"x": 1}), ("g", {})]
    assert (result.reasoning, result.content) == ("a\nb", "Hello.")


# ---- 7. schema type aliases --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("declared", "json_type", "text", "value"),
    [
        ("float", "number", "2.5", 2.5),
        ("double", "number", "1e3", 1000.0),
        ("int", "integer", "7", 7),
        ("bool", "boolean", "True", True),
        ("dict", "object", '{"a": 1}', {"a": 1}),
        ("list", "array", "[1, 2]", [1, 2]),
        ("Integer", "integer", "3", 3),
    ],
)
def test_schema_type_aliases(declared: str, json_type: str, text: str, value: Any) -> None:
    assert schema_types({"type": declared}) == {json_type}
    assert type_value(text, schema_types({"type": declared})) == value
    assert schema_types({"type": [declared, "null"]}) == {json_type, "null"}


def test_schema_aliases_through_the_text_valued_parsers() -> None:
    tools = [tool("scale", factor={"type": "float"}, times={"type": "int"}, flags={"type": "list"})]
    coder = (
        "<tool_call>\n<function=scale>\n<parameter=factor>\n0.5\n</parameter>\n"
        '<parameter=times>\n3\n</parameter>\n<parameter=flags>\n["a"]\n</parameter>\n</function>\n</tool_call>'
    )
    glm = (
        "<tool_call>scale\n<arg_key>factor</arg_key>\n<arg_value>0.5</arg_value>\n"
        "<arg_key>times</arg_key>\n<arg_value>3</arg_value>\n"
        '<arg_key>flags</arg_key>\n<arg_value>["a"]</arg_value>\n</tool_call>'
    )
    for parser, text in (("qwen3_coder", coder), ("glm45", glm)):
        result = get_parser(parser).parse(text, tools=tools)
        assert calls(result) == [("scale", {"factor": 0.5, "times": 3, "flags": ["a"]})], parser


# ---- linear time: the scanners resume where they stopped ---------------------------------------------------
# (No wall-clock assertion: these inputs only check the degenerate forms parse correctly; the algorithms are
# linear by construction — each marker is searched for once per direction, each object decoded once.)


def test_degenerate_inputs_parse() -> None:
    n = 2000
    cases = {
        "qwen3_coder": "<tool_call>\n<function=f>\n" + "<parameter=k>\n" * n,
        "hermes": "<tool_call>{" * n,
        "llama3": '{"name": ' * n,
        "mistral": "[TOOL_CALLS]{" * n,
        "deepseekv31": DS["call_begin"] * n,
        "kimi_k2": KIMI["call"] * n,
        "gpt-oss": "<|channel|>final<|message|>x" * n,
        "glm45": "<tool_call>f<arg_key>k</arg_key><arg_value>" * n,
    }
    for parser, text in cases.items():
        result = get_parser(parser).parse(text)
        assert result.tool_calls or result.unparsed or result.content, parser
