"""`platoon.testing.run_episode` as an extension author uses it: a reward processor applied as training applies it,
no reward for an episode that was not scored, and code written for 0.2.0 (where `run_episode` was a coroutine
function) running unchanged."""

from __future__ import annotations

import asyncio
import sys
import textwrap
from typing import Any

import pytest

from platoon.episode.rollout import RewardProcessorError
from platoon.errors import ConfigError, ExtensionError
from platoon.harness.agent import AgentResult
from platoon.testing import EpisodeRun, arun_episode, make_gateway, run_episode

from .conftest import FakeService, fh

#: the bandit (ORS in process): only the answer C scores 1
BANDIT = {"service": "python://platoon.envs.bandit.env:BanditEnvironment", "harness": "platoon-bandit-answer"}

SCORING = textwrap.dedent(
    """
    def bonus(trajectory):
        return 0.5 * float(trajectory["reward"]) + 0.25, {"reward/bonus": 0.25}


    def strict(trajectory):
        return trajectory["score"], {}
    """
)


@pytest.fixture
def scoring(tmp_path, monkeypatch):
    """The module `run_episode_scoring` holding two reward processors, importable by import string."""
    (tmp_path / "run_episode_scoring.py").write_text(SCORING)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "run_episode_scoring"
    sys.modules.pop("run_episode_scoring", None)


# ---------------------------------------------------------------------------------------------------------------
# The reward processor


def test_a_reward_processor_given_by_import_string_scores_the_episode_as_training_does(scoring, tmp_path):
    run = run_episode(
        "train:0", **BANDIT, policy=["A"], reward_processor=f"{scoring}:bonus", output_dir=tmp_path
    )
    assert run.outcome["status"] == "scored" and run.root.reward == 0.0  # the environment's own reward
    assert run.reward == 0.25 and run.reward_components == {"reward/bonus": 0.25}
    assert run.scores == {run.root.id: (0.25, {"reward/bonus": 0.25})}
    # recorded on the root as a run records it
    assert run.root.misc["reward_processor"] == f"{scoring}:bonus"


def test_a_reward_processor_given_as_a_callable_on_a_named_environment(tmp_path):
    def double(trajectory: dict[str, Any]) -> tuple[float, dict[str, float]]:
        return 2 * trajectory["reward"], {"reward/doubled": 1.0}

    # the named environment gives the service and harness it names, as a config's `env:` does
    run = run_episode(
        "train:0", env="platoon-bandit@1", policy=["C"], reward_processor=double, output_dir=tmp_path
    )
    assert run.root.misc["harness"]["spec"] == "platoon-bandit-answer@1"
    assert run.reward == 2.0 and run.reward_components == {"reward/doubled": 1.0}


def test_an_unknown_environment_name_is_refused_as_a_config_names_it():
    with pytest.raises(
        ConfigError, match=r"^env: unknown environment 'platoon-bandt' \(did you mean platoon-bandit\?\)"
    ):
        run_episode("train:0", env="platoon-bandt", policy=["C"])


def test_without_a_service_or_an_environment_it_says_what_to_give():
    with pytest.raises(TypeError, match=r"needs service= .* or env= \(a named environment\)"):
        run_episode("train:0", harness="platoon-bandit-answer", policy=["C"])


def test_a_registered_processor_by_name_and_the_built_in_one(monkeypatch, tmp_path):
    from platoon import registry

    monkeypatch.setitem(
        registry._registries["reward_processor"], "test-halve", lambda t: (t["reward"] / 2, {})
    )
    assert run_episode("train:0", **BANDIT, policy=["C"], reward_processor="test-halve").reward == 0.5
    delegation = run_episode("train:0", **BANDIT, policy=["C"], reward_processor="platoon-delegation")
    assert delegation.reward == 1.0 and delegation.reward_components["reward/subagent_launched"] == 0.0


