"""Credit assignment for one group: processed rewards, the group decision,
baselines from scored roots applied to every trajectory of a member, and the per-microbatch depth weighting.

Untrainable outcomes are excluded by their markers, never trained as a reward of 0.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from platoon import plugins
from platoon.episode.rollout import score_trajectory
from platoon.train.tinker.provenance import with_loss_inputs

if TYPE_CHECKING:
    import tinker

    from platoon.trajectory import Trajectory, TrajectoryCollection

__all__ = [
    "UNTRAINABLE_MARKERS",
    "GroupResult",
    "MemberCredit",
    "apply_depth_weighting",
    "group_advantages",
    "is_interrupted",
    "is_skipped",
    "trajectory_depths",
]

UNTRAINABLE_MARKERS = ("trajectory_invalid", "trajectory_timed_out", "trajectory_cancelled")
#: error-message texts that mark older trajectories (written before the markers existed) as interrupted
_LEGACY_INTERRUPTED = ("CancelledError", "Episode cancelled", "Episode timed out", "\nTimeoutError:")


def is_interrupted(trajectory: Trajectory) -> bool:
    """Whether the trajectory carries an untrainable marker (or, for older traces, an interrupted error text)."""
    if any(trajectory.misc.get(marker) for marker in UNTRAINABLE_MARKERS):
        return True
    message = trajectory.error_message or ""
    return any(text in message for text in _LEGACY_INTERRUPTED)


def is_skipped(trajectory: Trajectory) -> bool:
    """Whether conversion skips the trajectory entirely (no stats): marked `exclude_from_training`, or a
    subagent-reward verifier (task misc `subagent_reward_verifier`, or an agent of role `verifier`)."""
    if trajectory.misc.get("exclude_from_training"):
        return True
    task_misc = getattr(trajectory.task, "misc", None) or {}
    if task_misc.get("subagent_reward_verifier"):
        return True
    agent = trajectory.misc.get("agent")
    return isinstance(agent, Mapping) and agent.get("role") == "verifier"


def trajectory_depths(collection: TrajectoryCollection) -> dict[str, int]:
    """Depth of every trajectory from its parent links: the root and orphans are at depth 0."""
    trajectories = collection.trajectories
    depths: dict[str, int] = {}

    def depth(tid: str, seen: frozenset[str]) -> int:
        if tid in depths:
            return depths[tid]
        parent = trajectories[tid].parent_info
        # An unknown parent (an orphan) or a cycle ends the walk: such a trajectory counts as a root.
        if parent is None or parent.id not in trajectories or parent.id in seen:
            value = 0
        else:
            value = depth(parent.id, seen | {tid}) + 1
        depths[tid] = value
        return value

    for tid in trajectories:
        depth(tid, frozenset())
    return depths


@dataclass
class MemberCredit:
    """One group member's credit: processed rewards, depths, eligibility, its baseline and advantages.

    `advantages` holds `reward - baseline` for the member's policy-eligible trajectories only; a trajectory that was
    converted but is absent there is policy-excluded (its datums are dropped, its stats kept).
    """

    collection: TrajectoryCollection | None
    rewards: dict[str, float] = field(default_factory=dict)
    components: dict[str, dict[str, float]] = field(default_factory=dict)
    depths: dict[str, int] = field(default_factory=dict)
    eligible: frozenset[str] = frozenset()
    task_reward: float | None = None
    task_reward_valid: bool = False
    reward_key: str | None = None
    baseline: float | None = None
    advantages: dict[str, float] = field(default_factory=dict)

    @property
    def has_result(self) -> bool:
        return self.collection is not None and self.collection.root is not None

    @property
    def root_advantage(self) -> float | None:
        if self.baseline is None or self.task_reward is None:
            return None
        return self.task_reward - self.baseline


@dataclass
class GroupResult:
    """A group's credit: one `MemberCredit` per member (in order), the rejection reason if the group trains
    nothing, whether datums carry depth tags, and `credit/...` plus decision-count metrics."""

    members: list[MemberCredit]
    rejection: str | None = None
    depth_tags: bool = False
    metrics: dict[str, float] = field(default_factory=dict)

    @property
    def advantages(self) -> list[dict[str, float]]:
        """Per member: trajectory id -> advantage (empty for a rejected group or a member without a result)."""
        return [dict(member.advantages) for member in self.members]

    @property
    def trainable(self) -> int:
        """Members whose root was scored (not interrupted): what `min_successful_group_size` counts."""
        return sum(1 for member in self.members if member.task_reward_valid)


def _reward_key(collection: TrajectoryCollection) -> str | None:
    root = collection.root
    outcome = root.misc.get("outcome") if root is not None else None
    key = outcome.get("reward_key") if isinstance(outcome, Mapping) else None
    return None if key is None else str(key)


def _member_credit(
    collection: TrajectoryCollection | None,
    reward_processor: str | None,
    processors: dict[str, Callable[[dict[str, Any]], Any]],
) -> MemberCredit:
    if collection is None or collection.root is None:
        return MemberCredit(collection=collection)
    root = collection.root
    ref = reward_processor or root.misc.get("reward_processor")
    processor = None
    if ref:
        if ref not in processors:
            processors[ref] = plugins.get_reward_processor(str(ref))
        processor = processors[ref]
    depths = trajectory_depths(collection)
    credit = MemberCredit(collection=collection, reward_key=_reward_key(collection))
    eligible: set[str] = set()
    for tid, trajectory in collection.trajectories.items():
        if is_skipped(trajectory):
            continue
        interrupted = is_interrupted(trajectory)
        if processor is not None and not interrupted:
            score, components = score_trajectory(processor, trajectory.to_dict(), name=repr(ref))
            credit.rewards[tid] = score
            credit.components[tid] = components
        else:
            # Failures are not zeros to re-score: an interrupted trajectory keeps its recorded reward for stats.
            credit.rewards[tid] = float(trajectory.reward)
            credit.components[tid] = {}
        credit.depths[tid] = depths[tid]
        is_root = trajectory is root
        # The child-only marker never exempts a root.
        if interrupted or (not is_root and trajectory.misc.get("exclude_from_policy_training")):
            continue
        eligible.add(tid)
    credit.eligible = frozenset(eligible)
    if root.id in credit.rewards:
        credit.task_reward = credit.rewards[root.id]
        credit.task_reward_valid = not is_interrupted(root)
    return credit


def group_advantages(
    collections: Sequence[TrajectoryCollection | None],
    *,
    leave_one_out: bool = False,
    depth_level_weighting: bool = False,
    depth_level_discount_gamma: float | None = None,
    reward_processor: str | None = None,
    min_successful_group_size: int = 1,
) -> GroupResult:
    """Center a group's rewards on baselines from its scored roots.

    `collections` are the members in order, None for a member without a result. `reward_processor` (else the one
    the root's misc names) turns each trajectory into `(reward, components)`. Depth weighting is not applied here:
    it is a per-microbatch transform (`apply_depth_weighting`); the flags only say whether
    datums must carry `traj_depth`/`traj_start` (`GroupResult.depth_tags`).
    """
    if depth_level_weighting and depth_level_discount_gamma is not None:
        raise ValueError(
            "depth_level_discount_gamma and depth_level_weighting are exclusive: set one of them"
        )
    processors: dict[str, Callable[[dict[str, Any]], Any]] = {}
    members = [_member_credit(collection, reward_processor, processors) for collection in collections]
    result = GroupResult(
        members=members,
        depth_tags=depth_level_weighting or depth_level_discount_gamma is not None,
        metrics={"reward_key_mismatch": 0.0, "group_size_rejected": 0.0},
    )
    keys = {member.reward_key for member in members if member.has_result and member.reward_key is not None}
    if len(keys) > 1:
        result.rejection = "reward_key_mismatch"
        result.metrics["reward_key_mismatch"] = 1.0
        return result
    if not any(member.has_result for member in members):
        result.rejection = "no_results"
        return result
    completed = [member for member in members if member.task_reward_valid]
    if min_successful_group_size > 1 and len(completed) < min_successful_group_size:
        result.rejection = "group_size_rejected"
        result.metrics["group_size_rejected"] = 1.0
        return result
    if not completed:
        result.rejection = "no_completed_root"
        return result

    rewards = [member.task_reward for member in completed]
    total = math.fsum(r for r in rewards if r is not None)
    mean = total / len(completed)
    for member in members:
        if not member.has_result:
            continue
        if leave_one_out and member.task_reward_valid and member.task_reward is not None:
            # A lone completed member is its own baseline (advantage 0); interrupted ones get the plain mean.
            if len(completed) == 1:
                member.baseline = member.task_reward
            else:
                member.baseline = (total - member.task_reward) / (len(completed) - 1)
        else:
            member.baseline = mean
        baseline = member.baseline
        # Every trajectory of the tree is centered on its rollout's root-group baseline.
        member.advantages = {tid: member.rewards[tid] - baseline for tid in sorted(member.eligible)}

    baselines = [member.baseline for member in completed if member.baseline is not None]
    root_advantages = [abs(a) for member in completed if (a := member.root_advantage) is not None]
    result.metrics["credit/baseline/avg"] = math.fsum(baselines) / len(baselines)
    result.metrics["credit/baseline/spread"] = max(baselines) - min(baselines)
    result.metrics["credit/root_advantage/abs_avg"] = math.fsum(root_advantages) / len(root_advantages)
    return result


def _values(datum: tinker.Datum, key: str) -> list[float]:
    tensor = datum.loss_fn_inputs.get(key)
    return [] if tensor is None else [float(x) for x in tensor.data]


def apply_depth_weighting(
    datums: Sequence[tinker.Datum],
    *,
    depth_level_weighting: bool = False,
    depth_level_discount_gamma: float | None = None,
) -> tuple[list[tinker.Datum], dict[str, float]]:
    """Weight one microbatch's advantages by agent depth; returns new datums and metrics.

    Inverse frequency: `w_d = 1/T_d` (T_d = trajectories started at d, the sum of `traj_start`), scaled so the
    action-token mass is preserved. Gamma: `gamma**depth` per datum, renormalised to an action-token-weighted mean
    of 1. A datum without `traj_depth` is at depth 0. With neither option the datums come back unchanged.
    """
    from tinker import TensorData

    if depth_level_weighting and depth_level_discount_gamma is not None:
        raise ValueError(
            "depth_level_discount_gamma and depth_level_weighting are exclusive: set one of them"
        )
    if not depth_level_weighting and depth_level_discount_gamma is None:
        return list(datums), {}
    depths = [int(_values(d, "traj_depth")[0]) if "traj_depth" in d.loss_fn_inputs else 0 for d in datums]
    actions = [math.fsum(_values(d, "mask")) for d in datums]
    total_actions = math.fsum(actions)
    levels = sorted(set(depths))
    started = {level: 0.0 for level in levels}
    level_actions = {level: 0.0 for level in levels}
    for datum, level, count in zip(datums, depths, actions, strict=True):
        started[level] += math.fsum(_values(datum, "traj_start"))
        level_actions[level] += count

    weights: list[float]
    if depth_level_weighting:
        raw = {level: (1.0 / started[level] if started[level] > 0 else 0.0) for level in levels}
        mass = math.fsum(level_actions[level] * raw[level] for level in levels)
        scale = total_actions / mass if mass > 0 else 0.0
        weights = [raw[level] * scale for level in depths]
    else:
        gamma = float(depth_level_discount_gamma)  # type: ignore[arg-type]
        raw_datum = [gamma**level for level in depths]
        mass = math.fsum(count * w for count, w in zip(actions, raw_datum, strict=True))
        scale = total_actions / mass if mass > 0 else 1.0
        weights = [w * scale for w in raw_datum]

    out: list[tinker.Datum] = []
    before = {level: 0.0 for level in levels}
    after = {level: 0.0 for level in levels}
    for datum, level, weight in zip(datums, depths, weights, strict=True):
        advantages = _values(datum, "advantages")
        mask = _values(datum, "mask")
        weighted = [a * weight for a in advantages]
        before[level] += math.fsum(abs(a) for a, m in zip(advantages, mask, strict=True) if m > 0)
        after[level] += math.fsum(abs(a) for a, m in zip(weighted, mask, strict=True) if m > 0)
        inputs = dict(datum.loss_fn_inputs)
        inputs["advantages"] = TensorData(data=weighted, dtype="float32", shape=[len(weighted)])
        out.append(with_loss_inputs(datum, inputs))

    metrics: dict[str, float] = {"credit/max_depth": float(max(levels, default=0))}
    for level in levels:
        metrics[f"credit/depth{level}/datums"] = float(depths.count(level))
        metrics[f"credit/depth{level}/trajectories"] = started[level]
        if before[level] > 0:
            metrics[f"credit/depth{level}/weight"] = after[level] / before[level]
        else:  # no advantage mass at this depth: report the weight itself
            metrics[f"credit/depth{level}/weight"] = weights[depths.index(level)]
    return out, metrics
