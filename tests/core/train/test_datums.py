"""Datums from the exact sampled tokens, checked token by token against the calls that real
episodes (`run_episode`: table service, function harness, scripted policy, gateway) recorded."""

from __future__ import annotations

import hashlib
import math
from typing import Any

import pytest

from platoon.envs.service import Outcome
from platoon.harness.agent import AgentResult
from platoon.harness.function import FunctionHarness
from platoon.task import Task
from platoon.testing.episode import EpisodeRun, run_episode
from platoon.testing.policy import Completion
from platoon.train.tinker.advantages import group_advantages
from platoon.train.tinker.datums import (
    DatumStats,
    collection_datums,
    filter_zero_advantage_datums,
    group_datums,
    keep_subagent_datum,
    loss_datums,
    trajectory_datums,
    zero_objective,
)

# --------------------------------------------------------------------------------------------------------------
# Episodes


def _scored(reward: float) -> Any:
    async def program(ep: Any) -> Outcome:
        await ep.run()
        return Outcome("scored", rewards={"reward": reward})

    return program


def _three_calls(*, edit_before_third: bool = False) -> FunctionHarness:
    """A harness making three calls on a growing conversation; optionally rewriting its first turn before the
    third (the prompt then no longer extends what was sampled)."""

    async def three(ctx: Any) -> AgentResult:
        messages: list[dict[str, Any]] = [{"role": "user", "content": ctx.instruction}]
        first = await ctx.chat(messages)
        messages += [{"role": "assistant", "content": first.text}, {"role": "user", "content": "more"}]
        second = await ctx.chat(messages)
        messages += [{"role": "assistant", "content": second.text}, {"role": "user", "content": "again"}]
        if edit_before_third:
            messages[0] = {"role": "user", "content": "a summary of the task"}
        third = await ctx.chat(messages)
        return AgentResult(final_message=third.text)

    return FunctionHarness(f"three-calls-{int(edit_before_third)}", "1", "inline", False, three)


SCRIPT = [
    Completion("alpha", logprob=-0.5, routing_id="11"),
    Completion("beta", logprob=-1.5, routing_id="12"),
    Completion("gamma", logprob=-2.5, routing_id="13"),
]


def three_call_run(*, edit: bool = False, reward: float = 1.0, task_id: str = "t1") -> EpisodeRun:
    return run_episode(
        task_id,
        service="table",
        service_kwargs={"rows": [{"id": task_id, "goal": "say hi"}]},
        harness=_three_calls(edit_before_third=edit),
        policy=list(SCRIPT),
        program=_scored(reward),
    )


def tree_run(reward: float = 1.0) -> EpisodeRun:
    """root -> child -> grandchild: every agent calls, spawns (above depth 2), then calls again."""

    async def tree(ctx: Any) -> AgentResult:
        await ctx.chat([{"role": "user", "content": f"level {ctx.depth}"}])
        if ctx.depth < 2:
            await ctx.agents.spawn(f"sub of {ctx.depth}", max_steps=6 - 3 * ctx.depth)
            await ctx.chat([{"role": "user", "content": f"after {ctx.depth}"}])
        return AgentResult(final_message=f"done {ctx.depth}")

    return run_episode(
        Task(goal="root goal", id="r"),
        service="table",
        service_kwargs={"rows": [{"id": "r", "goal": "root goal"}]},
        harness=FunctionHarness("datums-tree", "1", "inline", False, tree),
        policy=lambda prompt: "ok",
        program=_scored(reward),
        max_steps=20,
    )


# --------------------------------------------------------------------------------------------------------------
# Expected datums, computed straight from the recorded calls


def _ids(trajectory: Any) -> list[str]:
    return [step.misc["action_misc"]["completion_id"] for step in trajectory.steps]


def _expected(run: EpisodeRun, call_ids: list[str], advantage: float) -> dict[str, list[Any]]:
    """One datum's expected arrays for calls that merge: the last prompt plus its sample is the whole sequence;
    every call's sampled span carries its logprobs and the advantage, everything else 0."""
    calls = [run.interactions[cid] for cid in call_ids]
    last = calls[-1]
    tokens = list(last.prompt_tokens) + list(last.sampled_tokens)
    logprobs = [0.0] * len(tokens)
    advantages = [0.0] * len(tokens)
    mask = [0.0] * len(tokens)
    for call in calls:
        start = len(call.prompt_tokens)
        assert tokens[start : start + len(call.sampled_tokens)] == list(call.sampled_tokens)
        for i, lp in enumerate(call.logprobs):
            logprobs[start + i] = lp
            advantages[start + i] = advantage
            mask[start + i] = 1.0
    return {
        "input": tokens[:-1],
        "target_tokens": tokens[1:],
        "logprobs": logprobs[1:],
        "advantages": advantages[1:],
        "mask": mask[1:],
    }


