"""The `group_rollout` workflow: one task's group of rollouts — straggler policy, members launched
together, the group decision, credit and datums (docs/training.md, "One step") — and the workflow registry.

Subclass `GroupRolloutWorkflow` and `platoon.registry.register_workflow(name, Subclass)` to change the baseline
(`credit`) or the assignment of rewards to datums (`datums`); advantages are always computed in the trainer process.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from platoon import registry
from platoon.errors import ConfigError
from platoon.rollouts.one_rollout import MemberOutcome
from platoon.train.tinker.advantages import group_advantages
from platoon.train.tinker.datums import group_datums

if TYPE_CHECKING:
    import tinker

    from platoon.config.training import WorkflowConfig
    from platoon.train.tinker.admission import Row
    from platoon.train.tinker.advantages import GroupResult
    from platoon.train.tinker.datums import DatumBatch

__all__ = [
    "DEFAULT_WORKFLOW",
    "GroupOutput",
    "GroupRolloutWorkflow",
    "StragglerCutoff",
    "get_workflow",
    "member_failure",
]

log = logging.getLogger("platoon.train")

DEFAULT_WORKFLOW = "group_rollout"

#: launch(member index) -> that member's outcome
Launch = Callable[[int], Awaitable[MemberOutcome]]


@dataclass(frozen=True)
class StragglerCutoff:
    """When a group stops waiting: once `quorum` members settled, the rest get `timeout_seconds` more."""

    timeout_seconds: float
    quorum: int


@dataclass
class GroupOutput:
    """A finished group: its members, credit and datums, and the statistics the consuming step records."""

    row: Row
    members: list[MemberOutcome]
    result: GroupResult
    datums: list[tinker.Datum]
    #: conversion and credit metrics (datum funnel, credit/..., error_filter/..., subagent_sampling/...)
    metrics: dict[str, float] = field(default_factory=dict)
    #: counts the step sums: straggler_cancelled, failed members, ...
    counts: dict[str, float] = field(default_factory=dict)
    seconds: float = 0.0

    @property
    def failure(self) -> str | None:
        """Why the group trained nothing, when no member gave a trainable result and every member failed for one
        cause (that cause, in one line); None when the group trained or its members failed for different causes."""
        if self.datums or self.result.trainable:
            return None
        causes = {member_failure(member) for member in self.members}
        return causes.pop() if len(causes) == 1 else None

    @property
    def oldest_version(self) -> int | None:
        """The oldest policy version any of its datum-producing members sampled (staleness)."""
        versions = [m.version for m in self.members if m.observed]
        return min(versions) if versions else None


def member_failure(member: MemberOutcome) -> str:
    """One line saying why a member gave nothing to train: its error or disposition, else its root's outcome."""
    if not member.observed or member.collection is None:
        return member.error or member.disposition
    root = member.collection.root
    outcome = root.misc.get("outcome") if root is not None else None
    if not isinstance(outcome, Mapping):
        return (root.error_message if root is not None else None) or f"outcome {member.status}"
    text = f"outcome {outcome.get('status')}"
    kind = outcome.get("failure_kind")
    if kind and kind != outcome.get("status"):
        text += f" ({kind})"
    reason = outcome.get("reason")
    return f"{text}: {reason}" if reason else text


