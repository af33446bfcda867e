"""Gateways over a scripted policy: `make_gateway` builds a real `ModelGateway` on the toy tokenizer,
and `serve_policy` installs one as the process-default gateway for in-process rollouts.

`serve_policy` installs the policy for the whole process: `platoon train`, `platoon eval` and `platoon rollout`
started in that process (and `default_gateway()`) sample it instead of a Tinker service, for the rollouts they run
in this process (rollout workers and subprocess slots never see it). Nothing is served over HTTP.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from platoon.gateway.core import ModelGateway
from platoon.gateway.default import default_policy as installed
from platoon.gateway.default import install_default_policy
from platoon.renderers.base import get_renderer
from platoon.renderers.toy import TOY_RENDERER_NAME, toy_tokenizer
from platoon.testing.policy import ScriptedPolicy

__all__ = ["DefaultPolicy", "default_gateway", "default_policy", "make_gateway", "serve_policy"]

#: The key `serve_policy` sets when none is set: the Tinker SDK wants one even though nothing leaves the process.
TESTING_API_KEY = "tml-platoon-testing"


def _policy(policy: Any, tokenizer: Any) -> ScriptedPolicy:
    if isinstance(policy, ScriptedPolicy):
        return policy
    if hasattr(policy, "sample_async"):
        return policy  # any Tinker-like sampler is served as it is
    return ScriptedPolicy(policy, tokenizer=tokenizer)


def _same_tokenizer(a: Any, b: Any) -> bool:
    if a is b:
        return True
    vocab_a = getattr(a, "get_vocab", None)
    vocab_b = getattr(b, "get_vocab", None)
    if callable(vocab_a) and callable(vocab_b):
        return bool(vocab_a() == vocab_b())
    return False


def make_gateway(
    policy: Any = (),
    *,
    tokenizer: Any = None,
    renderer: Any = None,
    renderer_kwargs: Mapping[str, Any] | None = None,
    model_name: str = "platoon/toy",
    **settings: Any,
) -> ModelGateway:
    """A real `ModelGateway` sampling `policy` (a `ScriptedPolicy`, or a script list/function wrapped in one).

    `renderer` is a platoon renderer name (default `qwen3_instruct`; `renderer_kwargs` set as attributes, an
    unknown one a `ValueError`) or a renderer object (then `renderer_kwargs` is refused). `settings` are the
    gateway's: `max_tokens`, `temperature`, `top_k`, `top_p`, `seed`, `context_window_length`,
    `sample_timeout_seconds`, `max_request_tokens`, `max_prompt_tokens`. The policy's and the gateway's tokenizers
    must match.
    """
    if renderer is not None and not isinstance(renderer, str):
        if renderer_kwargs:
            raise ValueError("renderer_kwargs apply to a renderer given by name, not to a renderer object")
        renderer_obj = renderer
        tokenizer = tokenizer if tokenizer is not None else renderer.tokenizer
    else:
        if tokenizer is None:
            tokenizer = toy_tokenizer()

        renderer_obj = get_renderer(
            renderer or TOY_RENDERER_NAME, tokenizer, renderer_kwargs=dict(renderer_kwargs or {})
        )
    sampler = _policy(policy, tokenizer)
    policy_tokenizer = getattr(sampler, "tokenizer", None)
    if policy_tokenizer is not None and not _same_tokenizer(policy_tokenizer, renderer_obj.tokenizer):
        raise ValueError(
            "the policy's tokenizer and the gateway's differ: give ScriptedPolicy the gateway's tokenizer"
        )
    return ModelGateway(sampler, renderer_obj, model_name=model_name, **settings)


@dataclass(frozen=True)
class DefaultPolicy:
    """What `serve_policy` installed: the policy and how gateways over it are made."""

    policy: Any
    tokenizer: Any
    renderer: Any
    settings: Mapping[str, Any]

    def gateway(
        self,
        *,
        model_name: str = "platoon/toy",
        renderer: Any = None,
        renderer_kwargs: Mapping[str, Any] | None = None,
        **settings: Any,
    ) -> ModelGateway:
        """A gateway over the served policy; the served `renderer`, when one was given, wins over the caller's."""
        chosen = self.renderer if self.renderer is not None else renderer
        return make_gateway(
            self.policy,
            tokenizer=self.tokenizer,
            renderer=chosen,
            renderer_kwargs=None if self.renderer is not None else renderer_kwargs,
            model_name=model_name,
            **{**settings, **self.settings},
        )


def default_policy() -> DefaultPolicy | None:
    """The policy `serve_policy` installed, or None."""
    served = installed()
    return served if isinstance(served, DefaultPolicy) else None


def default_gateway(**kwargs: Any) -> ModelGateway | None:
    """A gateway over the served policy (see `DefaultPolicy.gateway`), or None when nothing is served."""
    served = default_policy()
    return None if served is None else served.gateway(**kwargs)


@contextlib.contextmanager
def serve_policy(
    policy: Any = (), *, tokenizer: Any = None, renderer: Any = None, **settings: Any
) -> Iterator[ScriptedPolicy]:
    """Install `policy` as the process-default gateway's sampler until the block ends; yields the policy.

    Sets `TINKER_API_KEY=tml-platoon-testing` when unset; restores the previous default and key on exit.
    """
    if tokenizer is None:
        if renderer is not None and not isinstance(renderer, str):
            tokenizer = renderer.tokenizer
        else:
            tokenizer = toy_tokenizer()
    scripted = _policy(policy, tokenizer)
    previous_key = os.environ.get("TINKER_API_KEY")
    previous = install_default_policy(DefaultPolicy(scripted, tokenizer, renderer, dict(settings)))
    if previous_key is None:
        os.environ["TINKER_API_KEY"] = TESTING_API_KEY
    try:
        yield scripted
    finally:
        install_default_policy(previous)
        if previous_key is None:
            os.environ.pop("TINKER_API_KEY", None)
        else:
            os.environ["TINKER_API_KEY"] = previous_key
