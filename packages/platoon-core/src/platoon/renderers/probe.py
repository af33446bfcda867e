"""`tool_call_parser: auto` by round trip: render a conversation with known tool calls through the
model's template, take the assistant turn as if sampled, and find the first parser that reads it back exactly.

No parser for a template that renders tools is a `ConfigError` (exit 78); a template without tools gets `none`.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from platoon.errors import ConfigError
from platoon.renderers.base import RendererError, Tokenizer
from platoon.renderers.tool_parsers import get_parser, make_parser, parser_names

log = logging.getLogger(__name__)


class TemplateRenderer(Protocol):
    """What the probe uses of a `ChatTemplateRenderer`, which calls it: typed by this protocol rather than
    imported, so that this module stays below the renderer even for type checking."""

    @property
    def tokenizer(self) -> Tokenizer: ...

    def stop_token_ids(self) -> list[int]: ...

    def render_text(
        self,
        messages: Sequence[Mapping[str, Any]],
        tools: Sequence[Mapping[str, Any]] | None = None,
        *,
        add_generation_prompt: bool = True,
    ) -> str: ...


PROBE_TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Get the weather forecast for a location.",
            "parameters": {
                "type": "object",
                "properties": {
                    "location": {"type": "string", "description": "The city."},
                    "days": {"type": "integer", "description": "How many days."},
                    "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                },
                "required": ["location", "days", "unit"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "write_file",
            "description": "Write a file.",
            "parameters": {
                "type": "object",
                "properties": {
                    "path": {"type": "string"},
                    "content": {"type": "string"},
                    "tags": {"type": "array", "items": {"type": "string"}},
                    "overwrite": {"type": "boolean"},
                    "note": {"type": "string"},
                },
                "required": ["path", "content"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "list_files",
            "description": "List the files.",
            "parameters": {"type": "object", "properties": {}},
        },
    },
]

#: an integer, a multi-line indented string with braces and quotes, strings that look like a number and a
#: boolean, a list, a boolean, and a call without arguments
PROBE_CALLS: list[tuple[str, dict[str, Any]]] = [
    ("get_weather", {"location": "Paris", "days": 3, "unit": "celsius"}),
    (
        "write_file",
        {
            "path": "123",
            "content": 'def main():\n    config = {"key": "value", \'n\': [1, 2]}\n    return config',
            "tags": ["alpha", "beta"],
            "overwrite": True,
            "note": "true",
        },
    ),
    ("list_files", {}),
]
PROBE_CONTENT = "Sure."
PROBE_REASONING = "I will call three tools."
BASE_CONVERSATION: list[dict[str, Any]] = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "What is the weather in Paris? Then save a script and list the files."},
]


@dataclass
class ProbeTurn:
    """One rendered assistant turn, as if sampled: its text, the calls it holds, what content and reasoning a
    parser must read, and the prompt text it continues (whose end says whether it starts in reasoning)."""

    text: str
    calls: list[tuple[str, dict[str, Any]]]
    content: str
    reasoning: str
    prompt_tail: str


@dataclass
class Probe:
    renders_tools: bool
    mode: str | None = None
    turns: list[ProbeTurn] = field(default_factory=list)
    error: str | None = None


def _assistant(indices: Sequence[int], id_shape: str, variant: str) -> dict[str, Any]:
    calls = []
    for i in indices:
        name, arguments = PROBE_CALLS[i]
        call_id = f"functions.{name}:{i}" if id_shape == "kimi" else f"probe{i:04d}"
        calls.append({"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}})
    message: dict[str, Any] = {
        "role": "assistant",
        "content": "" if variant == "no_content" else PROBE_CONTENT,
    }
    if variant != "no_reasoning":
        message["reasoning_content"] = PROBE_REASONING
        message["thinking"] = PROBE_REASONING
    message["tool_calls"] = calls
    return message


def _render_turn(renderer: TemplateRenderer, prompt: str, indices: Sequence[int]) -> ProbeTurn | None:
    """The turn holding the calls at `indices`, or None when the template refuses every shape of it.

    Ids are tried as `functions.<name>:<i>` (Kimi) then `probe<i:04d>` (Mistral's nine alphanumerics); a template
    that refuses content together with reasoning (gpt-oss) is tried with one of them left out.
    """
    stops = [s for s in (str(renderer.tokenizer.decode([t])) for t in renderer.stop_token_ids()) if s]
    for id_shape in ("kimi", "mistral"):
        for variant in ("full", "no_content", "no_reasoning"):
            try:
                full = renderer.render_text(
                    [*BASE_CONVERSATION, _assistant(indices, id_shape, variant)],
                    PROBE_TOOLS,
                    add_generation_prompt=False,
                )
            except RendererError:
                continue
            common = _common_prefix(prompt, full)
            text = full[common:]
            cut = min((i for i in (text.find(s) for s in stops) if i >= 0), default=len(text))
            text = text[:cut]
            return ProbeTurn(
                text=text,
                calls=[PROBE_CALLS[i] for i in indices],
                content=PROBE_CONTENT if PROBE_CONTENT in text else "",
                reasoning=PROBE_REASONING if PROBE_REASONING in text else "",
                prompt_tail=prompt[:common],
            )
    return None


def _common_prefix(a: str, b: str) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def build_probe(renderer: TemplateRenderer) -> Probe:
    """Render the probe conversation through the renderer's template."""
    try:
        plain = renderer.render_text(BASE_CONVERSATION, None, add_generation_prompt=True)
        prompt = renderer.render_text(BASE_CONVERSATION, PROBE_TOOLS, add_generation_prompt=True)
    except RendererError as exc:
        return Probe(renders_tools=False, error=str(exc))
    if prompt == plain:
        return Probe(renders_tools=False)
    every = list(range(len(PROBE_CALLS)))
    whole = _render_turn(renderer, prompt, every)
    if whole is not None and PROBE_CALLS[-1][0] in whole.text:
        return Probe(renders_tools=True, mode="one turn with every call", turns=[whole])
    turns = [_render_turn(renderer, prompt, [i]) for i in every]
    if all(t is not None and PROBE_CALLS[i][0] in t.text for i, t in enumerate(turns)):
        return Probe(renders_tools=True, mode="one turn per call", turns=[t for t in turns if t is not None])
    shown = whole.text if whole is not None else prompt
    return Probe(
        renders_tools=True, error=f"no assistant turn renders the probe calls; rendered: {shown[:1200]!r}"
    )


def check_parser(parser: Any, probe: Probe) -> str | None:
    """None when the parser reads every probe turn back exactly, else why not."""
    for turn in probe.turns:
        open_tag = getattr(parser, "open_reasoning_tag", None)
        in_reasoning = bool(open_tag) and turn.prompt_tail.rstrip().endswith(str(open_tag))
        try:
            result = parser.parse(turn.text, tools=PROBE_TOOLS, in_reasoning=in_reasoning)
        except Exception as exc:
            return f"raised {type(exc).__name__}: {exc}"
        if result.unparsed:
            return f"unparsed block: {result.unparsed[0].error}"
        got = [(c.name, _canonical(c.arguments)) for c in result.tool_calls]
        want = [(name, _canonical(args)) for name, args in turn.calls]
        if got != want:
            return f"calls {got!r} != {want!r}"
        if any(c.recovered for c in result.tool_calls):
            return "a call needed a lenient parse"
        if (result.content or "") != turn.content:
            return f"content {result.content!r} != {turn.content!r}"
        if (result.reasoning or "") != turn.reasoning:
            return f"reasoning {result.reasoning!r} != {turn.reasoning!r}"
    return None


def _canonical(arguments: Any) -> str:
    return json.dumps(arguments, sort_keys=True)


def resolve_parser(
    renderer: TemplateRenderer, setting: str, reasoning_tags: Any = "auto"
) -> tuple[Any, dict[str, Any]]:
    """The parser for a `tool_call_parser` setting and its lock.json record (`setting, parser, verified, reason`)."""

    def record(parser: str | None, verified: bool | None, reason: str) -> dict[str, Any]:
        return {"setting": setting, "parser": parser, "verified": verified, "reason": reason}

    if setting == "none":
        return get_parser("none", reasoning_tags), record("none", None, "tool_call_parser: none")
    probe = build_probe(renderer)
    if setting != "auto":
        parser = make_parser(setting, reasoning_tags)
        if not probe.renders_tools or probe.error:
            return parser, record(setting, None, probe.error or "the template renders no tools: not probed")
        failure = check_parser(parser, probe)
        if failure:
            log.warning(
                "tool_call_parser %s does not read the template's tool calls back: %s", setting, failure
            )
            return parser, record(setting, False, f"round trip failed ({probe.mode}): {failure}")
        return parser, record(setting, True, f"round trip ({probe.mode})")
    if not probe.renders_tools:
        if probe.error:
            raise ConfigError(
                f"tool_call_parser auto: the chat template cannot render the probe: {probe.error}"
            )
        log.warning("the chat template renders no tools: tool_call_parser auto is 'none' (no tool calls)")
        return get_parser("none", reasoning_tags), record("none", None, "the template renders no tools")
    if probe.error:
        raise ConfigError(
            f"tool_call_parser auto: the template renders tools but cannot be probed: {probe.error}; "
            "set tool_call_parser to a parser name or 'package.module:attr'"
        )
    failures: list[str] = []
    for name in parser_names():
        parser = get_parser(name, reasoning_tags)
        failure = check_parser(parser, probe)
        if failure is None:
            return parser, record(name, True, f"round trip ({probe.mode})")
        failures.append(f"  {name}: {failure}")
    rendered = "\n---\n".join(t.text for t in probe.turns)[:1200]
    raise ConfigError(
        "tool_call_parser auto: no parser reads this chat template's tool calls back.\n"
        f"rendered probe ({probe.mode}):\n{rendered}\n"
        "parsers:\n" + "\n".join(failures) + "\n"
        "set tool_call_parser to a parser name, or write one (a ToolCallParser subclass, 'package.module:attr')"
    )
