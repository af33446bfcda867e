"""The `chat_template` renderer end to end: `auto` picks the parser by round trip through real and per-family
templates, render -> sample -> parse round trips, user parsers, the emit rules and the multi-turn prefix property.

The per-family templates are small stand-ins written here (Qwen's turn markup around each family's tool-call
syntax, as that family's real template writes it); the real Qwen3 and Llama-3 templates come from the fetched
tokenizers. Sampling is simulated by encoding the text the model would write.
"""

from __future__ import annotations

import copy
import json
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from platoon.errors import ConfigError
from platoon.renderers.base import get_renderer
from platoon.renderers.chat_template import ChatTemplateRenderer
from platoon.renderers.probe import PROBE_TOOLS

FRAME = (
    "{%- for m in messages -%}<|im_start|>{{ m.role }}\n"
    "{% if m.role == 'system' and tools %}TOOLS: {{ tools | map(attribute='function.name') | join(',') }}\n{% endif %}"
    "{% if m.role == 'assistant' %}@ASSISTANT@{% else %}{{ m.content }}{% endif %}<|im_end|>\n"
    "{% endfor -%}{%- if add_generation_prompt %}<|im_start|>assistant\n{% endif -%}"
)
THINK = "{% if m.reasoning_content %}<think>\n{{ m.reasoning_content }}\n</think>\n\n{% endif %}"
VALUE = "{{ v if v is string else v | tojson }}"
DS = {k: f"<\uff5ctool\u2581{k.replace('_', chr(0x2581))}\uff5c>" for k in
      ("calls_begin", "calls_end", "call_begin", "call_end", "sep")}  # fmt: skip

#: parser name -> the assistant-turn template in that family's syntax
FAMILY_TEMPLATES: dict[str, str] = {
    "qwen3_coder": THINK
    + "{{ m.content }}{% for c in m.tool_calls %}\n<tool_call>\n<function={{ c.function.name }}>\n"
    "{% for k, v in c.function.arguments.items() %}<parameter={{ k }}>\n"
    + VALUE
    + "\n</parameter>\n{% endfor %}"
    "</function>\n</tool_call>{% endfor %}",
    "hermes": THINK + "{{ m.content }}{% for c in m.tool_calls %}\n<tool_call>\n"
    '{{ {"name": c.function.name, "arguments": c.function.arguments} | tojson }}\n</tool_call>{% endfor %}',
    "glm45": THINK + "{{ m.content }}{% for c in m.tool_calls %}\n<tool_call>{{ c.function.name }}\n"
    "{% for k, v in c.function.arguments.items() %}<arg_key>{{ k }}</arg_key>\n<arg_value>"
    + VALUE
    + "</arg_value>\n{% endfor %}</tool_call>{% endfor %}",
    "deepseekv31": THINK
    + "{{ m.content }}"
    + DS["calls_begin"]
    + "{% for c in m.tool_calls %}"
    + DS["call_begin"]
    + "{{ c.function.name }}"
    + DS["sep"]
    + "{{ c.function.arguments | tojson }}"
    + DS["call_end"]
    + "{% endfor %}"
    + DS["calls_end"],
    "deepseekv3": THINK
    + "{{ m.content }}"
    + DS["calls_begin"]
    + "{% for c in m.tool_calls %}"
    + DS["call_begin"]
    + "function"
    + DS["sep"]
    + "{{ c.function.name }}\n```json\n{{ c.function.arguments | tojson }}\n```"
    + DS["call_end"]
    + "{% endfor %}"
    + DS["calls_end"],
    "kimi_k2": THINK
    + "{{ m.content }}<|tool_calls_section_begin|>{% for c in m.tool_calls %}<|tool_call_begin|>"
    "{{ c.id }}<|tool_call_argument_begin|>{{ c.function.arguments | tojson }}<|tool_call_end|>{% endfor %}"
    "<|tool_calls_section_end|>",
    "mistral": "{% if m.reasoning_content %}[THINK]{{ m.reasoning_content }}[/THINK]{% endif %}{{ m.content }}"
    "{% for c in m.tool_calls %}[TOOL_CALLS]{{ c.function.name }}[CALL_ID]{{ c.id }}[ARGS]"
    "{{ c.function.arguments | tojson }}{% endfor %}",
    # gpt-oss: one call per message (the real template renders tool_calls[0]); content and thinking together
    # are refused, as the real template does.
    "gpt-oss": "{% if m.content and m.reasoning_content %}{{ raise_exception('Cannot pass both content and "
    "thinking') }}{% endif %}{% set c = m.tool_calls[0] %}<|channel|>analysis<|message|>"
    "{{ m.reasoning_content or m.content }}<|end|><|start|>assistant to=functions.{{ c.function.name }}"
    "<|channel|>commentary <|constrain|>json<|message|>{{ c.function.arguments | tojson }}<|call|>",
    # Llama 3.1: a single JSON call per turn (the real template raises on more), content not rendered.
    "llama3": "{% if m.tool_calls | length > 1 %}{{ raise_exception('This model only supports single tool-calls "
    'at once!\') }}{% endif %}{% set c = m.tool_calls[0] %}{"name": "{{ c.function.name }}", "parameters": '
    "{{ c.function.arguments | tojson }}}",
    "pythonic": "{{ m.content }}[{% for c in m.tool_calls %}{{ c.function.name }}("
    "{% for k, v in c.function.arguments.items() %}{{ k }}={{ v | tojson }}{% if not loop.last %}, {% endif %}"
    "{% endfor %}){% if not loop.last %}, {% endif %}{% endfor %}]",
}


