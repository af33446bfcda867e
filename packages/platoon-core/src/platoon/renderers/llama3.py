"""The `llama3` renderer: `<|start_header_id|>role<|end_header_id|>\\n\\ncontent<|eot_id|>` after `<|begin_of_text|>`.

Renders exactly what tinker-cookbook 0.3.0's `Llama3Renderer` renders: no "Cutting Knowledge Date" system text, no
tool declaration (Llama 3's bare-JSON tool calls cannot be told apart from JSON answers), text content only.
"""

from __future__ import annotations

from platoon.renderers.base import (
    Message,
    RenderContext,
    RenderedMessage,
    Renderer,
)
from platoon.renderers.role_colon import ensure_text


class Llama3Renderer(Renderer):
    """Llama 3 Instruct; every message keeps its content, so it has the extension property."""

    #: a message's render is a function of the message, its context and the renderer's attributes
    memoize_renders = True

    @property
    def has_extension_property(self) -> bool:
        return True

    def render_message(self, message: Message, ctx: RenderContext) -> RenderedMessage:
        header = f"<|start_header_id|>{message['role']}<|end_header_id|>\n\n"
        output = ensure_text(message["content"]) + "<|eot_id|>"
        return RenderedMessage(output=[self._encode(output)], header=self._encode(header))

    @property
    def _bos_tokens(self) -> list[int]:
        return [self._single_token("<|begin_of_text|>")]

    @property
    def _end_message_token(self) -> int:
        return self._single_token("<|eot_id|>")

    def get_stop_sequences(self) -> list[int]:
        return [self._end_message_token]

    def parse_response(self, response: list[int]) -> tuple[Message, bool]:
        return self._parse_to_end_of_message(response)
