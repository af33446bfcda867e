"""Group credit: baselines from scored roots only, applied to whole trees,
group rejection, and depth weighting, checked against hand computations on real `run_episode` rollouts."""

from __future__ import annotations

from typing import Any

import pytest

from platoon import registry
from platoon.envs.service import Outcome
from platoon.harness.agent import AgentResult
from platoon.harness.function import FunctionHarness
from platoon.task import Task
from platoon.testing.episode import EpisodeRun, run_episode
from platoon.train.tinker.advantages import apply_depth_weighting, group_advantages, trajectory_depths
from platoon.train.tinker.datums import group_datums


async def _one_call(ctx: Any) -> AgentResult:
    reply = await ctx.chat([{"role": "user", "content": ctx.instruction}])
    return AgentResult(final_message=reply.text)


ONE_CALL = FunctionHarness("one-call", "1", "inline", False, _one_call)


def member(reward: float | None, *, key: str = "reward") -> EpisodeRun:
    """One rollout of a table task scored `reward` under `key`; None leaves the table's own grading, which cannot
    grade (an untrainable `invalid` outcome)."""
    program: Any = "single"
    if reward is not None:

        async def program(ep: Any) -> Outcome:
            await ep.run()
            return Outcome("scored", rewards={key: reward}, primary=key)

    return run_episode(
        "t",
        service="table",
        service_kwargs={"rows": [{"id": "t", "goal": "answer"}]},
        harness=ONE_CALL,
        policy=["x"],
        program=program,
    )


def tree(reward: float) -> EpisodeRun:
    """root -> child -> grandchild, the root scored `reward`."""

    async def agent(ctx: Any) -> AgentResult:
        await ctx.chat([{"role": "user", "content": f"level {ctx.depth}"}])
        if ctx.depth < 2:
            await ctx.agents.spawn(f"sub of {ctx.depth}", max_steps=6 - 3 * ctx.depth)
            await ctx.chat([{"role": "user", "content": f"after {ctx.depth}"}])
        return AgentResult(final_message=f"done {ctx.depth}")

    async def program(ep: Any) -> Outcome:
        await ep.run()
        return Outcome("scored", rewards={"reward": reward})

    return run_episode(
        Task(goal="root goal", id="r"),
        service="table",
        service_kwargs={"rows": [{"id": "r", "goal": "root goal"}]},
        harness=FunctionHarness("advantages-tree", "1", "inline", False, agent),
        policy=lambda prompt: "ok",
        program=program,
        max_steps=20,
    )


@pytest.fixture(scope="module")
def runs() -> dict[str, EpisodeRun]:
    return {
        "one": member(1.0),
        "zero": member(0.0),
        "half": member(0.5),
        "invalid": member(None),
        "seven": member(0.7),
    }


def _root_advantages(result: Any) -> list[float | None]:
    out: list[float | None] = []
    for m in result.members:
        root = None if m.collection is None else m.collection.root
        out.append(None if root is None else m.advantages.get(root.id))
    return out


# --------------------------------------------------------------------------------------------------------------
# Baselines


def test_mean_baseline_over_scored_roots(runs: dict[str, EpisodeRun]):
    group = [
        runs["one"].collection,
        runs["zero"].collection,
        runs["half"].collection,
        runs["invalid"].collection,
    ]
    assert runs["invalid"].root.misc["trajectory_invalid"]
    result = group_advantages(group, leave_one_out=False)
    assert result.rejection is None and result.trainable == 3
    # mean of the scored roots 1, 0, 0.5 = 0.5; the invalid member is neither in it nor trained
    assert [m.baseline for m in result.members] == [0.5, 0.5, 0.5, 0.5]
    assert _root_advantages(result) == [0.5, -0.5, 0.0, None]
    assert result.members[3].advantages == {} and result.members[3].task_reward_valid is False
    assert result.metrics["credit/baseline/avg"] == 0.5
    assert result.metrics["credit/baseline/spread"] == 0.0
    assert result.metrics["credit/root_advantage/abs_avg"] == pytest.approx(1 / 3)