class GroupRolloutWorkflow:
    """`group_size` rollouts of one task, centered on the group's scored roots."""

    name = DEFAULT_WORKFLOW

    def __init__(self, config: WorkflowConfig, *, reward_processor: str | None = None) -> None:
        self.config = config
        self.reward_processor = reward_processor

    # -- stragglers --------------------------------------------------------------------------------

    def straggler_cutoff(self, label: str | None) -> StragglerCutoff | None:
        """The label's own policy from `straggler_policies` (a null timeout disables it for that label), else the
        global `straggler_timeout_seconds` / `straggler_quorum`; None = wait for every member."""
        size = self.config.group_size
        default_quorum = max(size - 1, 1)
        policy = self.config.straggler_policies.get(label) if label is not None else None
        if policy is not None:
            if policy.timeout_seconds is None:
                return None
            return StragglerCutoff(policy.timeout_seconds, policy.quorum or default_quorum)
        if self.config.straggler_timeout_seconds is None:
            return None
        return StragglerCutoff(
            self.config.straggler_timeout_seconds, self.config.straggler_quorum or default_quorum
        )

    # -- members --------------------------------------------------------------------------------

    async def run_members(
        self, launch: Launch, *, label: str | None
    ) -> tuple[list[MemberOutcome], float | None]:
        """Launch every member at once; returns their outcomes in order and, when a cutoff applies, how many
        stragglers were cancelled (`straggler_killed` members)."""
        size = self.config.group_size
        tasks = [asyncio.ensure_future(launch(index)) for index in range(size)]
        cutoff = self.straggler_cutoff(label)
        try:
            if cutoff is None:
                await asyncio.wait(tasks)
            else:
                pending = set(tasks)
                while size - len(pending) < cutoff.quorum:
                    _, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                if pending:
                    _, pending = await asyncio.wait(pending, timeout=cutoff.timeout_seconds)
                for task in pending:
                    task.cancel()  # a member that finished meanwhile keeps its result: cancel() is then a no-op
                await asyncio.gather(*pending, return_exceptions=True)
        except asyncio.CancelledError:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            raise
        outcomes: list[MemberOutcome] = []
        cancelled = 0
        for task in tasks:
            if task.cancelled():
                cancelled += 1
                outcomes.append(MemberOutcome.missing("straggler_killed", version=-1))
            elif (exc := task.exception()) is not None:
                log.warning("a group member raised: %s: %s", type(exc).__name__, exc)
                outcomes.append(
                    MemberOutcome.missing("error", version=-1, error=f"{type(exc).__name__}: {exc}")
                )
            else:
                outcomes.append(task.result())
        return outcomes, (float(cancelled) if cutoff is not None else None)

    # -- decision, credit, datums ---------------------------------------------------------------

    def credit(self, members: Sequence[MemberOutcome]) -> GroupResult:
        """Baselines and advantages over the members' scored roots; override to change them."""
        workflow = self.config
        return group_advantages(
            [m.collection if m.observed else None for m in members],
            leave_one_out=workflow.leave_one_out_baseline,
            depth_level_weighting=workflow.depth_level_weighting,
            depth_level_discount_gamma=workflow.depth_level_discount_gamma,
            reward_processor=self.reward_processor,
            min_successful_group_size=workflow.min_successful_group_size,
        )

    def datums(self, result: GroupResult, members: Sequence[MemberOutcome]) -> DatumBatch:
        """Datums from the exact sampled tokens of every member, advantages assigned per trajectory."""
        workflow = self.config
        return group_datums(
            result,
            [m.interactions if m.observed else None for m in members],
            checkpoint_version=[max(m.version, 0) for m in members],
            filter_errors=workflow.filter_errors,
            filter_message_actions=workflow.filter_message_actions,
            subagent_datum_keep_probability=workflow.subagent_datum_keep_probability,
            subagent_datum_sampling_seed=workflow.subagent_datum_sampling_seed,
        )

    async def run_group(self, row: Row, launch: Launch) -> GroupOutput:
        """The whole group of `row`: members, then the decision, credit and datums."""
        started = time.monotonic()
        members, cancelled = await self.run_members(launch, label=row.label)
        result = self.credit(members)
        batch = self.datums(result, members)
        if result.rejection is not None:
            log.info("the group of %s trains nothing: %s", row.task_id, result.rejection)
        counts: dict[str, float] = {
            "rollout_completion/requested_rollouts": float(len(members)),
            "rollout_completion/observed_rollouts": float(sum(1 for m in members if m.observed)),
            "rollout_completion/trainable_rollouts": float(result.trainable),
            "rollout_completion/retained_datums": float(len(batch.datums)),
        }
        if cancelled is not None:
            counts["straggler_cancelled"] = cancelled
        return GroupOutput(
            row, members, result, batch.datums, batch.metrics, counts, time.monotonic() - started
        )


def get_workflow(name: str) -> type[GroupRolloutWorkflow]:
    """The workflow class an entry's `workflow` names: `group_rollout`, or one registered under that name."""
    if name == DEFAULT_WORKFLOW:
        return GroupRolloutWorkflow

    found: Any = registry.lookup("workflow", name)
    if found is None and (":" in name or "." in name):
        found = registry.resolve_import_string(name)
    if not (isinstance(found, type) and issubclass(found, GroupRolloutWorkflow)):
        raise ConfigError(
            f"environments: workflow {name!r} is not a GroupRolloutWorkflow subclass: subclass "
            "platoon.train.tinker.workflows.GroupRolloutWorkflow and register it with register_workflow()"
        )
    return found