def _check(datum: Any, expected: dict[str, list[Any]]) -> None:
    assert datum.model_input.to_ints() == expected["input"]
    inputs = datum.loss_fn_inputs
    assert inputs["target_tokens"].dtype == "int64"
    assert inputs["target_tokens"].shape == [len(expected["input"])]
    assert inputs["target_tokens"].data == expected["target_tokens"]
    for key in ("logprobs", "advantages", "mask"):
        assert inputs[key].dtype == "float32"
        assert inputs[key].shape == [len(expected["input"])]
        assert inputs[key].data == pytest.approx(expected[key], abs=0), key


# --------------------------------------------------------------------------------------------------------------
# Prefix merging


def test_three_calls_that_extend_each_other_merge_into_one_datum_token_by_token():
    run = three_call_run()
    ids = _ids(run.root)
    stats = DatumStats()
    datums = trajectory_datums(run.root, run.interactions, 0.75, checkpoint_version=4, stats=stats)
    assert len(datums) == 1
    _check(datums[0], _expected(run, ids, 0.75))
    inputs = datums[0].loss_fn_inputs
    assert inputs["checkpoint_version"].data == [4]
    assert inputs["routing_handle"].data == [13] and inputs["routing_handle"].dtype == "int64"
    assert "traj_depth" not in inputs and "error_mask" not in inputs
    # the sampled logprobs, not recomputed ones; the stop token is the last sampled token
    lp = inputs["logprobs"].data
    assert sorted(set(lp)) == [-2.5, -1.5, -0.5, 0.0]
    assert sum(inputs["mask"].data) == sum(len(run.interactions[c].sampled_tokens) for c in ids)
    # tokens before merging count every call's prompt again; after merging the sequence is counted once
    calls = [run.interactions[c] for c in ids]
    assert stats.tokens_before_merge == sum(len(c.prompt_tokens) + len(c.sampled_tokens) for c in calls)
    assert stats.tokens_after_merge == len(calls[-1].prompt_tokens) + len(calls[-1].sampled_tokens)
    assert stats.calls == 3 and stats.merged_calls == 2 and stats.postmerge_datums == 1


def test_an_edited_conversation_breaks_the_prefix_into_two_datums():
    run = three_call_run(edit=True)
    ids = _ids(run.root)
    first, second = (run.interactions[c] for c in ids[1:])
    accumulated = list(first.prompt_tokens) + list(first.sampled_tokens)
    assert list(second.prompt_tokens[: len(accumulated)]) != accumulated
    stats = DatumStats()
    datums = trajectory_datums(run.root, run.interactions, -0.5, stats=stats)
    assert len(datums) == 2
    _check(datums[0], _expected(run, ids[:2], -0.5))
    _check(datums[1], _expected(run, ids[2:], -0.5))
    # each datum routes by the last call merged into it
    assert datums[0].loss_fn_inputs["routing_handle"].data == [12]
    assert datums[1].loss_fn_inputs["routing_handle"].data == [13]
    assert stats.merged_calls == 1 and stats.postmerge_datums == 2


def test_an_excluded_step_leaves_its_tokens_as_untrained_context():
    run = three_call_run()
    ids = _ids(run.root)
    run.root.steps[1].misc["exclude_from_training"] = True
    stats = DatumStats()
    (datum,) = trajectory_datums(run.root, run.interactions, 1.0, stats=stats)
    expected = _expected(run, [ids[0], ids[2]], 1.0)
    _check(datum, expected)
    middle = run.interactions[ids[1]]
    start = len(middle.prompt_tokens) - 1  # shifted by one
    assert datum.loss_fn_inputs["mask"].data[start : start + len(middle.sampled_tokens)] == [0.0] * len(
        middle.sampled_tokens
    )
    assert stats.excluded_steps == 1 and stats.calls == 2


def test_duplicate_missing_and_id_less_steps_are_skipped(caplog: pytest.LogCaptureFixture):
    run = three_call_run()
    ids = _ids(run.root)
    root = run.root
    duplicate = type(root.steps[0])(misc={"action_misc": {"completion_id": ids[0]}})
    root.steps.insert(1, duplicate)
    root.steps.append(type(root.steps[0])(misc={"message": {}}))
    interactions = dict(run.interactions)
    del interactions[ids[1]]
    stats = DatumStats()
    datums = trajectory_datums(root, interactions, 1.0, stats=stats)
    assert stats.duplicate_calls == 1 and stats.missing_calls == 1 and stats.steps_without_id == 1
    assert "has no recorded interaction" in caplog.text
    # the third prompt still extends the first call: the missing call's sample is merged in as context
    (datum,) = datums
    _check(datum, _expected(run, [ids[0], ids[2]], 1.0))


