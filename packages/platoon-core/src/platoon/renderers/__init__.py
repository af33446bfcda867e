"""platoon's named renderers and tokenizer loading, under tinker-cookbook's renderer names.

Import-light: every name is imported on first use; rendering imports no heavy dependency, and the Tinker SDK is
imported only to build `ModelInput`s.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from platoon._lazy import lazy_exports

_BASE = "platoon.renderers.base"
_TOKENIZERS = "platoon.renderers.tokenizers"
_CHAT_TEMPLATE = "platoon.renderers.chat_template"

#: public name -> the module that defines it
_EXPORTS: dict[str, str] = {
    **dict.fromkeys(
        [
            "CompletionParts",
            "ContentPart",
            "FunctionBody",
            "Message",
            "ParsedCompletion",
            "RenderContext",
            "RenderedMessage",
            "Renderer",
            "RendererError",
            "ToolCall",
            "ToolSpec",
            "TrainOnWhat",
            "UnparsedToolCall",
            "apply_renderer_kwargs",
            "get_renderer",
            "message_to_jsonable",
            "register_renderer",
            "renderer_names",
            "unregister_renderer",
        ],
        _BASE,
    ),
    **dict.fromkeys(
        [
            "TokenizersTokenizer",
            "get_tokenizer",
            "is_tokenizer_registered",
            "register_tokenizer",
            "registered_tokenizer_names",
            "unregister_tokenizer",
        ],
        _TOKENIZERS,
    ),
    "ChatTemplateRenderer": _CHAT_TEMPLATE,
}

__all__ = sorted(_EXPORTS)


__getattr__, __dir__ = lazy_exports(globals(), _EXPORTS)


if TYPE_CHECKING:
    from platoon.renderers.base import CompletionParts as CompletionParts
    from platoon.renderers.base import ContentPart as ContentPart
    from platoon.renderers.base import FunctionBody as FunctionBody
    from platoon.renderers.base import Message as Message
    from platoon.renderers.base import ParsedCompletion as ParsedCompletion
    from platoon.renderers.base import RenderContext as RenderContext
    from platoon.renderers.base import RenderedMessage as RenderedMessage
    from platoon.renderers.base import Renderer as Renderer
    from platoon.renderers.base import RendererError as RendererError
    from platoon.renderers.base import ToolCall as ToolCall
    from platoon.renderers.base import ToolSpec as ToolSpec
    from platoon.renderers.base import TrainOnWhat as TrainOnWhat
    from platoon.renderers.base import UnparsedToolCall as UnparsedToolCall
    from platoon.renderers.base import apply_renderer_kwargs as apply_renderer_kwargs
    from platoon.renderers.base import get_renderer as get_renderer
    from platoon.renderers.base import message_to_jsonable as message_to_jsonable
    from platoon.renderers.base import register_renderer as register_renderer
    from platoon.renderers.base import renderer_names as renderer_names
    from platoon.renderers.base import unregister_renderer as unregister_renderer
    from platoon.renderers.chat_template import ChatTemplateRenderer as ChatTemplateRenderer
    from platoon.renderers.tokenizers import TokenizersTokenizer as TokenizersTokenizer
    from platoon.renderers.tokenizers import get_tokenizer as get_tokenizer
    from platoon.renderers.tokenizers import is_tokenizer_registered as is_tokenizer_registered
    from platoon.renderers.tokenizers import register_tokenizer as register_tokenizer
    from platoon.renderers.tokenizers import (
        registered_tokenizer_names as registered_tokenizer_names,
    )
    from platoon.renderers.tokenizers import unregister_tokenizer as unregister_tokenizer
