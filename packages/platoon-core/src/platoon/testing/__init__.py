"""platoon.testing: run environments, harnesses and programs on the CPU with a scripted policy and a toy tokenizer.

Every name is imported on first use. Also an opt-in pytest plugin (`pytest -p platoon.testing`):
its fixtures live in `platoon.testing.pytest_plugin`, which `pytest_plugins` below makes pytest load.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from platoon._lazy import lazy_exports

_TOKENIZER = "platoon.renderers.toy"
_POLICY = "platoon.testing.policy"

#: public name -> the module that defines it
_EXPORTS: dict[str, str] = {
    **dict.fromkeys(
        ["TOY_MODEL_NAME", "TOY_RENDERER_NAME", "TOY_TOKENIZER_DIR", "toy_tokenizer", "toy_renderer"],
        _TOKENIZER,
    ),
    **dict.fromkeys(
        [
            "Completion",
            "PolicyCall",
            "ScriptExhaustedError",
            "ScriptedPolicy",
            "last_user_message",
            "rules",
            "sample_response",
            "tool_call",
        ],
        _POLICY,
    ),
    "make_gateway": "platoon.testing.gateway",
    "serve_policy": "platoon.testing.gateway",
    "EpisodeRun": "platoon.testing.episode",
    "run_episode": "platoon.testing.episode",
    "arun_episode": "platoon.testing.episode",
    "LocalTinkerServer": "platoon.local_server",
    "local_tinker_server": "platoon.local_server",
}

__all__ = sorted(_EXPORTS)

#: read by pytest when this module is loaded as a plugin (`-p platoon.testing`): the fixtures' module
pytest_plugins = ["platoon.testing.pytest_plugin"]


__getattr__, __dir__ = lazy_exports(globals(), _EXPORTS)


if TYPE_CHECKING:
    from platoon.renderers.toy import TOY_MODEL_NAME as TOY_MODEL_NAME
    from platoon.renderers.toy import TOY_RENDERER_NAME as TOY_RENDERER_NAME
    from platoon.renderers.toy import TOY_TOKENIZER_DIR as TOY_TOKENIZER_DIR
    from platoon.renderers.toy import toy_renderer as toy_renderer
    from platoon.renderers.toy import toy_tokenizer as toy_tokenizer
    from platoon.testing.episode import EpisodeRun as EpisodeRun
    from platoon.testing.episode import arun_episode as arun_episode
    from platoon.testing.episode import run_episode as run_episode
    from platoon.testing.policy import Completion as Completion
    from platoon.testing.policy import PolicyCall as PolicyCall
    from platoon.testing.policy import ScriptedPolicy as ScriptedPolicy
    from platoon.testing.policy import ScriptExhaustedError as ScriptExhaustedError
    from platoon.testing.policy import last_user_message as last_user_message
    from platoon.testing.policy import rules as rules
    from platoon.testing.policy import sample_response as sample_response
    from platoon.testing.policy import tool_call as tool_call