def test_a_processor_that_raises_is_one_error_naming_it(scoring, tmp_path):
    with pytest.raises(RewardProcessorError) as caught:
        run_episode(
            "train:0", **BANDIT, policy=["C"], reward_processor=f"{scoring}:strict", output_dir=tmp_path
        )
    assert str(caught.value) == f"reward processor '{scoring}:strict' raised KeyError: 'score'"
    assert (tmp_path / "trajectory_collection.json").is_file()  # the episode's record is written first


def test_an_unknown_processor_is_refused_before_the_episode_runs():
    from platoon.testing import ScriptedPolicy

    policy = ScriptedPolicy(["C"])
    with pytest.raises(ExtensionError, match="unknown reward processor 'test-no-such-processor'"):
        run_episode("train:0", **BANDIT, policy=policy, reward_processor="test-no-such-processor")
    assert policy.calls == []


# ---------------------------------------------------------------------------------------------------------------
# No reward without a score


async def _broken(ctx: Any) -> AgentResult:
    raise NameError("name 'anser' is not defined")  # a harness bug, not a wrong answer


def test_a_broken_harness_has_no_reward_so_a_test_asserting_a_failure_cannot_pass():
    run = run_episode("t1", service=FakeService(), harness=fh(_broken), policy=[])
    assert run.outcome["status"] == "error" and run.outcome["failure_kind"] == "harness_crash"
    assert run.reward is None and not run.scored
    assert (
        run.reward != 0.0
    )  # `assert run.reward == 0.0` ("the model failed the task") fails on a broken harness


def test_a_processor_does_not_score_an_episode_that_was_not_scored(scoring):
    run = run_episode("t1", service=FakeService(), harness=fh(_broken), reward_processor=f"{scoring}:bonus")
    assert run.reward is None and run.reward_components == {}


def test_a_wrong_answer_is_a_scored_zero():
    run = run_episode("train:0", **BANDIT, policy=["B"])
    assert run.scored and run.reward == 0.0


# ---------------------------------------------------------------------------------------------------------------
# 0.2.0 code, unchanged


def test_awaiting_run_episode_in_an_async_test_as_0_2_0_did():
    async def test_body() -> EpisodeRun:
        run = await run_episode("train:0", **BANDIT, policy=["C"])  # 0.2.0: a coroutine function
        assert run.reward == 1.0
        return run

    assert isinstance(asyncio.run(test_body()), EpisodeRun)


def test_asyncio_run_of_run_episode_as_0_2_0_scripts_did():
    run = asyncio.run(run_episode("train:0", **BANDIT, policy=["C"]))
    assert isinstance(run, EpisodeRun) and run.reward == 1.0


def test_episodes_gathered_concurrently_in_one_loop():
    async def both() -> list[EpisodeRun]:
        return await asyncio.gather(
            run_episode("train:0", **BANDIT, policy=["C"]), arun_episode("train:1", **BANDIT, policy=["A"])
        )

    right, wrong = asyncio.run(both())
    assert (right.reward, wrong.reward) == (1.0, 0.0)


def test_reading_a_result_off_an_episode_not_awaited_says_to_await_it():
    async def forgot_await() -> None:
        pending = run_episode("train:0", **BANDIT, policy=["C"])
        try:
            with pytest.raises(
                AttributeError, match=r"write `run = await run_episode\(\.\.\.\)`.*run\.reward"
            ):
                _ = pending.reward
        finally:
            pending.close()  # never started: nothing ran

    asyncio.run(forgot_await())


def test_a_gateway_as_the_policy_as_0_2_0_allowed():
    gateway = make_gateway(["C"], max_tokens=3)
    run = run_episode("train:0", **BANDIT, policy=gateway)
    assert run.gateway is gateway and run.reward == 1.0


def test_a_stop_token_given_as_its_text_as_0_2_0_took_it():
    from platoon.testing import ScriptedPolicy

    policy = ScriptedPolicy(["C"], stop_token="<|im_end|>")
    assert policy.stop_token == 258  # the toy tokenizer's <|im_end|>
    assert run_episode("train:0", **BANDIT, policy=policy).reward == 1.0
    with pytest.raises(ValueError, match="stop_token 'end' is 3 tokens of the tokenizer, not one"):
        ScriptedPolicy(["C"], stop_token="end")