def test_the_tree_gives_each_agent_its_own_datums_with_depth_tags():
    run = tree_run()
    root, child, grandchild = run.trajectories
    assert child.parent_info.id == root.id and grandchild.parent_info.id == child.id
    advantages = {root.id: 0.5, child.id: 0.25, grandchild.id: -1.0}
    batch = collection_datums(run.collection, run.interactions, advantages, depth_tags=True)
    by_depth: dict[int, list[Any]] = {}
    for datum in batch.datums:
        by_depth.setdefault(datum.loss_fn_inputs["traj_depth"].data[0], []).append(datum)
    assert sorted(by_depth) == [0, 1, 2]
    for depth, trajectory in enumerate(run.trajectories):
        ids = _ids(trajectory)
        datums = by_depth[depth]
        # each datum's calls are exactly the agent's own; merged or not, every sampled token is there once
        expected_actions = sum(len(run.interactions[c].sampled_tokens) for c in ids)
        assert sum(sum(d.loss_fn_inputs["mask"].data) for d in datums) == expected_actions
        assert [d.loss_fn_inputs["traj_start"].data[0] for d in datums] == [1.0] + [0.0] * (len(datums) - 1)
        for datum in datums:
            adv = datum.loss_fn_inputs["advantages"].data
            mask = datum.loss_fn_inputs["mask"].data
            assert {a for a, m in zip(adv, mask, strict=True) if m} == {advantages[trajectory.id]}
            assert {a for a, m in zip(adv, mask, strict=True) if not m} == {0.0}
    # the grandchild made one call: its single datum is that call's prompt and sample, token by token
    (only,) = by_depth[2]
    _check(only, _expected(run, _ids(grandchild), -1.0))
    assert batch.stats.trajectories == 3 and batch.stats.retained_datums == len(batch.datums)


def test_without_depth_weighting_the_depth_keys_are_removed():
    run = tree_run()
    advantages = {t.id: 1.0 for t in run.trajectories}
    batch = collection_datums(run.collection, run.interactions, advantages)
    assert all("traj_depth" not in d.loss_fn_inputs for d in batch.datums)
    assert all("traj_start" not in d.loss_fn_inputs for d in batch.datums)


# --------------------------------------------------------------------------------------------------------------
# Exclusions


def test_exclusions_skip_or_drop_whole_trajectories():
    run = tree_run()
    root, child, grandchild = run.trajectories
    grandchild.misc["exclude_from_training"] = True  # skipped: no stats
    child.misc["exclude_from_policy_training"] = True  # stats kept, datums dropped
    root.misc["exclude_from_policy_training"] = True  # never exempts a root
    credit = group_advantages([run.collection]).members[0]
    assert set(credit.advantages) == {root.id}
    batch = collection_datums(run.collection, run.interactions, credit.advantages)
    stats = batch.stats
    assert stats.skipped_trajectories == 1 and stats.trajectories == 2
    assert stats.policy_excluded_trajectories == 1 and stats.policy_excluded_datums >= 1
    expected_root_actions = sum(len(run.interactions[c].sampled_tokens) for c in _ids(root))
    assert sum(sum(d.loss_fn_inputs["mask"].data) for d in batch.datums) == expected_root_actions
    assert stats.retained_datums <= stats.post_sampling_datums <= stats.policy_eligible_datums
    assert stats.policy_eligible_datums <= stats.postmerge_datums


def test_a_verifier_task_is_skipped_entirely():
    run = tree_run()
    grandchild = run.trajectories[2]
    # a fork shares its parent task's misc: give the verifier a task of its own
    grandchild.task = Task(goal="verify", misc={"subagent_reward_verifier": True})
    batch = collection_datums(run.collection, run.interactions, {t.id: 1.0 for t in run.trajectories})
    assert batch.stats.skipped_trajectories == 1 and batch.stats.trajectories == 2


