"""The evaluation report: `reports/final_report.json` and `reports/task_results.jsonl`
(one task a line), built from the rollout records alone, so `stage: report` rebuilds it from disk.

Accounting: a valid rollout is a completed one; errored rollouts (unscored outcomes, failed backend calls, raised
rollouts) are counted apart and never as failures; `success_rate` is successful / valid.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from platoon.rollouts.eval_records import COMPLETED, USAGE_BUCKETS, USAGE_COUNTS, is_success, write_json

__all__ = ["REPORTS_DIR", "REPORT_FILE", "TASK_RESULTS_FILE", "build_report", "write_report"]

REPORTS_DIR = "reports"
REPORT_FILE = "final_report.json"
TASK_RESULTS_FILE = "task_results.jsonl"


def _stats(values: Sequence[float]) -> dict[str, Any]:
    """`{count, mean, min, max}`; None for the mean, min and max of nothing (never a 0 standing in)."""
    if not values:
        return {"count": 0, "mean": None, "min": None, "max": None}
    return {
        "count": len(values),
        "mean": statistics.fmean(values),
        "min": min(values),
        "max": max(values),
    }


def _mean(values: Sequence[float]) -> float | None:
    return statistics.fmean(values) if values else None


def _split3(records: Sequence[Mapping[str, Any]], value: Any) -> dict[str, dict[str, Any]]:
    """`{overall, success, failure}` of `value(record)` over valid rollouts (None values skipped)."""
    groups: dict[str, list[float]] = {"overall": [], "success": [], "failure": []}
    for record in records:
        number = value(record)
        if number is None:
            continue
        groups["overall"].append(float(number))
        groups["success" if record["_success"] else "failure"].append(float(number))
    return {name: _stats(values) for name, values in groups.items()}


def _task_summary(task_id: str, records: Sequence[dict[str, Any]]) -> dict[str, Any]:
    valid = [r for r in records if r.get("status") == COMPLETED]
    rewards = [float(r["reward"]) for r in valid if r.get("reward") is not None]
    successes = [1.0 if r["_success"] else 0.0 for r in valid]
    label = next((r.get("label") for r in records if r.get("label") is not None), None)
    return {
        "task_id": task_id,
        "label": label,
        "total_rollouts": len(records),
        "valid_rollouts": len(valid),
        "successful_rollouts": int(sum(successes)),
        "failed_rollouts": len(valid) - int(sum(successes)),
        "errored_rollouts": len(records) - len(valid),
        "success_at_k": max(successes) if successes else None,
        "success_rate_within_task": _mean(successes),
        "reward_at_k": {
            "mean": _mean(rewards),
            "max": max(rewards) if rewards else None,
            "min": min(rewards) if rewards else None,
        },
        "rollouts": [{k: v for k, v in r.items() if not k.startswith("_")} for r in records],
    }


def _counts(values: Sequence[str]) -> dict[str, int]:
    out: dict[str, int] = {}
    for value in values:
        out[value] = out.get(value, 0) + 1
    return dict(sorted(out.items()))


def _components(
    valid: Sequence[dict[str, Any]], by_task: Mapping[str, list[dict[str, Any]]]
) -> dict[str, Any]:
    keys = sorted({k for r in valid for k in (r.get("reward_components") or {}) if k.startswith("reward/")})
    bundles: dict[str, Any] = {"overall": {}, "success": {}, "failure": {}}
    at_k: dict[str, dict[str, float | None]] = {"at_k_mean": {}, "at_k_max": {}, "at_k_min": {}}
    for key in keys:
        for name, stats in _split3(
            valid, lambda r, key=key: (r.get("reward_components") or {}).get(key)
        ).items():
            bundles[name][key] = stats
        per_task = [
            values
            for records in by_task.values()
            if (
                values := [
                    float(r["reward_components"][key])
                    for r in records
                    if key in (r.get("reward_components") or {})
                ]
            )
        ]
        at_k["at_k_mean"][key] = _mean([statistics.fmean(v) for v in per_task])
        at_k["at_k_max"][key] = _mean([max(v) for v in per_task])
        at_k["at_k_min"][key] = _mean([min(v) for v in per_task])
    return {**bundles, **at_k}


def _usage(records: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    n = len(records)
    out: dict[str, Any] = {}
    for bucket in USAGE_BUCKETS:
        total = {
            key: sum(int(((r.get("usage") or {}).get(bucket) or {}).get(key, 0)) for r in records)
            for key in USAGE_COUNTS
        }
        out[bucket] = {
            "total": total,
            "mean_per_rollout": {key: (value / n if n else None) for key, value in total.items()},
        }
    return out


def _depth_stats(valid: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    by_depth: dict[int, dict[str, list[float]]] = {}
    for record in valid:
        for sub in record.get("subtrajectories") or ():
            slot = by_depth.setdefault(int(sub["depth"]), {"steps": [], "reward": []})
            slot["steps"].append(float(sub["steps"]))
            slot["reward"].append(float(sub["reward"]))
    return {
        str(depth): {
            "trajectories": len(values["steps"]),
            "steps": _stats(values["steps"]),
            "reward": _stats(values["reward"]),
        }
        for depth, values in sorted(by_depth.items())
    }


def build_report(
    tasks: Mapping[str, Sequence[Mapping[str, Any]]],
    *,
    success_threshold: float,
    model: Mapping[str, Any],
    workflow_config: Mapping[str, Any],
    elapsed_seconds: float,
    judges: bool,
    workflow_specific_metrics: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The report of `tasks` (task id -> its rollout records, in task order)."""
    by_task = {
        task_id: [{**record, "_success": is_success(record, success_threshold)} for record in records]
        for task_id, records in tasks.items()
    }
    records = [r for rs in by_task.values() for r in rs]
    valid = [r for r in records if r.get("status") == COMPLETED]
    successful = [r for r in valid if r["_success"]]
    rewards = [float(r["reward"]) for r in valid if r.get("reward") is not None]
    summaries = [_task_summary(task_id, rs) for task_id, rs in by_task.items()]
    measured = [s for s in summaries if s["valid_rollouts"]]
    served = sorted({m for r in records for m in ((r.get("backend") or {}).get("served_models") or ())})
    backends = [r.get("backend") or {} for r in records]
    judge_records = [r.get("judges") or {} for r in records]
    costs = [(r.get("cost") or {}).get("total_usd") for r in records]
    priced = [float(c) for c in costs if isinstance(c, (int, float))]
    summary = {
        "total_tasks": len(by_task),
        "tasks_without_valid_rollouts": len(by_task) - len(measured),
        "total_rollouts": len(records),
        "valid_rollouts": len(valid),
        "successful_rollouts": len(successful),
        "failed_rollouts": len(valid) - len(successful),
        "errored_rollouts": len(records) - len(valid),
        "outcome_status_counts": _counts([str(r.get("outcome_status") or "none") for r in records]),
        "reward_key_counts": _counts([str(r["reward_key"]) for r in valid if r.get("reward_key")]),
        "success_rate": len(successful) / len(valid) if valid else None,
        "success_at_k": _mean([float(s["success_at_k"]) for s in measured]),
        "reward_mean": _mean(rewards),
        "reward_max": max(rewards) if rewards else None,
        "reward_min": min(rewards) if rewards else None,
        "reward_at_k_mean": _mean(
            [s["reward_at_k"]["mean"] for s in measured if s["reward_at_k"]["mean"] is not None]
        ),
        "reward_at_k_max": _mean(
            [s["reward_at_k"]["max"] for s in measured if s["reward_at_k"]["max"] is not None]
        ),
        "reward_at_k_min": _mean(
            [s["reward_at_k"]["min"] for s in measured if s["reward_at_k"]["min"] is not None]
        ),
        "elapsed_seconds": round(elapsed_seconds, 3),
    }

    def steps(key: str) -> Any:
        return lambda r: (r.get("steps") or {}).get(key)

    return {
        "summary": summary,
        "stats": {
            "num_steps_total": _split3(valid, steps("total")),
            "num_steps_root": _split3(valid, steps("root")),
            "num_steps_subtrajectories": _split3(valid, steps("subtrajectories")),
            "rollout_wall_time_seconds": _split3(valid, lambda r: r.get("wall_time_seconds")),
        },
        "reward_components": _components(
            valid, {t: [r for r in rs if r.get("status") == COMPLETED] for t, rs in by_task.items()}
        ),
        "subtrajectory_stats_by_depth": _depth_stats(valid),
        "workflow_specific_metrics": dict(workflow_specific_metrics or {}),
        "workflow_config": dict(workflow_config),
        "model": {**model, "served_models": served},
        "usage": _usage(records),
        "cost": {
            "total_usd": sum(priced) if priced else None,
            "mean_usd_per_rollout": sum(priced) / len(records) if priced and records else None,
            "unpriced_calls": sum(int((r.get("cost") or {}).get("unpriced_calls", 0)) for r in records),
        },
        "backend": {
            "attempts": sum(int(b.get("attempts", 0)) for b in backends),
            "rate_limited": sum(int(b.get("rate_limited", 0)) for b in backends),
            "failed_calls": sum(int(b.get("failed_calls", 0)) for b in backends),
            "refusals": sum(int(b.get("refusals", 0)) for b in backends),
            "calls_without_usage": sum(int(b.get("calls_without_usage", 0)) for b in backends),
            "rollouts_with_failed_calls": sum(1 for b in backends if b.get("failed_calls")),
            "served_models": served,
        },
        "judges": {
            "enabled": judges,
            **{
                key: sum(int(j.get(key, 0)) for j in judge_records)
                for key in (
                    "verifier_agents",
                    "verifier_steps",
                    "judge_calls",
                    "refused",
                    "children_sharing_episode_outcome",
                )
            },
        },
        "tasks": summaries,
    }


def write_report(output_dir: Path, report: Mapping[str, Any]) -> Path:
    """`reports/final_report.json` (atomically) and `reports/task_results.jsonl`; returns the report's path."""
    import json
    import os

    where = output_dir / REPORTS_DIR
    where.mkdir(parents=True, exist_ok=True)
    lines = "".join(json.dumps(task, ensure_ascii=False, default=str) + "\n" for task in report["tasks"])
    partial = where / f".{TASK_RESULTS_FILE}.partial"
    partial.write_text(lines, encoding="utf-8")
    os.replace(partial, where / TASK_RESULTS_FILE)
    write_json(where / REPORT_FILE, report)
    return where / REPORT_FILE