def test_leave_one_out_baseline(runs: dict[str, EpisodeRun]):
    group = [
        runs["one"].collection,
        runs["zero"].collection,
        runs["half"].collection,
        runs["invalid"].collection,
    ]
    result = group_advantages(group, leave_one_out=True)
    # 1 -> (0 + .5)/2; 0 -> (1 + .5)/2; .5 -> (1 + 0)/2; the interrupted member gets the plain mean
    assert [m.baseline for m in result.members] == [0.25, 0.75, 0.5, 0.5]
    assert _root_advantages(result) == [0.75, -0.75, 0.0, None]
    assert result.metrics["credit/baseline/avg"] == 0.5
    assert result.metrics["credit/baseline/spread"] == 0.5
    assert result.metrics["credit/root_advantage/abs_avg"] == 0.5


def test_a_lone_scored_member_has_zero_advantage_under_leave_one_out(runs: dict[str, EpisodeRun]):
    result = group_advantages([runs["seven"].collection, runs["invalid"].collection], leave_one_out=True)
    assert [m.baseline for m in result.members] == [0.7, 0.7]
    assert _root_advantages(result) == [0.0, None]


def test_an_untrainable_member_is_never_a_zero_in_the_baseline(runs: dict[str, EpisodeRun]):
    # with the invalid member as a 0 the mean would be 0.5 and the scored member would train +0.5
    result = group_advantages([runs["one"].collection, runs["invalid"].collection, None])
    assert [m.baseline for m in result.members[:2]] == [1.0, 1.0] and result.members[2].baseline is None
    assert _root_advantages(result)[:2] == [0.0, None]


# --------------------------------------------------------------------------------------------------------------
# Group decision


def test_min_successful_group_size_counts_scored_roots_only(runs: dict[str, EpisodeRun]):
    group = [runs["one"].collection, runs["zero"].collection, runs["invalid"].collection, None]
    rejected = group_advantages(group, min_successful_group_size=3)
    assert rejected.rejection == "group_size_rejected" and rejected.metrics["group_size_rejected"] == 1.0
    assert all(m.advantages == {} for m in rejected.members)
    batch = group_datums(rejected, [runs["one"].interactions, runs["zero"].interactions, None, None])
    assert batch.datums == []
    accepted = group_advantages(group, min_successful_group_size=2)
    assert accepted.rejection is None and accepted.metrics["group_size_rejected"] == 0.0
    batch = group_datums(
        accepted, [runs["one"].interactions, runs["zero"].interactions, runs["invalid"].interactions, None]
    )
    assert len(batch.datums) == 2 and batch.stats.policy_excluded_trajectories == 1


def test_different_reward_keys_reject_the_group(runs: dict[str, EpisodeRun]):
    other = member(1.0, key="score")
    assert other.outcome["reward_key"] == "score"
    result = group_advantages([runs["one"].collection, other.collection, runs["invalid"].collection])
    assert result.rejection == "reward_key_mismatch" and result.metrics["reward_key_mismatch"] == 1.0
    # a member without a key (the invalid one) is ignored
    assert group_advantages([runs["one"].collection, runs["invalid"].collection]).rejection is None


def test_groups_without_results_or_scored_roots_train_nothing(runs: dict[str, EpisodeRun]):
    assert group_advantages([None, None]).rejection == "no_results"
    result = group_advantages([runs["invalid"].collection, None])
    assert result.rejection == "no_completed_root"
    assert result.members[0].rewards == {runs["invalid"].root.id: 0.0}  # stats kept


def test_depth_options_are_exclusive(runs: dict[str, EpisodeRun]):
    with pytest.raises(ValueError, match="exclusive"):
        group_advantages([runs["one"].collection], depth_level_weighting=True, depth_level_discount_gamma=0.5)