def test_an_untrainable_rollout_trains_nothing_and_is_never_a_zero_reward():
    run = run_episode(
        "t1",
        service="table",
        service_kwargs={"rows": [{"id": "t1", "goal": "say hi"}]},
        harness=_three_calls(),
        policy=list(SCRIPT),
    )
    assert run.root.misc["trajectory_invalid"] and run.root.reward == 0.0
    good = three_call_run(task_id="t1")
    result = group_advantages([run.collection, good.collection])
    assert result.members[0].advantages == {} and not result.members[0].task_reward_valid
    batch = group_datums(result, [run.interactions, good.interactions])
    # only the scored member trains; its lone completed root is the mean: advantage exactly 0
    assert batch.stats.policy_excluded_trajectories == 1
    assert all(set(d.loss_fn_inputs["advantages"].data) == {0.0} for d in batch.datums)
    assert len(batch.datums) == 1


def test_a_rejected_group_gives_no_datums():
    good = three_call_run()
    result = group_advantages([good.collection, None], min_successful_group_size=2)
    assert result.rejection == "group_size_rejected"
    batch = group_datums(result, [good.interactions, None])
    assert batch.datums == [] and batch.metrics["group_size_rejected"] == 1.0


# --------------------------------------------------------------------------------------------------------------
# Error and message filtering


def test_error_tokens_are_suppressed_only_with_a_positive_advantage():
    run = three_call_run()
    ids = _ids(run.root)
    run.root.steps[1].misc["output"] = "Traceback (most recent call last):\n  boom"
    n_error = len(run.interactions[ids[1]].sampled_tokens)
    n_all = sum(len(run.interactions[c].sampled_tokens) for c in ids)

    positive = collection_datums(run.collection, run.interactions, {run.root.id: 0.5})
    (datum,) = positive.datums
    assert sum(datum.loss_fn_inputs["mask"].data) == n_all - n_error
    assert "error_mask" not in datum.loss_fn_inputs
    assert positive.metrics["error_filter/detected_action_tokens"] == n_error
    assert positive.metrics["error_filter/suppressed_positive_action_tokens"] == n_error
    start = len(run.interactions[ids[1]].prompt_tokens) - 1
    assert datum.loss_fn_inputs["advantages"].data[start : start + n_error] == [0.0] * n_error

    negative = collection_datums(run.collection, run.interactions, {run.root.id: -0.5})
    (datum,) = negative.datums
    assert sum(datum.loss_fn_inputs["mask"].data) == n_all  # failures still get negative credit
    assert negative.metrics["error_filter/retained_nonpositive_action_tokens"] == n_error

    off = collection_datums(run.collection, run.interactions, {run.root.id: 0.5}, filter_errors=False)
    assert sum(off.datums[0].loss_fn_inputs["mask"].data) == n_all


def test_a_datum_emptied_by_the_error_filter_is_dropped():
    run = three_call_run(edit=True)
    ids = _ids(run.root)
    # an is_error tool result issued by the third call (the tool call came after three model calls)
    run.root.misc["tool_calls"] = [{"name": "x", "arguments": {}, "is_error": True, "step": 3}]
    batch = collection_datums(run.collection, run.interactions, {run.root.id: 1.0})
    assert len(batch.datums) == 1
    _check(batch.datums[0], _expected(run, ids[:2], 1.0))
    assert batch.metrics["error_filter/emptied_datums"] == 1


def test_message_actions_are_context_without_loss(monkeypatch: pytest.MonkeyPatch):
    from platoon import registry

    run = three_call_run()
    ids = _ids(run.root)
    monkeypatch.setitem(registry._seams, "trajectory.message_completion_ids", [lambda steps: {ids[0]}])
    batch = collection_datums(
        run.collection, run.interactions, {run.root.id: -1.0}, filter_message_actions=True
    )
    (datum,) = batch.datums
    expected = _expected(run, ids, -1.0)
    n = len(run.interactions[ids[0]].sampled_tokens)
    start = len(run.interactions[ids[0]].prompt_tokens) - 1
    for key in ("advantages", "mask"):
        expected[key][start : start + n] = [0.0] * n
    _check(datum, expected)
    assert batch.stats.message_masked_tokens == n
    unfiltered = collection_datums(run.collection, run.interactions, {run.root.id: -1.0})
    assert sum(unfiltered.datums[0].loss_fn_inputs["mask"].data) == sum(expected["mask"]) + n


# --------------------------------------------------------------------------------------------------------------
# Subagent datum sampling


def test_the_sampling_draw_is_the_documented_hash():
    key = b"7\x00task\x00traj\x001\x002"
    draw = int.from_bytes(hashlib.sha256(key).digest()[:8], "big")
    for p in (0.1, 0.5, 0.9):
        expected = draw < math.floor(p * 2**64)
        got = keep_subagent_datum(p, seed=7, task_id="task", trajectory_id="traj", depth=1, datum_index=2)
        assert got is expected
    assert keep_subagent_datum(1.0, seed=0, task_id="", trajectory_id="", depth=1, datum_index=0)
    assert not keep_subagent_datum(0.0, seed=0, task_id="", trajectory_id="", depth=1, datum_index=0)


