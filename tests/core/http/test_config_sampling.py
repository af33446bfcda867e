"""The rollout's `inference_params` through the real gateway path (`run_episode`: the harness rollout, the gateway
served over HTTP and in process): they fill what a call leaves unset under either `sampling_precedence`; under
`request` a call's own values win, under `config` the config's win for policy calls; aux calls keep their own."""

from __future__ import annotations

from typing import Any

import openai
import pytest

from platoon.harness.agent import AgentResult
from platoon.harness.function import FunctionHarness
from platoon.testing.episode import run_episode

#: a call's own values, each different from the config's and from the gateway's defaults
OWN = {"temperature": 0.9, "top_p": 0.5, "top_k": 7, "max_completion_tokens": 32}
#: the config's values
CONFIG = {"temperature": 0.3, "top_p": 0.8, "top_k": 5, "max_completion_tokens": 64}
#: the gateway's defaults, as the sampler sees them
DEFAULTS = {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "max_tokens": 4096}
#: the sampler's name of each config field
SAMPLER_KEY = {
    "temperature": "temperature",
    "top_p": "top_p",
    "top_k": "top_k",
    "max_completion_tokens": "max_tokens",
}


async def _calls(ctx: Any) -> AgentResult:
    """Over HTTP with the OpenAI client: a policy call setting nothing, a policy call setting every field, an aux
    call setting nothing and one setting every field; then in process, a policy call setting nothing."""
    endpoint = ctx.endpoint
    messages = [{"role": "user", "content": ctx.instruction}]
    own = {
        "temperature": OWN["temperature"],
        "top_p": OWN["top_p"],
        "max_completion_tokens": OWN["max_completion_tokens"],
        "extra_body": {"top_k": OWN["top_k"]},
    }
    async with openai.AsyncOpenAI(
        base_url=endpoint.base_url, api_key=endpoint.api_key, max_retries=0
    ) as client:
        await client.chat.completions.create(model=endpoint.model, messages=messages)
        await client.chat.completions.create(model=endpoint.model, messages=messages, **own)
        aux = endpoint.headers("aux")
        await client.chat.completions.create(model=endpoint.model, messages=messages, extra_headers=aux)
        await client.chat.completions.create(
            model=endpoint.model, messages=messages, extra_headers=aux, **own
        )
    await ctx.chat(messages)
    return AgentResult(final_message="done")


HARNESS = FunctionHarness("test-config-sampling", "1", "inline", False, _calls)


def _sampled(field: str, precedence: str, tmp_path: Any) -> list[Any]:
    """The value of `field` each of the five calls sampled with, the config setting only `field`."""
    run = run_episode(
        "t1",
        service="table",
        service_kwargs={"rows": [{"id": "t1", "goal": "say hi"}]},
        harness=HARNESS,
        policy=["ok"] * 5,
        rollout={"inference_params": {field: CONFIG[field]}, "sampling_precedence": precedence},
        output_dir=tmp_path,
    )
    calls = run.policy.calls
    assert len(calls) == 5
    key = SAMPLER_KEY[field]
    # every other field is the gateway's default in every call that did not set it
    for call in (calls[0], calls[2], calls[4]):
        for other, default in DEFAULTS.items():
            if other != key:
                assert getattr(call.sampling_params, other) == default, (other, call.sampling_params)
    return [getattr(call.sampling_params, key) for call in calls]


@pytest.mark.parametrize("field", sorted(CONFIG))
def test_request_precedence_fills_unset_fields_from_the_config_and_keeps_the_calls_own(field, tmp_path):
    unset_policy, own_policy, unset_aux, own_aux, unset_in_process = _sampled(field, "request", tmp_path)
    assert (unset_policy, unset_aux, unset_in_process) == (CONFIG[field],) * 3
    assert (own_policy, own_aux) == (OWN[field],) * 2


@pytest.mark.parametrize("field", sorted(CONFIG))
def test_config_precedence_makes_the_config_win_for_policy_calls(field, tmp_path):
    unset_policy, own_policy, unset_aux, own_aux, unset_in_process = _sampled(field, "config", tmp_path)
    assert (unset_policy, own_policy, unset_in_process) == (CONFIG[field],) * 3
    assert (unset_aux, own_aux) == (CONFIG[field], OWN[field])  # aux calls keep their own
