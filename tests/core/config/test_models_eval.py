"""The evaluation config models: defaults, hosted models and their refusals, and the renderer rules."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import BaseModel, ValidationError

from platoon.eval.config_defs import (
    EvalWorkflowConfig,
    HostedConfig,
    InferenceConfig,
    PlatoonEvalConfig,
    PricingConfig,
)
from platoon.eval.run import PlatoonEvalConfig as PlatoonEvalConfigFromRun

HOSTED = {"base_url": "https://api.example.com/v1", "api_key_env": "EXAMPLE_API_KEY"}


def evaluation(**inference: Any) -> dict[str, Any]:
    extra = inference.pop("top", {})
    return {"inference": {"model_name": "Qwen/Qwen3-4B", **inference}, **extra}


def problems(model: type[BaseModel], data: Any) -> list[tuple[str, str]]:
    with pytest.raises(ValidationError) as info:
        model.model_validate(data)
    return [
        (
            ".".join(str(p) for p in e["loc"]),
            str(e["ctx"]["error"]) if e["type"] == "value_error" else e["type"],
        )
        for e in info.value.errors(include_url=False)
    ]


def test_the_run_module_names_the_same_class() -> None:
    assert PlatoonEvalConfigFromRun is PlatoonEvalConfig


def test_defaults() -> None:
    cfg = PlatoonEvalConfig.model_validate(evaluation(renderer_name="qwen3"))
    assert cfg.split == "eval" and cfg.stage == "full" and cfg.environments == []
    inf = cfg.inference
    assert inf.model_path is None and inf.renderer_kwargs == {} and inf.sample_timeout_seconds is None
    assert inf.context_window_length is None and inf.output_dir is None and inf.hosted is None
    assert (inf.resume, inf.retry_errored, inf.judges) == (True, True, True)
    wf = inf.workflow
    assert (wf.num_rollouts_per_task, wf.num_concurrent_workers, wf.success_threshold) == (1, 32, 1.0)
    assert (wf.fail_fast, wf.count_timeout_as_failure, wf.use_subprocesses) == (False, False, False)
    assert wf.subprocess_max_workers is None and wf.rollout_config.output_dir == "rollout_results"


def test_hosted_defaults() -> None:
    hosted = HostedConfig.model_validate({"base_url": "http://localhost:8000"})
    assert hosted.api_key_env is None and hosted.timeout_s == 600 and hosted.max_retries == 6
    assert hosted.max_concurrent_requests is None and hosted.pricing is None


def test_required_keys() -> None:
    assert problems(PlatoonEvalConfig, {}) == [("inference", "missing")]
    assert problems(PlatoonEvalConfig, {"inference": {}}) == [("inference.model_name", "missing")]
    assert problems(HostedConfig, {}) == [("base_url", "missing")]


@pytest.mark.parametrize(
    "url",
    ["https://api.example.com/v1", "http://127.0.0.1:8000", "https://h.example/openai/deployments/x"],
)
def test_good_base_urls(url: str) -> None:
    assert HostedConfig(base_url=url).base_url == url


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("ftp://example.com", "not an http or https URL with a host"),
        ("example.com/v1", "not an http or https URL with a host"),
        ("https://", "not an http or https URL with a host"),
        ("https://user:secret@example.com", "must not carry credentials"),
        ("https://token@example.com", "must not carry credentials"),
        ("https://example.com/v1?key=1", "has a query or fragment"),
        ("https://example.com/v1#frag", "has a query or fragment"),
    ],
)
def test_bad_base_urls(url: str, says: str) -> None:
    ((loc, message),) = problems(HostedConfig, {"base_url": url})
    assert loc == "base_url" and says in message
    assert "secret" not in message


def test_api_key_env_is_a_variable_name() -> None:
    assert HostedConfig(base_url="http://h", api_key_env="OPENAI_API_KEY").api_key_env == "OPENAI_API_KEY"
    ((loc, message),) = problems(HostedConfig, {"base_url": "http://h", "api_key_env": "sk-abc123"})
    assert loc == "api_key_env" and "not an environment variable name" in message


@pytest.mark.parametrize(
    ("data", "loc"),
    [
        ({"timeout_s": 0}, "timeout_s"),
        ({"max_retries": -1}, "max_retries"),
        ({"max_retries": True}, "max_retries"),
        ({"max_concurrent_requests": 0}, "max_concurrent_requests"),
        ({"pricing": {"input": -1, "output": 1}}, "pricing.input"),
        ({"pricing": {"input": 1}}, "pricing.output"),
        ({"pricing": {"input": 1, "output": 2, "cache_write": -0.5}}, "pricing.cache_write"),
    ],
)
def test_hosted_bounds(data: dict[str, Any], loc: str) -> None:
    assert [found[0] for found in problems(HostedConfig, {"base_url": "http://h", **data})] == [loc]


def test_pricing() -> None:
    pricing = PricingConfig.model_validate({"input": 3, "output": 15, "cached_input": 0.3})
    assert (pricing.input, pricing.output, pricing.cached_input, pricing.cache_write) == (
        3.0,
        15.0,
        0.3,
        None,
    )


@pytest.mark.parametrize(
    "key", ["kind", "require_api_key", "headers", "headers_env", "extra_body", "drop_params"]
)
def test_stale_hosted_keys_have_hints(key: str) -> None:
    assert problems(HostedConfig, {"base_url": "http://h", key: "x"}) == [(key, "extra_forbidden")]
    assert HostedConfig.UNKNOWN_KEY_HINTS[key]


def test_backend_hint() -> None:
    assert problems(PlatoonEvalConfig, evaluation(renderer_name="r", backend="openai")) == [
        ("inference.backend", "extra_forbidden")
    ]
    assert "hosted" in InferenceConfig.UNKNOWN_KEY_HINTS["backend"]


def test_a_hosted_model() -> None:
    cfg = PlatoonEvalConfig.model_validate(evaluation(hosted=HOSTED))
    assert cfg.inference.hosted is not None and cfg.inference.has_policy


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("renderer_name", "qwen3"),
        ("model_path", "tinker://run/sampler_weights/x"),
        ("renderer_kwargs", {"enable_thinking": False}),
        ("sample_timeout_seconds", 30),
        ("context_window_length", 32768),
    ],
)
def test_hosted_refuses_tinker_settings(key: str, value: Any) -> None:
    ((loc, message),) = problems(PlatoonEvalConfig, evaluation(hosted=HOSTED, **{key: value}))
    assert loc == "inference"
    assert message.startswith(f"{key} do not apply to a hosted model")


def test_hosted_refusal_names_every_setting() -> None:
    ((_, message),) = problems(
        PlatoonEvalConfig, evaluation(hosted=HOSTED, renderer_name="r", context_window_length=4096)
    )
    assert message.startswith("renderer_name, context_window_length do not apply to a hosted model")


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("model_path", "tinker://run/sampler_weights/x"),
        ("renderer_kwargs", {"enable_thinking": False}),
        ("sample_timeout_seconds", 30),
        ("context_window_length", 32768),
    ],
)
def test_policy_settings_need_a_renderer(key: str, value: Any) -> None:
    ((loc, message),) = problems(PlatoonEvalConfig, evaluation(**{key: value}))
    assert loc == "inference" and "without renderer_name no Tinker policy is served" in message
    assert PlatoonEvalConfig.model_validate(evaluation(renderer_name="qwen3", **{key: value}))


def test_no_policy_is_fine_without_harness_rollouts() -> None:
    cfg = PlatoonEvalConfig.model_validate(
        evaluation(top={"environments": [{"service": "table", "rollout": "my.module:rollout"}]})
    )
    assert not cfg.inference.has_policy


def test_harness_rollouts_need_a_policy() -> None:
    entries = [
        {"name": "a", "service": "harbor", "harness": "platoon-codeact"},
        {"name": "b", "service": "table", "rollout": "my.module:rollout"},
        {"name": "c", "service": "table", "eval_rollout": "harness_rollout"},
    ]
    found = problems(PlatoonEvalConfig, evaluation(top={"environments": entries}))
    assert [message.split(" rolls out")[0] for _, message in found] == ["environments.0", "environments.2"]
    assert "set inference.renderer_name (a Tinker policy) or inference.hosted" in found[0][1]
    # With a policy, or when only the report is rebuilt, they are fine.
    assert PlatoonEvalConfig.model_validate(evaluation(renderer_name="r", top={"environments": entries}))
    assert PlatoonEvalConfig.model_validate(evaluation(hosted=HOSTED, top={"environments": entries}))
    assert PlatoonEvalConfig.model_validate(evaluation(top={"environments": entries, "stage": "report"}))


def test_the_split_picks_the_rollout() -> None:
    entries = [{"service": "table", "rollout": "harness_rollout", "eval_rollout": "m:fn"}]
    assert PlatoonEvalConfig.model_validate(evaluation(top={"environments": entries}))
    found = problems(PlatoonEvalConfig, evaluation(top={"environments": entries, "split": "train"}))
    assert len(found) == 1


def test_judges_are_set_on_inference_not_the_rollout() -> None:
    cfg = PlatoonEvalConfig.model_validate(evaluation(renderer_name="r", judges=False))
    assert cfg.inference.judges is False
    ((loc, message),) = problems(
        PlatoonEvalConfig, evaluation(renderer_name="r", workflow={"rollout_config": {"judges": False}})
    )
    assert loc == "inference" and message.startswith(
        "workflow.rollout_config.judges: set inference.judges instead"
    )


def test_max_concurrent_requests_covers_the_worker_processes() -> None:
    workflow = {"use_subprocesses": True, "subprocess_max_workers": 4}
    hosted = {**HOSTED, "max_concurrent_requests": 4}
    assert PlatoonEvalConfig.model_validate(evaluation(hosted=hosted, workflow=workflow))
    ((_, message),) = problems(
        PlatoonEvalConfig, evaluation(hosted={**HOSTED, "max_concurrent_requests": 3}, workflow=workflow)
    )
    assert "hosted.max_concurrent_requests (3)" in message and "subprocess_max_workers 4" in message


@pytest.mark.parametrize(
    ("data", "loc"),
    [
        ({"num_rollouts_per_task": 0}, "num_rollouts_per_task"),
        ({"num_concurrent_workers": 0}, "num_concurrent_workers"),
        ({"subprocess_max_workers": 0}, "subprocess_max_workers"),
        ({"fail_fast": 1}, "fail_fast"),
        ({"success_threshold": True}, "success_threshold"),
    ],
)
def test_eval_workflow_bounds(data: dict[str, Any], loc: str) -> None:
    assert [found[0] for found in problems(EvalWorkflowConfig, data)] == [loc]


def test_top_level_rules() -> None:
    assert problems(PlatoonEvalConfig, evaluation(renderer_name="r", top={"stage": "all"}))[0][0] == "stage"
    assert problems(PlatoonEvalConfig, evaluation(renderer_name="r", top={"split": ""}))[0][0] == "split"
    found = problems(PlatoonEvalConfig, evaluation(renderer_name="r", top={"train": {}}))
    assert found == [("train", "extra_forbidden")]
    found = problems(PlatoonEvalConfig, evaluation(renderer_name="r", top={"environments": {"a": {}}}))
    assert found[0][0] == "environments" and "not a mapping" in found[0][1]