def test_subagent_sampling_keeps_roots_and_counts_per_depth():
    run = tree_run()
    advantages = {t.id: 1.0 for t in run.trajectories}
    full = collection_datums(run.collection, run.interactions, advantages, depth_tags=True)
    none = collection_datums(
        run.collection, run.interactions, advantages, depth_tags=True, subagent_datum_keep_probability=0.0
    )
    root_datums = len(trajectory_datums(run.root, run.interactions, 1.0))
    assert len(none.datums) == root_datums < len(full.datums)
    assert none.metrics["subagent_sampling/retained_datums"] == 0.0
    assert none.metrics["subagent_sampling/eligible_datums"] == len(full.datums) - root_datums
    assert none.metrics["subagent_sampling/depth_2/eligible_datums"] == 1.0
    assert none.stats.post_sampling_datums == root_datums < none.stats.policy_eligible_datums
    # the same seed draws the same datums
    half = [
        collection_datums(
            run.collection,
            run.interactions,
            advantages,
            subagent_datum_keep_probability=0.5,
            subagent_datum_sampling_seed=3,
        ).stats.retained_datums
        for _ in range(2)
    ]
    assert half[0] == half[1]


# --------------------------------------------------------------------------------------------------------------
# Per microbatch: the zero-advantage filter and the loss inputs


def test_zero_advantage_datums_are_dropped_but_keep_their_token_mass():
    a = three_call_run(task_id="a")
    b = three_call_run(task_id="b", edit=True)
    datums = collection_datums(a.collection, a.interactions, {a.root.id: 0.0}).datums
    datums += collection_datums(b.collection, b.interactions, {b.root.id: 2.0}).datums
    masses = [sum(d.loss_fn_inputs["mask"].data) for d in datums]
    kept, metrics = filter_zero_advantage_datums(datums)
    assert len(kept) == 2 and metrics["zero_advantage_filter/filtered_datums"] == 1.0
    assert metrics["zero_advantage_filter/eligible_loss_tokens"] == sum(masses)
    assert metrics["zero_advantage_filter/retained_loss_tokens"] == masses[1] + masses[2]
    assert kept[0].loss_fn_inputs["loss_token_count"].data == [masses[0] + masses[1]]

    sent = loss_datums(kept)
    total = sum(masses)
    assert set(sent[0].loss_fn_inputs) == {"target_tokens", "logprobs", "advantages", "routing_handle"}
    for original, datum in zip(kept, sent, strict=True):
        expected = [x * (1.0 / (total + 1e-8)) for x in original.loss_fn_inputs["advantages"].data]
        assert datum.loss_fn_inputs["advantages"].data == pytest.approx(expected, rel=1e-6)
        assert datum.loss_fn_inputs["target_tokens"].data == original.loss_fn_inputs["target_tokens"].data


def test_the_zero_filter_needs_a_zero_objective_loss_and_the_flag():
    run = three_call_run()
    datums = collection_datums(run.collection, run.interactions, {run.root.id: 0.0}).datums
    assert filter_zero_advantage_datums(datums, enabled=False)[0] == datums
    assert filter_zero_advantage_datums(datums, loss_fn="cross_entropy")[0] == datums
    assert filter_zero_advantage_datums(datums, loss_fn="ppo", loss_fn_config={"beta": 1.0})[0] == datums
    assert filter_zero_advantage_datums(datums, loss_fn="importance_sampling")[0] == []
    assert zero_objective("cispo", {"clip_low_threshold": 0.0, "clip_high_threshold": 5.0})
    assert not zero_objective("custom", None)


def test_the_datum_carries_the_dtypes_and_shapes_the_sdk_sends():
    # What every SDK in the range serializes (as JSON up to 0.24, as protobuf from 0.25): one token chunk, and each
    # loss input with its dtype and shape.
    run = three_call_run()
    datum = loss_datums(collection_datums(run.collection, run.interactions, {run.root.id: 1.0}).datums)[0]
    length = datum.model_input.length
    inputs = datum.loss_fn_inputs
    assert [chunk.tokens for chunk in datum.model_input.chunks] == [datum.model_input.to_ints()]
    assert (inputs["target_tokens"].dtype, inputs["target_tokens"].shape) == ("int64", [length])
    assert inputs["logprobs"].dtype == "float32"
    routing = inputs["routing_handle"]
    assert (routing.data, routing.dtype, routing.shape) == ([13], "int64", [1])
