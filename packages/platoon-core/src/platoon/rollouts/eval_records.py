"""One evaluation rollout's record: where it lives, how its
result is classified (unscored rollouts are errors, never failures), what it cost and who made it (provenance),
and reading the records an output directory already holds (resume, provenance refusal, `stage: report`).

A record is `<out>/rollouts/<safe task id>/rollout_<i>/metadata.json`, beside its `trajectory_collection.json`
and the event file under `events/`.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import re
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from platoon.episode.rollout import process_rewards
from platoon.rollouts.one_rollout import run_member
from platoon.rollouts.records import write_json_atomic

if TYPE_CHECKING:
    from platoon.gateway.core import RolloutRecorder
    from platoon.gateway.records import AgentRecord
    from platoon.gateway.watch import CallWatch
    from platoon.rollouts.one_rollout import MemberOutcome, MemberRequest
    from platoon.trajectory import Trajectory, TrajectoryCollection

__all__ = [
    "COLLECTION_FILE",
    "METADATA_FILE",
    "ROLLOUTS_DIR",
    "OneRollout",
    "UsageBuckets",
    "iter_records",
    "provenance_mismatch",
    "rollout_dir",
    "rollout_record",
    "run_and_record",
    "safe_task_id",
    "score_collection",
    "write_json",
]

ROLLOUTS_DIR = "rollouts"
COLLECTION_FILE = "trajectory_collection.json"
METADATA_FILE = "metadata.json"
COMPLETED = "completed"
ERRORED = "errored"
#: rollouts written before provenance was recorded count as made by this policy shape
LEGACY_PROVENANCE = {"backend": "tinker", "judges": True}
USAGE_BUCKETS = ("policy", "aux", "judge", "verifier")
USAGE_COUNTS = ("calls", "prompt_tokens", "completion_tokens", "total_tokens", "cached_input_tokens")
#: agents whose trajectories are not steps of the policy's tree (excluded from step and depth counts)
GRADER_ROLES = ("verifier", "judge")
_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]")

UsageBuckets = dict[str, dict[str, int]]


def safe_task_id(task_id: str) -> str:
    """The task's directory name: characters other than alphanumerics and `-_.` become `_`."""
    return _UNSAFE.sub("_", task_id)


def rollout_dir(output_dir: Path, task_id: str, index: int) -> Path:
    return output_dir / ROLLOUTS_DIR / safe_task_id(task_id) / f"rollout_{index}"


def write_json(path: Path, data: Any) -> None:
    """Indented JSON, replaced atomically (a reader never sees half a record)."""
    write_json_atomic(path, data)


def _now() -> str:
    return _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds")


# ---------------------------------------------------------------------------------------------------------------
# Scoring a collection


def _depths(collection: TrajectoryCollection) -> dict[str, int]:
    """trajectory id -> depth (root 0), following parent ids."""
    depths: dict[str, int] = {}
    for trajectory_id, trajectory in collection.trajectories.items():
        depth, parent, seen = 0, trajectory.parent_info, {trajectory_id}
        while parent is not None and parent.id in collection.trajectories and parent.id not in seen:
            seen.add(parent.id)
            depth += 1
            parent = collection.trajectories[parent.id].parent_info
        depths[trajectory_id] = depth
    return depths


def _role(trajectory: Trajectory) -> str | None:
    agent = trajectory.misc.get("agent")
    role = agent.get("role") if isinstance(agent, Mapping) else None
    return str(role) if role else None


def _graders(collection: TrajectoryCollection) -> set[str]:
    """Trajectory ids of verifier and judge agents and everything below them."""
    out: set[str] = set()
    for trajectory_id, trajectory in collection.trajectories.items():
        current: Trajectory | None = trajectory
        seen: set[str] = set()
        while current is not None and current.id not in seen:
            seen.add(current.id)
            if _role(current) in GRADER_ROLES:
                out.add(trajectory_id)
                break
            parent = current.parent_info
            current = collection.trajectories.get(parent.id) if parent is not None else None
    return out