def with_template(tokenizer: Any, assistant: str) -> Any:
    """A copy of the tokenizer carrying a stand-in template (the parser choice is cached by template hash)."""
    clone = copy.copy(tokenizer)
    clone.chat_template = FRAME.replace("@ASSISTANT@", assistant)
    return clone


def sample(renderer: ChatTemplateRenderer, text: str, *, stop: bool = True) -> list[int]:
    """The tokens a model writing `text` would sample (ending on the stop token unless cut)."""
    tokens = renderer.tokenizer.encode(text, add_special_tokens=False)
    return [*tokens, renderer.stop_token_ids()[0]] if stop else tokens


# ---- auto on the real templates -----------------------------------------------------------------------------


def test_auto_reads_qwen3_with_hermes(qwen3_hf_tokenizer: Any) -> None:
    renderer = get_renderer("chat_template", qwen3_hf_tokenizer)
    record = renderer.tool_call_parsing()
    assert (record["parser"], record["verified"]) == ("hermes", True)
    assert record["reason"] == "round trip (one turn with every call)"


def test_auto_on_a_template_without_tools_is_none(llama3_hf_tokenizer: Any, caplog: Any) -> None:
    # The fetched Llama-3 template (tokenizer_config.json of Llama 3) does not render tools at all.
    renderer = get_renderer("chat_template", llama3_hf_tokenizer)
    record = renderer.tool_call_parsing()
    assert (record["parser"], record["verified"]) == ("none", None)
    text = '{"name": "get_weather", "parameters": {"location": "Paris"}}'
    parsed = renderer.parse_completion(sample(renderer, text), "stop")
    assert parsed.message["tool_calls"] is None and parsed.message["content"] == text


# ---- every family: auto picks it, and a sampled turn round-trips ----------------------------------------------


@pytest.mark.parametrize("family", list(FAMILY_TEMPLATES))
def test_auto_and_round_trip_per_family(qwen3_hf_tokenizer: Any, family: str) -> None:
    renderer = ChatTemplateRenderer(with_template(qwen3_hf_tokenizer, FAMILY_TEMPLATES[family]))
    record = renderer.tool_call_parsing()
    assert (record["parser"], record["verified"]) == (family, True), record
    # render -> sample -> parse: the text the template writes for a call, sampled, comes back as the call.
    arguments = {"location": "Zürich", "days": 2, "unit": "fahrenheit"}
    history = [
        {"role": "user", "content": "weather?"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"id": "functions.get_weather:0", "type": "function",
                            "function": {"name": "get_weather", "arguments": json.dumps(arguments)}}],
        },
    ]  # fmt: skip
    prompt = renderer.render_text(history[:1], PROBE_TOOLS)
    full = renderer.render_text(history, PROBE_TOOLS, add_generation_prompt=False)
    assert full.startswith(prompt)
    written = full[len(prompt) :].split("<|im_end|>")[0]
    parsed = renderer.parse_completion(sample(renderer, written), "stop", tools=PROBE_TOOLS)
    (call,) = parsed.message["tool_calls"]
    assert call["function"]["name"] == "get_weather"
    assert json.loads(call["function"]["arguments"]) == arguments
    assert parsed.finish_reason == "tool_calls" and parsed.unparsed_tool_calls == 0