# --------------------------------------------------------------------------------------------------------------
# Trees: the whole tree is centered on the root-group baseline


def _by_goal(trajectory: dict[str, Any]) -> tuple[float, dict[str, float]]:
    goal = trajectory["task"]["goal"]
    reward = {"sub of 0": 0.25, "sub of 1": 0.5}.get(goal, trajectory["reward"])
    return reward, {"by_goal": reward}


def test_children_are_centered_on_their_root_group_baseline(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setitem(registry._registries["reward_processor"], "test-by-goal", _by_goal)
    first, second = tree(1.0), tree(0.0)
    assert trajectory_depths(first.collection) == {t.id: d for d, t in enumerate(first.trajectories)}
    result = group_advantages([first.collection, second.collection], reward_processor="test-by-goal")
    # baseline = mean(1, 0) = 0.5 for both members, applied to every trajectory of each tree
    for run, root_advantage in ((first, 0.5), (second, -0.5)):
        credit = result.members[0 if run is first else 1]
        root, child, grandchild = run.trajectories
        assert credit.baseline == 0.5 and credit.depths == {root.id: 0, child.id: 1, grandchild.id: 2}
        assert credit.advantages == {root.id: root_advantage, child.id: -0.25, grandchild.id: 0.0}
        assert credit.components[child.id] == {"by_goal": 0.25}
    # the datums carry exactly those advantages on every action token
    batch = group_datums(result, [first.interactions, second.interactions])
    seen = set()
    for datum in batch.datums:
        mask = datum.loss_fn_inputs["mask"].data
        values = {a for a, m in zip(datum.loss_fn_inputs["advantages"].data, mask, strict=True) if m}
        seen |= values
    assert seen == {0.5, -0.5, -0.25, 0.0}


def test_the_processor_the_root_names_is_used(monkeypatch: pytest.MonkeyPatch, runs: dict[str, EpisodeRun]):
    monkeypatch.setitem(
        registry._registries["reward_processor"], "test-double", lambda t: (2 * t["reward"], {})
    )
    one, zero = member(1.0), member(0.0)
    one.root.misc["reward_processor"] = "test-double"
    result = group_advantages([one.collection, zero.collection])
    assert result.members[0].task_reward == 2.0 and result.members[1].task_reward == 0.0
    assert _root_advantages(result) == [1.0, -1.0]


# --------------------------------------------------------------------------------------------------------------
# Depth weighting: per microbatch


def _datum(depth: int, actions: int, advantage: float, start: float) -> Any:
    """A datum of `actions` action tokens after two context tokens."""
    from tinker import Datum, ModelInput, TensorData

    n = actions + 2
    mask = [0.0, 0.0] + [1.0] * actions
    return Datum(
        model_input=ModelInput.from_ints(list(range(n))),
        loss_fn_inputs={
            "target_tokens": TensorData(data=list(range(1, n + 1)), dtype="int64", shape=[n]),
            "logprobs": TensorData(data=[0.0] * n, dtype="float32", shape=[n]),
            "advantages": TensorData(data=[advantage * m for m in mask], dtype="float32", shape=[n]),
            "mask": TensorData(data=mask, dtype="float32", shape=[n]),
            "traj_depth": TensorData(data=[depth], dtype="int64", shape=[1]),
            "traj_start": TensorData(data=[start], dtype="float32", shape=[1]),
        },
    )


#: depth 0: two trajectories (4 and 2 action tokens); depth 1: one (3); depth 2: one over two datums (1 + 2)
MICROBATCH = [
    (0, 4, 1.0, 1.0),
    (0, 2, 1.0, 1.0),
    (1, 3, -1.0, 1.0),
    (2, 1, 0.5, 1.0),
    (2, 2, 0.5, 0.0),
]


def _action_advantages(datum: Any) -> set[float]:
    mask = datum.loss_fn_inputs["mask"].data
    return {round(a, 6) for a, m in zip(datum.loss_fn_inputs["advantages"].data, mask, strict=True) if m}


def test_inverse_frequency_depth_weighting_by_hand():
    datums = [_datum(*row) for row in MICROBATCH]
    weighted, metrics = apply_depth_weighting(datums, depth_level_weighting=True)
    # T = {0: 2, 1: 1, 2: 1}, A = {0: 6, 1: 3, 2: 3}; raw w = 1/T; scale = 12 / (6/2 + 3 + 3) = 4/3
    w = {0: 2 / 3, 1: 4 / 3, 2: 4 / 3}
    for (depth, _, advantage, _), datum in zip(MICROBATCH, weighted, strict=True):
        assert _action_advantages(datum) == {round(advantage * w[depth], 6)}
        assert datum.loss_fn_inputs["advantages"].data[:2] == [0.0, 0.0]
    assert metrics["credit/max_depth"] == 2.0
    assert metrics["credit/depth0/datums"] == 2.0 and metrics["credit/depth2/datums"] == 2.0
    assert metrics["credit/depth0/trajectories"] == 2.0 and metrics["credit/depth2/trajectories"] == 1.0
    for depth, weight in w.items():
        assert metrics[f"credit/depth{depth}/weight"] == pytest.approx(weight, rel=1e-6)
    # the action-token mass is preserved: sum_d A_d * w_d = sum_d A_d
    assert 6 * w[0] + 3 * w[1] + 3 * w[2] == pytest.approx(12)


def test_gamma_discount_by_hand():
    datums = [_datum(*row) for row in MICROBATCH]
    weighted, metrics = apply_depth_weighting(datums, depth_level_discount_gamma=0.5)
    # raw gamma^d = 1, .5, .25; scale = 12 / (6 + 3 * .5 + 3 * .25) = 16/11
    w = {0: 16 / 11, 1: 8 / 11, 2: 4 / 11}
    for (depth, _, advantage, _), datum in zip(MICROBATCH, weighted, strict=True):
        assert _action_advantages(datum) == {round(advantage * w[depth], 6)}
    assert metrics["credit/depth1/weight"] == pytest.approx(8 / 11, rel=1e-6)


def test_no_depth_option_leaves_the_datums_alone():
    datums = [_datum(*row) for row in MICROBATCH]
    assert apply_depth_weighting(datums) == (datums, {})


def test_depth_weighting_on_real_trees_preserves_the_action_mass(monkeypatch: pytest.MonkeyPatch):
    first, second = tree(1.0), member(0.0)
    result = group_advantages([first.collection, second.collection], depth_level_weighting=True)
    assert result.depth_tags
    batch = group_datums(result, [first.interactions, second.interactions])
    weighted, metrics = apply_depth_weighting(batch.datums, depth_level_weighting=True)
    # two trajectories start at depth 0 (two roots), one at each deeper level
    assert metrics["credit/depth0/trajectories"] == 2.0
    assert metrics["credit/depth1/trajectories"] == metrics["credit/depth2/trajectories"] == 1.0
    actions = {d: 0.0 for d in range(3)}
    for datum in batch.datums:
        actions[datum.loss_fn_inputs["traj_depth"].data[0]] += sum(datum.loss_fn_inputs["mask"].data)
    total = sum(actions.values())
    scale = total / (actions[0] / 2 + actions[1] + actions[2])
    assert metrics["credit/depth0/weight"] == pytest.approx(scale / 2, rel=1e-6)
    assert metrics["credit/depth1/weight"] == pytest.approx(scale, rel=1e-6)
    for before, after in zip(batch.datums, weighted, strict=True):
        depth = before.loss_fn_inputs["traj_depth"].data[0]
        factor = scale / 2 if depth == 0 else scale
        expected = [a * factor for a in before.loss_fn_inputs["advantages"].data]
        assert after.loss_fn_inputs["advantages"].data == pytest.approx(expected, rel=1e-6)