def _success_value(trajectory: Trajectory) -> float | None:
    """`reward/success` of the last step (the trace writes it for a scored outcome)."""
    if not trajectory.steps:
        return None
    value = (trajectory.steps[-1].misc.get("reward_misc") or {}).get("reward/success")
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _reward_keys(trajectory: Trajectory) -> dict[str, float]:
    """The `reward/*` numbers of the last step's reward_misc."""
    if not trajectory.steps:
        return {}
    misc = trajectory.steps[-1].misc.get("reward_misc") or {}
    return {
        str(k): float(v)
        for k, v in misc.items()
        if str(k).startswith("reward/") and isinstance(v, (int, float)) and not isinstance(v, bool)
    }


def score_collection(collection: TrajectoryCollection, reward_processor: str | None) -> dict[str, Any]:
    """What a record keeps of a rollout's trajectories: the root's outcome, reward (the reward processor's on the
    root, else the trajectory's), reward components, the success value, step and depth counts."""
    root = collection.root
    assert root is not None
    outcome = root.misc.get("outcome")
    traced = isinstance(outcome, Mapping)
    status = str(outcome.get("status") or "none") if isinstance(outcome, Mapping) else "none"
    reward = float(root.reward)
    components = _reward_keys(root)
    ref = reward_processor or root.misc.get("reward_processor")
    if ref and status in ("scored", "none"):
        scored = process_rewards(str(ref), collection).get(root.id)
        if scored is not None:
            reward = scored[0]
            components.update({k: float(v) for k, v in scored[1].items() if str(k).startswith("reward/")})
    graders = _graders(collection)
    depths = _depths(collection)
    steps = {tid: len(t.steps) for tid, t in collection.trajectories.items() if tid not in graders}
    subtrajectories = [
        {"depth": depths[tid], "steps": count, "reward": float(collection.trajectories[tid].reward)}
        for tid, count in steps.items()
        if tid != root.id
    ]
    flag = root.misc.get("success")
    return {
        "traced": traced,
        "outcome_status": status,
        "outcome_reason": outcome.get("reason") if isinstance(outcome, Mapping) else None,
        "reward": reward,
        "reward_components": components,
        "success_value": _success_value(root),
        "success_flag": float(flag)
        if isinstance(flag, (int, float)) and not isinstance(flag, bool)
        else None,
        "steps": {
            "total": sum(steps.values()),
            "root": steps.get(root.id, 0),
            "subtrajectories": sum(c for tid, c in steps.items() if tid != root.id),
        },
        "max_depth": max((depths[tid] for tid in steps), default=0),
        "subtrajectories": subtrajectories,
        "error_message": root.error_message,
    }


def is_success(record: Mapping[str, Any], threshold: float) -> bool:
    """Traced rollouts succeed only when scored, by the last step's `reward/success`; older rollouts
    without a trace by their own success flag (>= 1), else by the processed reward."""
    if record.get("status") != COMPLETED:
        return False
    if record.get("traced", True):
        if record.get("outcome_status") != "scored":
            return False
        value = record.get("success_value")
        if value is None:
            value = record.get("reward")
        return value is not None and float(value) >= threshold
    flag = record.get("success_flag")
    if flag is not None:
        return float(flag) >= 1.0
    reward = record.get("reward")
    return reward is not None and float(reward) >= threshold


# ---------------------------------------------------------------------------------------------------------------
# What the calls cost (from the gateway's agent records)


def _bucket(agent: AgentRecord, kind: str, verifiers: set[int]) -> str:
    if kind == "judge":
        return "judge"
    if id(agent) in verifiers:
        return "verifier"
    return "aux" if kind == "aux" else "policy"


def _verifier_agents(agents: Sequence[AgentRecord]) -> set[int]:
    out: set[int] = set()
    for agent in agents:
        current: AgentRecord | None = agent
        while current is not None:
            if current.role == "verifier":
                out.add(id(agent))
                break
            current = current.parent
    return out


