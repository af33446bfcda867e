"""The Nemotron-3 renderers: `nemotron3` and `nemotron3_disable_thinking` (tinker-cookbook 0.3.0's, token for token).

Qwen3.5's format with Nemotron-3's template rules: an always-present system turn, XML tool declarations after the
system prompt, `<think></think>` on every assistant turn without shown thinking, and single-newline separators.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from typing import Any

from platoon.renderers.base import (
    Message,
    RenderContext,
    RenderedMessage,
    ToolSpec,
    TrainOnWhat,
)
from platoon.renderers.qwen3_5 import (
    XML_TOOL_INSTRUCTIONS,
    Qwen3_5Renderer,
    format_xml_tool_call,
)


def _extra_keys(obj: Mapping[str, Any], handled: set[str]) -> list[str]:
    """The template's `render_extra_keys`: other keys as `<key>value</key>` (JSON for objects and lists)."""
    return [
        f"<{key}>{json.dumps(value) if isinstance(value, (dict, list)) else str(value)}</{key}>"
        for key, value in obj.items()
        if key not in handled
    ]


def _tool_declaration(tool: ToolSpec) -> str:
    """One tool as Nemotron-3's `<function>` XML (Python `str` for scalars, as the cookbook writes them)."""
    lines = ["<function>", f"<name>{tool['name']}</name>"]
    if tool.get("description", "").strip():
        lines.append(f"<description>{tool['description'].strip()}</description>")
    lines.append("<parameters>")
    params = tool.get("parameters") or {}
    if isinstance(params, dict) and "properties" in params:
        for name, fields in params["properties"].items():
            lines += ["<parameter>", f"<name>{name}</name>"]
            if "type" in fields:
                lines.append(f"<type>{fields['type']!s}</type>")
            if "description" in fields:
                lines.append(f"<description>{fields['description'].strip()}</description>")
            if "enum" in fields:
                lines.append(f"<enum>{json.dumps(fields['enum'])}</enum>")
            lines += _extra_keys(fields, {"name", "type", "description", "enum"})
            lines.append("</parameter>")
    if isinstance(params, dict):
        lines += _extra_keys(params, {"type", "properties", "required"})
        if "required" in params:
            lines.append(f"<required>{json.dumps(params['required'])}</required>")
    lines.append("</parameters>")
    lines += _extra_keys(tool, {"type", "name", "description", "parameters"})
    lines.append("</function>")
    return "\n".join(lines)


def _with_system(messages: Sequence[Message]) -> list[Message]:
    # The HF template always writes a system turn (its system_message is "" when none is given).
    messages = list(messages)
    if not messages or messages[0]["role"] != "system":
        return [{"role": "system", "content": ""}, *messages]
    return messages


class Nemotron3Renderer(Qwen3_5Renderer):
    """Nemotron-3 with thinking: the generation prompt ends with `<think>\\n`.

    Thinking is dropped only from assistant turns before the last user message; those and every turn without
    thinking get `<think></think>` in their header.
    """

    tool_response_close = "\n</tool_response>\n"

    def generation_prompt_chunks(
        self, messages: Sequence[Message], role: str = "assistant", prefill: str | None = None
    ) -> list[list[int]]:
        return super().generation_prompt_chunks(_with_system(messages), role, prefill)

    def supervised_chunks(
        self,
        messages: Sequence[Message],
        train_on_what: TrainOnWhat | str = TrainOnWhat.LAST_ASSISTANT_MESSAGE,
    ) -> list[tuple[list[int], int]]:
        return super().supervised_chunks(_with_system(messages), train_on_what)

    def _assistant_header_suffix(self, message: Message, ctx: RenderContext) -> str:
        historical = ctx.idx < ctx.last_user_index
        content = message.get("content", "")
        has_think = isinstance(content, list) and any(p["type"] == "thinking" for p in content)
        has_think = has_think or (isinstance(content, str) and "<think>" in content)
        if has_think and not historical:
            return ""  # the thinking itself is shown
        if historical and has_think:
            has_text = isinstance(content, list) and any(
                p["type"] == "text" and p.get("text", "") for p in content
            )
            # The template keeps the newline after the dropped `</think>`, except in its tool-call branch, which
            # trims the content.
            if has_text and not message.get("tool_calls"):
                return "<think></think>\n"
        return "<think></think>"

    def render_message(self, message: Message, ctx: RenderContext) -> RenderedMessage:
        if message["role"] == "assistant" and ctx.idx >= ctx.last_user_index and not ctx.is_last:
            # Turns after the last user message keep their thinking (the template's truncation condition).
            ctx = dataclasses.replace(ctx, is_last=True)
        return super().render_message(message, ctx)

    def _format_thinking_text(self, thinking: str) -> str:
        return f"<think>\n{thinking}\n</think>\n"

    def _format_tool_calls(self, message: Message) -> str:
        content = message.get("content", "")
        has_think = isinstance(content, list) and any(p["type"] == "thinking" for p in content)
        has_text = isinstance(content, list) and any(
            p["type"] == "text" and p.get("text", "") for p in content
        )
        # Shown thinking already ends with a newline; text or nothing before the calls gets one.
        prefix = "" if has_think and not has_text else "\n"
        return prefix + "".join(format_xml_tool_call(call) + "\n" for call in message["tool_calls"])

    def _strip_after_thinking(self, text: str) -> str:
        # One separator newline, then Qwen3.5's two-newline rule (as the cookbook applies both in turn).
        if text.startswith("\n"):
            text = text[1:]
        return super()._strip_after_thinking(text)

    def _call_suffix(self) -> str:
        return "\n"

    def create_conversation_prefix_with_tools(
        self, tools: list[ToolSpec], system_prompt: str = ""
    ) -> list[Message]:
        """One system message: the system prompt, then the `# Tools` block with XML declarations."""
        if not tools:
            return [{"role": "system", "content": system_prompt}]
        tools_text = (
            "# Tools\n\nYou have access to the following functions:\n\n<tools>\n"
            + "\n".join(_tool_declaration(tool) for tool in tools)
            + "\n</tools>\n\n"
            + XML_TOOL_INSTRUCTIONS
        )
        return [
            {
                "role": "system",
                "content": system_prompt + "\n\n" + tools_text if system_prompt else tools_text,
            }
        ]


class Nemotron3DisableThinkingRenderer(Nemotron3Renderer):
    """Nemotron-3 with thinking off: the generation prompt ends with `<think></think>` (no newlines)."""

    generation_prefill = "<think></think>"