def test_auto_refuses_a_template_it_cannot_read_back(qwen3_hf_tokenizer: Any) -> None:
    odd = "{{ m.content }}{% for c in m.tool_calls %}<<CALL {{ c.function.name }} {{ c.function.arguments }}>>{% endfor %}"
    renderer = ChatTemplateRenderer(with_template(qwen3_hf_tokenizer, odd))
    with pytest.raises(ConfigError) as raised:
        renderer.tool_call_parsing()
    assert raised.value.exit_code == 78
    assert "no parser reads" in str(raised.value) and "<<CALL get_weather" in str(raised.value)


def test_a_named_parser_that_fails_the_probe_only_warns(qwen3_hf_tokenizer: Any) -> None:
    renderer = get_renderer(
        "chat_template", qwen3_hf_tokenizer, renderer_kwargs={"tool_call_parser": "llama3"}
    )
    record = renderer.tool_call_parsing()
    assert (record["parser"], record["verified"]) == ("llama3", False)


# ---- user parsers -------------------------------------------------------------------------------------------


USER_PARSER = '''
from platoon.renderers.tool_parsers import ParsedToolCall, ToolCallParser


class AtCall(ToolCallParser):
    """`@NAME {json}` on the last line is a call."""

    def parse_calls(self, text, tools):
        head, _, last = text.rpartition("\\n")
        if last.startswith("@"):
            name, _, args = last[1:].partition(" ")
            import json
            return head, [ParsedToolCall(name, json.loads(args), raw_text=last)], []
        return text, [], []


def broken(text, *, tools, in_reasoning):
    raise RuntimeError("boom")
'''


@pytest.fixture
def user_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    (tmp_path / "my_parsers.py").write_text(textwrap.dedent(USER_PARSER))
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "my_parsers"
    sys.modules.pop("my_parsers", None)


def test_user_parser_by_module_attr(qwen3_hf_tokenizer: Any, user_module: str) -> None:
    renderer = get_renderer(
        "chat_template", qwen3_hf_tokenizer, renderer_kwargs={"tool_call_parser": f"{user_module}:AtCall"}
    )
    text = '<think>\nhm\n</think>\n\nOn it.\n@get_weather {"location": "Oslo"}'
    parsed = renderer.parse_completion(sample(renderer, text), "stop")
    assert parsed.message["content"] == "On it."
    assert parsed.message["reasoning_content"] == "hm"
    assert json.loads(parsed.message["tool_calls"][0]["function"]["arguments"]) == {"location": "Oslo"}


def test_a_parser_that_raises_never_fails_the_call(qwen3_hf_tokenizer: Any, user_module: str) -> None:
    renderer = get_renderer(
        "chat_template", qwen3_hf_tokenizer, renderer_kwargs={"tool_call_parser": f"{user_module}:broken"}
    )
    parsed = renderer.parse_completion(sample(renderer, "some text"), "stop")
    assert parsed.message["content"] == "some text" and parsed.message["tool_calls"] is None
    assert parsed.unparsed_tool_calls == 1


# ---- emit rules and malformed calls -------------------------------------------------------------------------

CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"location": "Paris"}}\n</tool_call>'


def test_no_tool_calls_when_cut_at_the_length_limit(qwen3_hf_tokenizer: Any) -> None:
    renderer = get_renderer("chat_template", qwen3_hf_tokenizer)
    parsed = renderer.parse_completion(sample(renderer, "Checking.\n" + CALL, stop=False), "length")
    assert parsed.message["tool_calls"] is None and parsed.finish_reason == "length"
    assert CALL in parsed.message["content"]
    # A stop token sampled but the stop reason is length: still no tools.
    assert renderer.parse_completion(sample(renderer, CALL), "length").message["tool_calls"] is None
    assert renderer.parse_completion(sample(renderer, CALL), "stop").finish_reason == "tool_calls"


