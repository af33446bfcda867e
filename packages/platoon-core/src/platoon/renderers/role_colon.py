"""The `role_colon` renderer: `Role: content` turns separated by blank lines, stopped by the text `\\n\\nUser:`.

Renders exactly what tinker-cookbook 0.3.0's `RoleColonRenderer` renders; it needs no special tokens, so it works
with any tokenizer (text stops), and has no tool declaration.
"""

from __future__ import annotations

import logging

from platoon.renderers.base import (
    ContentPart,
    Message,
    RenderContext,
    RenderedMessage,
    Renderer,
    RendererError,
    ToolSpec,
)

log = logging.getLogger(__name__)

#: the text stop: the blank line and the header of the next user turn
STOP = "\n\nUser:"


def ensure_text(content: str | list[ContentPart]) -> str:
    """Text-only content as a string; anything else (a thinking part, several parts) is a `RendererError`.

    Worded as the cookbook's `ensure_text`, because the golden files record its message.
    """
    if isinstance(content, str):
        return content
    if len(content) == 1 and content[0]["type"] == "text":
        return str(content[0]["text"])
    raise RendererError(f"Expected text content, got multimodal content with {len(content)} parts")


class RoleColonRenderer(Renderer):
    """`User: ...\\n\\nAssistant: ...\\n\\n` (the DeepSeek R1-Zero style); tool calls are not rendered."""

    #: a message's render is a function of the message, its context and the renderer's attributes
    memoize_renders = True

    @property
    def has_extension_property(self) -> bool:
        return True

    def render_message(self, message: Message, ctx: RenderContext) -> RenderedMessage:
        header = message["role"].capitalize() + ":"
        output = " " + ensure_text(message["content"]) + "\n\n"
        # The stop overlap completes `\n\nUser:` after a trained assistant turn; other roles never append it, the
        # placeholder only keeps the chunk non-empty, as in the cookbook.
        overlap = "User:" if message["role"] == "assistant" else "<UNUSED>"
        return RenderedMessage(
            output=[self._encode(output)], header=self._encode(header), stop_overlap=self._encode(overlap)
        )

    @property
    def _bos_tokens(self) -> list[int]:
        bos = getattr(self.tokenizer, "bos_token", None)
        return self._encode(bos) if isinstance(bos, str) else []

    def get_stop_sequences(self) -> list[str]:
        return [STOP]

    def parse_response(self, response: list[int]) -> tuple[Message, bool]:
        """The text before `\\n\\nUser:`, stripped; ok only for exactly one delimiter and no trailing EOS.

        A base model may end on EOS instead of the delimiter: the EOS is dropped, but the parse is not ok.
        """
        tokens = list(response)
        ended_with_eos = False
        eos = getattr(self.tokenizer, "eos_token_id", None)
        if eos is not None and tokens and tokens[-1] == eos:
            tokens = tokens[:-1]
            ended_with_eos = True
        text = str(self.tokenizer.decode(tokens))
        pieces = text.split(STOP)
        if len(pieces) == 1:
            return {"role": "assistant", "content": text.strip()}, False
        if len(pieces) == 2:
            return {"role": "assistant", "content": pieces[0].strip()}, not ended_with_eos
        log.warning(
            "role_colon: the response has %d stop delimiters; only the first turn is kept", len(pieces) - 1
        )
        return {"role": "assistant", "content": pieces[0].strip()}, False

    def create_conversation_prefix_with_tools(
        self, tools: list[ToolSpec], system_prompt: str = ""
    ) -> list[Message]:
        raise NotImplementedError("RoleColonRenderer does not support tool calling")