def call_accounting(recorder: RolloutRecorder | None, *, judges: bool, refusals: int = 0) -> dict[str, Any]:
    """`usage`, `cost`, `backend` and `judges` of one rollout from its agents' call records."""
    usage: UsageBuckets = {bucket: dict.fromkeys(USAGE_COUNTS, 0) for bucket in USAGE_BUCKETS}
    agents = list(recorder.agents) if recorder is not None else []
    verifiers = _verifier_agents(agents)
    total_usd: float | None = None
    unpriced = attempts = rate_limited = without_usage = failed = refused_judges = 0
    served: set[str] = set()
    for agent in agents:
        failed += agent.gateway_errors
        refused_judges += int(agent.misc.get("judges_refused", 0) or 0)
        for call in agent.calls:
            bucket = usage[_bucket(agent, call.kind, verifiers)]
            provider = call.generation.get("provider") if isinstance(call.generation, Mapping) else None
            bucket["calls"] += 1
            for key in ("prompt_tokens", "completion_tokens", "total_tokens"):
                bucket[key] += int(call.usage.get(key, 0) or 0)
            if isinstance(provider, Mapping):
                bucket["cached_input_tokens"] += int(
                    (provider.get("usage") or {}).get("cached_input_tokens", 0)
                )
                attempts += int(provider.get("attempts") or 1)
                rate_limited += 1 if provider.get("rate_limited") else 0
                cost = provider.get("cost")
                if isinstance(cost, (int, float)):
                    total_usd = (total_usd or 0.0) + float(cost)
                else:
                    unpriced += 1
                if provider.get("model"):
                    served.add(str(provider["model"]))
            else:
                attempts += 1
                unpriced += 1
                served.add(call.model)
            if not call.usage.get("total_tokens"):
                without_usage += 1
    root = next((agent for agent in agents if agent.parent is None), None)
    return {
        "usage": usage,
        "cost": {"total_usd": total_usd, "unpriced_calls": unpriced},
        "backend": {
            "attempts": attempts,
            "rate_limited": rate_limited,
            "failed_calls": failed,
            "refusals": refusals,
            "calls_without_usage": without_usage,
            "served_models": sorted(served),
        },
        "judges": {
            "enabled": judges,
            "verifier_agents": sum(1 for a in agents if a.role == "verifier"),
            "verifier_steps": sum(a.policy_calls for a in agents if id(a) in verifiers),
            "judge_calls": usage["judge"]["calls"],
            "refused": refused_judges,
            "children_sharing_episode_outcome": sum(
                1 for a in agents if a is not root and a.outcome is None and id(a) not in verifiers
            ),
        },
    }


# ---------------------------------------------------------------------------------------------------------------
# The record


def rollout_record(
    *,
    task_id: str,
    label: str,
    split: str,
    index: int,
    outcome: MemberOutcome,
    recorder: RolloutRecorder | None,
    reward_processor: str | None,
    threshold: float,
    count_timeout_as_failure: bool,
    provenance: Mapping[str, Any],
    judges: bool,
    refusals: int = 0,
) -> dict[str, Any]:
    """`metadata.json` of one rollout, classified: unscored outcomes are errors, never failures."""
    accounting = call_accounting(recorder, judges=judges, refusals=refusals)
    record: dict[str, Any] = {
        "task_id": task_id,
        "label": label,
        "split": split,
        "rollout_index": index,
        "source_path": None,
        "wall_time_seconds": round(outcome.seconds, 3),
        "error": outcome.error,
        "outcome_status": "raised" if outcome.disposition == "error" else "none",
        "reward_key": outcome.reward_key,
        "created_at": _now(),
        "status": ERRORED,
        "reward": None,
        "reward_components": {},
        "success": False,
        **accounting,
        "provenance": dict(provenance),
    }
    collection = outcome.collection
    if collection is None or collection.root is None:
        if record["error"] is None:
            record["error"] = "the rollout produced no trajectories"
        return record
    record["source_path"] = str(
        Path(ROLLOUTS_DIR) / safe_task_id(task_id) / f"rollout_{index}" / COLLECTION_FILE
    )
    scored = score_collection(collection, reward_processor)
    record.update(
        traced=scored["traced"],
        outcome_status=scored["outcome_status"],
        success_value=scored["success_value"],
        success_flag=scored["success_flag"],
        steps=scored["steps"],
        max_depth=scored["max_depth"],
        subtrajectories=scored["subtrajectories"],
    )
    status = scored["outcome_status"]
    failed_calls = accounting["backend"]["failed_calls"]
    if failed_calls:
        # The backend, not the policy, decided this rollout (whatever outcome the harness then reached).
        record["error"] = f"backend_unavailable: {failed_calls} model call(s) failed after retries"
    elif status not in ("none", "scored") and not (status == "timeout" and count_timeout_as_failure):
        # An outcome that says nothing about the policy (a crash, a dead sandbox) is an error, not a failure.
        record["error"] = scored["error_message"] or f"Outcome {status}"
    else:
        record["status"] = COMPLETED
        record["error"] = None
        # A timeout counted as a failure has no score of its own: it fails with reward 0.
        record["reward"] = 0.0 if status == "timeout" else scored["reward"]
        record["reward_components"] = scored["reward_components"]
    record["success"] = is_success(record, threshold)
    return record