@pytest.mark.parametrize(
    "text",
    [
        '<tool_call>\n{"name": "get_weather", "arguments": {"days": NaN}}\n</tool_call>',
        '<tool_call>\n{"name": "get_weather", "arguments": {"days": 1e999}}\n</tool_call>',
        "<tool_call>\n{not json at all\n</tool_call>",
        '<tool_call>\n{"arguments": {}}\n</tool_call>',
        "<tool_call>\n" + "[" * 5000 + "\n</tool_call>",
    ],
)
def test_malformed_calls_reach_the_agent_as_text(qwen3_hf_tokenizer: Any, text: str) -> None:
    renderer = get_renderer("chat_template", qwen3_hf_tokenizer)
    parsed = renderer.parse_completion(sample(renderer, "Before. " + text), "stop")
    assert parsed.message["tool_calls"] is None and parsed.finish_reason == "stop"
    assert text in parsed.message["content"] and parsed.unparsed_tool_calls >= 1


# ---- settings, aliases and the prefix property --------------------------------------------------------------


def test_aliases_preset_the_settings(qwen3_hf_tokenizer: Any) -> None:
    r = get_renderer("qwen3_8_preserve_thinking_disable_thinking", qwen3_hf_tokenizer)
    assert isinstance(r, ChatTemplateRenderer)
    assert (r.preserve_thinking, r.enable_thinking, r.reasoning_effort) == (True, False, "xhigh")
    assert get_renderer("qwen3_6_preserve_thinking", qwen3_hf_tokenizer).preserve_thinking is True
    with pytest.raises(ConfigError):
        get_renderer("chat_template", qwen3_hf_tokenizer, renderer_kwargs={"no_such_setting": 1})


def test_enable_thinking_off_starts_outside_reasoning(qwen3_hf_tokenizer: Any) -> None:
    renderer = get_renderer("chat_template", qwen3_hf_tokenizer, renderer_kwargs={"enable_thinking": False})
    prompt = renderer.render_prompt([{"role": "user", "content": "hi"}])
    assert renderer.tokenizer.decode(prompt).endswith("<think>\n\n</think>\n\n")
    parsed = renderer.parse_completion(sample(renderer, "Hello!"), "stop", prompt=prompt)
    assert (parsed.message["content"], parsed.message["reasoning_content"]) == ("Hello!", None)


def test_prefix_property_where_the_template_keeps_history(qwen3_hf_tokenizer: Any) -> None:
    renderer = get_renderer("chat_template", qwen3_hf_tokenizer)
    convo = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Weather in Paris?"}]
    prompt = renderer.render_prompt(convo, PROBE_TOOLS)
    completion = sample(renderer, CALL)  # the template writes no newline before a first call without content
    reply = renderer.parse_completion(completion, "stop").message
    assert reply["tool_calls"]
    nxt = [
        *convo,
        {**reply, "content": reply["content"] or ""},
        {"role": "tool", "tool_call_id": "x", "content": "sunny"},
    ]
    next_prompt = renderer.render_prompt(nxt, PROBE_TOOLS)
    assert next_prompt[: len(prompt) + len(completion)] == prompt + completion


def test_qwen3_template_drops_history_reasoning_so_the_prefix_breaks(qwen3_hf_tokenizer: Any) -> None:
    # Qwen3's template drops <think> blocks of turns before the last user message: the chat_template renderer
    # renders what the template renders, so the next prompt does not extend this one and the trainer's prefix
    # merging starts a new datum. Templates with `preserve_thinking` keep the blocks.
    renderer = get_renderer("chat_template", qwen3_hf_tokenizer)
    convo = [{"role": "user", "content": "2+2?"}]
    prompt = renderer.render_prompt(convo)
    completion = sample(renderer, "<think>\nadd\n</think>\n\n4")
    reply = renderer.parse_completion(completion, "stop").message
    assert reply["reasoning_content"] == "add" and reply["content"] == "4"
    next_prompt = renderer.render_prompt([*convo, reply, {"role": "user", "content": "3+3?"}])
    assert next_prompt[: len(prompt) + len(completion)] != prompt + completion
