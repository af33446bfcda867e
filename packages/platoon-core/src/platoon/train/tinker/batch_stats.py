"""A training step's statistics of the groups it consumed: `train/batch/...` value families and
counts, per label, the workload totals, and the groups' own deferred metrics — recorded into the step that
*consumes* each group, not the step during which it finished.
"""

from __future__ import annotations

import statistics
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from platoon.rollouts.one_rollout import MemberOutcome
    from platoon.train.tinker.workflows import GroupOutput
    from platoon.trajectory import Trajectory, TrajectoryCollection

__all__ = [
    "INFRA_DISPOSITIONS",
    "OUTCOME_STATUSES",
    "BatchStats",
    "infra_counts",
    "infra_kind",
    "infra_reason",
    "label_prefix",
]

#: outcome statuses always logged (zeros too): `none` = a member that raised, died, was cancelled or had no outcome
OUTCOME_STATUSES = ("scored", "invalid", "error", "timeout", "cancelled", "none")
#: dispositions of a member without a result that the infrastructure caused (a straggler cut-off, a cancellation or
#: an agent that made no call are not: they say nothing about the infrastructure)
INFRA_DISPOSITIONS = ("error", "hard_timeout", "worker_crashed", "rollout_worker_oom", "worker_launch_failed")
#: labels that get metrics of their own (most frequent first, ties by label); limits and policies apply to all
MAX_LABELS = 64


def label_prefix(column: str, label: str, *, default_column: str) -> str:
    """`<column>/<label>`, the default column shown as `environment`, a `/` inside either written `--`."""
    shown = "environment" if column == default_column else column
    return f"{shown.replace('/', '--')}/{label.replace('/', '--')}"


def family(metrics: dict[str, float], prefix: str, values: Sequence[float]) -> None:
    """`<prefix>/count`, and `/avg`, `/min`, `/max` when there are values (never a 0 standing in for none)."""
    metrics[f"{prefix}/count"] = float(len(values))
    if values:
        metrics[f"{prefix}/avg"] = statistics.fmean(values)
        metrics[f"{prefix}/min"] = min(values)
        metrics[f"{prefix}/max"] = max(values)


def infra_kind(member: MemberOutcome) -> str | None:
    """The kind of infrastructure failure `member` ended in (its root outcome's `failure_kind`, or the disposition of
    a member the infrastructure left without a result), None when it did not end in one."""
    if not member.observed or member.collection is None:
        return member.disposition if member.disposition in INFRA_DISPOSITIONS else None
    root = member.collection.root
    outcome = root.misc.get("outcome") if root is not None else None
    if not isinstance(outcome, Mapping) or outcome.get("status") == "scored":
        return None
    kind = outcome.get("failure_kind")
    return str(kind) if kind else None


def infra_counts(groups: Iterable[GroupOutput]) -> tuple[Counter[str], int]:
    """(infrastructure failures by kind, rollouts) over the members of `groups`."""
    kinds = Counter[str]()
    rollouts = 0
    for group in groups:
        for member in group.members:
            rollouts += 1
            kind = infra_kind(member)
            if kind is not None:
                kinds[kind] += 1
    return kinds, rollouts


def infra_reason(groups: Iterable[GroupOutput]) -> str | None:
    """What the last member of `groups` that failed in the infrastructure says of its failure (its root outcome's
    reason, else its disposition), None when none failed there."""
    said: str | None = None
    for group in groups:
        for member in group.members:
            kind = infra_kind(member)
            if kind is None:
                continue
            root = member.collection.root if member.collection is not None else None
            outcome = root.misc.get("outcome") if root is not None else None
            reason = outcome.get("reason") if isinstance(outcome, Mapping) else None
            said = str(reason) if reason else str(member.disposition or kind)
    return said


def _usage(trajectory: Trajectory) -> tuple[int, int, int]:
    """(model calls, input tokens, output tokens) of one trajectory's steps."""
    calls = inputs = outputs = 0
    for step in trajectory.steps:
        action = step.misc.get("action_misc") or {}
        usage = action.get("usage") or {}
        calls += 1
        inputs += int(usage.get("prompt_tokens") or 0)
        outputs += int(usage.get("completion_tokens") or 0)
    return calls, inputs, outputs