# ---------------------------------------------------------------------------------------------------------------
# Running one rollout (in process, or in a subprocess slot)


class OneRollout:
    """The shared gateway as one rollout sees it, keeping the recorder that rollout opened (its agents' counters
    say which calls failed after retries and what they cost)."""

    def __init__(self, gateway: Any) -> None:
        self._gateway = gateway
        self.recorder: Any = None

    def open_rollout(self, *args: Any, **kwargs: Any) -> Any:
        self.recorder = self._gateway.open_rollout(*args, **kwargs)
        return self.recorder

    def __getattr__(self, name: str) -> Any:
        return getattr(self._gateway, name)


async def run_and_record(
    request: MemberRequest,
    *,
    service: Any,
    gateway: Any,
    watch: CallWatch,
    record_settings: Mapping[str, Any],
) -> tuple[MemberOutcome, dict[str, Any]]:
    """Run one rollout through the trainer's member body on `gateway` and classify it; `record_settings` are
    `rollout_record`'s keyword arguments other than the outcome, the recorder and the refusals. The same in process
    and in a slot process, so both write the same records."""
    scoped = OneRollout(gateway)
    outcome = await run_member(request, service=service, gateway=scoped, version=lambda: 0)
    rollout_id = getattr(scoped.recorder, "rollout_id", None)
    record = rollout_record(
        outcome=outcome,
        recorder=scoped.recorder,
        refusals=watch.refusals.get(rollout_id, 0) if rollout_id else 0,
        **record_settings,
    )
    return outcome, record


# ---------------------------------------------------------------------------------------------------------------
# Reading an output directory


def iter_records(output_dir: Path) -> Iterator[tuple[Path, dict[str, Any]]]:
    """(rollout dir, metadata) of every rollout record under `<output_dir>/rollouts/`, in path order."""
    base = output_dir / ROLLOUTS_DIR
    if not base.is_dir():
        return
    for path in sorted(base.glob(f"*/rollout_*/{METADATA_FILE}")):
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue  # a record cut off by a crash: that rollout simply runs again
        if isinstance(data, dict):
            yield path.parent, data


def provenance_of(record: Mapping[str, Any]) -> dict[str, Any]:
    value = record.get("provenance")
    return dict(value) if isinstance(value, Mapping) else dict(LEGACY_PROVENANCE)


def provenance_mismatch(output_dir: Path, provenance: Mapping[str, Any]) -> str | None:
    """The refusal (exit 78) when a rollout in `output_dir` records another provenance on a shared key; None
    when every record agrees (or there are none)."""
    for where, record in iter_records(output_dir):
        theirs = provenance_of(record)
        differing = [key for key in provenance if key in theirs and theirs[key] != provenance[key]]
        if differing:
            shown = ", ".join(
                f"{key} {theirs[key]!r} (this evaluation: {provenance[key]!r})" for key in differing
            )
            rel = os.path.relpath(where, output_dir)
            return (
                f"inference.output_dir: {output_dir} holds rollouts made by another policy or judges setting ({rel} records {shown}); "
                "an evaluation never resumes another policy's rollouts: set another inference.output_dir, or "
                "leave it unset for a fresh directory"
            )
    return None
