"""`lock.json.components` of an evaluation or an ad-hoc rollout: every component the entries name
for the split that runs (loaders and rollout of that phase; harness options of both phases), with where each
was found.

Called after `component_problems` passed, so every reference resolves here.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from platoon import plugins
from platoon.episode.rollout import Route
from platoon.episode.subagents import resolve_harness
from platoon.eval.tasks import entries_by_label
from platoon.naming import split_ref
from platoon.programs.registry import get_program

__all__ = ["component_records"]


def _entry_point(kind: str, name: str) -> Any:
    found = plugins.candidates(kind, name)
    return found[0] if found else None


def _record(
    kind: str, ref: str, resolved: str, source: str | None, *, entry_point_kind: str | None, name: str
) -> dict[str, Any]:
    info = _entry_point(entry_point_kind, name) if entry_point_kind is not None else None
    return {
        "kind": kind,
        "ref": ref,
        "resolved": resolved,
        "source": source,
        "distribution": info.distribution if info is not None else None,
        "distribution_version": info.distribution_version if info is not None else None,
        "entry_point": f"{info.group}:{info.name} = {info.value}" if info is not None else None,
        "environments": [],
    }


def _harness_records(entry: Any) -> list[tuple[str, dict[str, Any]]]:
    harness = entry.harness
    refs = list(harness) if isinstance(harness, Mapping) else ([harness] if harness else [])
    out = []
    for ref in refs:
        record = resolve_harness(ref)
        name = split_ref(ref)[0] if ":" not in ref else record.name
        out.append(
            (
                f"harness:{record.ref}",
                _record("harness", ref, record.ref, record.source, entry_point_kind="harness", name=name),
            )
        )
    return out


def _options(entry: Any) -> dict[str, Any]:
    """`{train: options, eval: options}` as each phase applies them; `eval` omitted when identical."""
    train = dict(entry.harness_options)
    evaluated = dict(Route.from_entry(entry, split="eval", task_id="-").harness_options)
    return {"train": train} if evaluated == train else {"train": train, "eval": evaluated}


def component_records(config: Any, *, split: str) -> list[dict[str, Any]]:
    """One record per distinct component, listing the entry labels that name it (`environments`)."""
    records: dict[str, dict[str, Any]] = {}

    def add(key: str, record: dict[str, Any], label: str) -> dict[str, Any]:
        kept = records.setdefault(key, record)
        if label not in kept["environments"]:
            kept["environments"].append(label)
        return kept

    for label, (_, entry) in entries_by_label(config).items():
        if entry.env:
            name = split_ref(entry.env)[0]
            add(
                f"environment:{entry.env}",
                _record("environment", entry.env, entry.env, None, entry_point_kind="environment", name=name),
                label,
            )
        for key, record in _harness_records(entry):
            kept = add(key, record, label)
            kept.setdefault("options", {})[label] = _options(entry)
        program = get_program(entry.program) if ":" not in entry.program else None
        resolved = program.ref if program is not None else entry.program
        add(
            f"program:{resolved}",
            _record(
                "program",
                entry.program,
                resolved,
                program.source if program else entry.program,
                entry_point_kind="program",
                name=split_ref(entry.program)[0],
            ),
            label,
        )
        if entry.service:
            scheme = plugins.service_scheme(entry.service)
            add(
                f"service:{entry.service}",
                _record(
                    "service", entry.service, scheme, entry.service, entry_point_kind="service", name=scheme
                ),
                label,
            )
        if entry.reward_processor:
            ref = entry.reward_processor
            add(
                f"reward_processor:{ref}",
                _record("reward_processor", ref, ref, None, entry_point_kind="reward_processor", name=ref),
                label,
            )
        rollout = (entry.rollout if split == "train" else entry.eval_rollout or entry.rollout) or (
            "harness_rollout" if entry.harness else None
        )
        if rollout:
            add(
                f"rollout:{rollout}",
                _record(
                    "rollout",
                    rollout,
                    rollout,
                    "platoon.episode.rollout" if rollout == "harness_rollout" else rollout,
                    entry_point_kind=None,
                    name=rollout,
                ),
                label,
            )
        loader = (
            entry.dataset_loader if split == "train" else entry.eval_dataset_loader or entry.dataset_loader
        )
        loaders: tuple[tuple[str, str | None], ...] = (
            ("dataset_loader", loader),
            ("task_loader", entry.task_loader),
        )
        for kind, named in loaders:
            if named:
                add(
                    f"{kind}:{named}",
                    _record(kind, named, named, named, entry_point_kind=None, name=named),
                    label,
                )
    return list(records.values())