def _tool_calls(trajectory: Trajectory) -> tuple[int, int, int]:
    """(parsed, recovered, unparsed) tool calls over a trajectory's generations."""
    parsed = recovered = unparsed = 0
    for generation in (trajectory.misc.get("model_generations") or {}).values():
        if isinstance(generation, Mapping):
            parsed += int(generation.get("parsed_tool_calls") or 0)
            recovered += int(generation.get("recovered_tool_calls") or 0)
            unparsed += int(generation.get("unparsed_tool_calls") or 0)
    return parsed, recovered, unparsed


def _workload(collection: TrajectoryCollection) -> dict[str, float]:
    totals = Counter[str]()
    for trajectory in collection.trajectories.values():
        calls, inputs, outputs = _usage(trajectory)
        totals["environment_steps"] += len(trajectory.steps)
        totals["model_calls"] += calls
        totals["input_tokens"] += inputs
        totals["output_tokens"] += outputs
        totals["total_tokens"] += inputs + outputs
        totals["trajectories"] += 1
    return {key: float(value) for key, value in totals.items()}


class BatchStats:
    """Builds each step's `train/...` statistics; remembers every reward key it has seen (logged every later
    step, zero-filled) and which labels get metrics."""

    def __init__(self, *, label_column: str, default_column: str) -> None:
        self.label_column = label_column
        self.default_column = default_column
        self.reward_keys: set[str] = set()
        #: infrastructure failure kinds seen so far (logged every later step, zero-filled)
        self.infra_kinds: set[str] = set()

    def _infra_metrics(self, metrics: dict[str, float], prefix: str, groups: Sequence[GroupOutput]) -> None:
        """`<prefix>/infra_failed` (a count), `<prefix>/infra_failed_rate` (of the groups' rollouts; 0 without any)
        and `<prefix>/infra_failed/<kind>` for every kind seen so far in the run."""
        kinds, rollouts = infra_counts(groups)
        self.infra_kinds.update(kinds)
        failed = sum(kinds.values())
        metrics[f"{prefix}/infra_failed"] = float(failed)
        metrics[f"{prefix}/infra_failed_rate"] = failed / rollouts if rollouts else 0.0
        for kind in sorted(self.infra_kinds):
            metrics[f"{prefix}/infra_failed/{kind.replace('/', '--')}"] = float(kinds[kind])

    def _member_values(self, members: Iterable[MemberOutcome], out: dict[str, list[float]]) -> None:
        for member in members:
            if member.observed and member.collection is not None and member.collection.root is not None:
                root = member.collection.root
                calls, inputs, outputs = _usage(root)
                parsed, recovered, unparsed = _tool_calls(root)
                out["num_steps"].append(float(len(root.steps)))
                out["num_input_tokens"].append(float(inputs))
                out["num_output_tokens"].append(float(outputs))
                out["num_tool_calls"].append(float(parsed))
                out["num_recovered_tool_calls"].append(float(recovered))
                out["num_unparsed_tool_calls"].append(float(unparsed))
                if calls:
                    out["avg_input_tokens_per_step"].append(inputs / calls)
                    out["avg_output_tokens_per_step"].append(outputs / calls)
                out["rollout_time"].append(member.seconds)

    def metrics(self, groups: Sequence[GroupOutput]) -> dict[str, float]:
        """The `train/...` statistics of the groups a step consumed (the trainer adds the bookkeeping keys)."""
        metrics: dict[str, float] = {"train/batch/groups": float(len(groups))}
        values: dict[str, list[float]] = {
            name: []
            for name in (
                "task_reward",
                "task_reward_valid",
                "task_reward_at_k_mean",
                "task_reward_at_k_max",
                "task_reward_at_k_min",
                "num_steps",
                "num_input_tokens",
                "num_output_tokens",
                "num_tool_calls",
                "num_recovered_tool_calls",
                "num_unparsed_tool_calls",
                "avg_input_tokens_per_step",
                "avg_output_tokens_per_step",
                "rollout_time",
            )
        }
        statuses = Counter[str]()
        keys = Counter[str]()
        labels: dict[str, list[GroupOutput]] = {}
        workload = Counter[str]()
        summed: defaultdict[str, float] = defaultdict(float)
        averaged: dict[str, list[float]] = {}
        telemetry: dict[str, list[float]] = {}
        for group in groups:
            if group.row.label is not None:
                labels.setdefault(group.row.label, []).append(group)
            scored: list[float] = []
            for credit in group.result.members:
                if credit.has_result:
                    values["task_reward_valid"].append(1.0 if credit.task_reward_valid else 0.0)
                    if credit.task_reward_valid and credit.task_reward is not None:
                        scored.append(credit.task_reward)
                        root = credit.collection.root if credit.collection is not None else None
                        for name, value in (credit.components.get(root.id, {}) if root else {}).items():
                            values.setdefault(f"root_{name}", []).append(value)
                for tid, components in credit.components.items():
                    if tid in credit.eligible:
                        for name, value in components.items():
                            values.setdefault(f"reward/{name}", []).append(value)
            values["task_reward"] += scored
            if scored:  # the group's k rollouts of one task: the best, the worst and the mean of them
                values["task_reward_at_k_mean"].append(statistics.fmean(scored))
                values["task_reward_at_k_max"].append(max(scored))
                values["task_reward_at_k_min"].append(min(scored))
            self._member_values(group.members, values)
            for member in group.members:
                statuses[member.status if member.observed else "none"] += 1
                if member.observed and member.reward_key:
                    keys[member.reward_key] += 1
                if member.collection is not None and member.observed:
                    workload.update(_workload(member.collection))
                for key, value in member.telemetry.items():
                    telemetry.setdefault(key, []).append(value)
            for key, value in group.metrics.items():
                # credit/... are per-group means and spreads: averaged; everything else counts: summed
                if key.startswith("credit/"):
                    averaged.setdefault(key, []).append(value)
                else:
                    summed[key] += value
            for key, value in group.counts.items():
                summed[key] += value
        for name, found in values.items():
            family(metrics, f"train/batch/{name}", found)
        for status in OUTCOME_STATUSES:
            metrics[f"train/batch/outcome/{status}"] = float(statuses[status])
        self.reward_keys.update(keys)
        for key in sorted(self.reward_keys):
            metrics[f"train/batch/reward_key/{key.replace('/', '--')}"] = float(keys[key])
        self._infra_metrics(metrics, "train/batch", groups)
        metrics["train/batch/reward_key_mismatch"] = float(summed.pop("reward_key_mismatch", 0.0))
        metrics["train/group_size_rejected"] = float(summed.pop("group_size_rejected", 0.0))
        for key, value in summed.items():
            metrics[f"train/{key}"] = float(value)
        for key, found in averaged.items():
            metrics[f"train/{key}"] = statistics.fmean(found)
        for key, found in telemetry.items():
            metrics[f"train/{key}"] = statistics.fmean(found)
        for name in (
            "environment_steps",
            "model_calls",
            "input_tokens",
            "output_tokens",
            "total_tokens",
            "trajectories",
        ):
            metrics[f"train/workload/batch/total_{name}"] = float(workload[name])
        for name in ("postmerge", "policy_eligible", "post_sampling"):
            metrics[f"train/workload/batch/total_{name}_datums"] = float(
                summed.get(f"datums/{name}_datums", 0.0)
            )
        metrics["train/workload/batch/total_tasks"] = float(len(groups))
        for name in ("requested", "observed", "trainable"):
            metrics[
                f"train/workload/batch/total_{'workflow_' if name == 'trainable' else ''}{name}_rollouts"
            ] = float(summed.get(f"rollout_completion/{name}_rollouts", 0.0))
        metrics["train/workload/batch/total_task_retained_datums"] = float(
            summed.get("rollout_completion/retained_datums", 0.0)
        )
        ranked = sorted(labels.items(), key=lambda item: (-len(item[1]), item[0]))[:MAX_LABELS]
        for label, mine in ranked:
            self._label_metrics(metrics, label, mine)
        return metrics

    def _label_metrics(self, metrics: dict[str, float], label: str, groups: Sequence[GroupOutput]) -> None:
        prefix = "train/batch/" + label_prefix(self.label_column, label, default_column=self.default_column)
        metrics[f"{prefix}/groups"] = float(len(groups))
        rewards = [
            credit.task_reward
            for group in groups
            for credit in group.result.members
            if credit.task_reward_valid and credit.task_reward is not None
        ]
        family(metrics, f"{prefix}/task_reward", rewards)
        statuses = Counter(
            member.status if member.observed else "none" for g in groups for member in g.members
        )
        for status in OUTCOME_STATUSES:
            metrics[f"{prefix}/outcome/{status}"] = float(statuses[status])
        self._infra_metrics(metrics, prefix, groups)
