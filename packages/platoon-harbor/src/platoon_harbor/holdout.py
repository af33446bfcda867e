"""The hold-out of whole groups of tasks for evaluation (`service_kwargs.holdout`).

`holdout_split(rows, rule, dataset=...) -> Split` is a pure function of the lock's task rows and the rule: the same
on every machine and in every process (SHA-256 orderings, exact decimal arithmetic, no hash randomisation), so
workers need only task ids. Groups that share an input file are merged (union-find), whole groups are held out per
stratum up to ceil(fraction x stratum size), and `Split.record()` is what a run writes into identity.json.

API: `HoldoutRule.parse(value)` (ConfigError, exit 78, for a bad rule), `holdout_split(rows, rule, dataset=None)`,
`Split.eval` / `Split.train` / `Split.held_out` / `Split.eval_digest` / `Split.record()` / `Split.report_lines()`.
"""

from __future__ import annotations

import fnmatch
import hashlib
import math
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from typing import Any

from platoon.errors import ConfigError

__all__ = ["HoldoutRule", "Split", "holdout_split"]

_EMPTY = "sha256:" + hashlib.sha256(b"").hexdigest()
_KEYS = {"fraction", "group_by", "stratify_by", "seed", "ignore_inputs"}
_WHERE = "service_kwargs.holdout"


@dataclass(frozen=True)
class HoldoutRule:
    fraction: str  # the decimal as written, so ceil() is exact
    group_by: tuple[str, ...]
    stratify_by: str | None = None
    seed: int = 0
    ignore_inputs: tuple[str, ...] = ()

    @classmethod
    def parse(cls, value: Any) -> HoldoutRule:
        if not isinstance(value, Mapping):
            raise ConfigError(f"{_WHERE}: expected a table with fraction and group_by")
        unknown = set(value) - _KEYS
        if unknown:
            raise ConfigError(
                f"{_WHERE}.{sorted(unknown)[0]}: unknown key (known: {', '.join(sorted(_KEYS))})"
            )
        raw = value.get("fraction")
        if isinstance(raw, bool) or not isinstance(raw, (int, float, str)):
            raise ConfigError(f"{_WHERE}.fraction: required, a number with 0 < fraction < 1")
        try:
            fraction = Decimal(str(raw))  # str(0.1) == "0.1": the decimal as written, not the binary float
        except InvalidOperation:
            raise ConfigError(f"{_WHERE}.fraction: {raw!r} is not a number") from None
        if not 0 < fraction < 1:
            raise ConfigError(f"{_WHERE}.fraction: {raw} is not between 0 and 1 (exclusive)")
        group_by = value.get("group_by")
        groups = [group_by] if isinstance(group_by, str) else group_by
        if not isinstance(groups, list) or not groups or not all(isinstance(g, str) and g for g in groups):
            raise ConfigError(f"{_WHERE}.group_by: required, an index field or a list of them")
        stratify = value.get("stratify_by")
        if stratify is not None and not isinstance(stratify, str):
            raise ConfigError(f"{_WHERE}.stratify_by: expected an index field name")
        seed = value.get("seed", 0)
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise ConfigError(f"{_WHERE}.seed: expected an integer")
        ignore = value.get("ignore_inputs") or []
        ignore = [ignore] if isinstance(ignore, str) else ignore
        if not isinstance(ignore, list) or not all(isinstance(p, str) for p in ignore):
            raise ConfigError(f"{_WHERE}.ignore_inputs: expected fnmatch patterns of task-relative paths")
        return cls(str(fraction), tuple(groups), stratify, seed, tuple(ignore))

    def to_json(self) -> dict[str, Any]:
        return {
            "fraction": self.fraction,
            "group_by": list(self.group_by),
            "stratify_by": self.stratify_by,
            "seed": self.seed,
            "ignore_inputs": list(self.ignore_inputs),
        }


def _order(seed: int, name: str) -> str:
    return hashlib.sha256(f"{seed}\0{name}".encode()).hexdigest()


@dataclass
class Split:
    rule: HoldoutRule
    eval: list[str]
    train: list[str]
    held_out: list[str]  # every task of a held-out group, refused ones included
    eval_digest: str
    dataset: dict[str, Any] = field(default_factory=dict)
    strata: dict[str, dict[str, Any]] = field(default_factory=dict)
    joined: dict[str, Any] = field(default_factory=dict)

    def record(self) -> dict[str, Any]:
        """The split record a run writes into identity.json."""
        return {
            "holdout": self.rule.to_json(),
            "dataset": self.dataset,
            "held_out": sorted(self.held_out),
            "eval": list(self.eval),
            "eval_digest": self.eval_digest,
        }

    def report_lines(self) -> list[str]:
        lines = []
        for name, s in sorted(self.strata.items()):
            lines.append(
                f"hold-out stratum {name}: {s['selected']} selected, {s['runnable']} runnable, {s['held_out']} held "
                f"out (target {s['target']}), {s['eval']} eval in {s['eval_groups']} group(s), largest group "
                f"{s['largest_group']} ({s['largest_share']:.0%}), {s['train']} train, refused {s['refusals']}"
            )
        lines.append(
            f"hold-out groups: {self.joined['groups']} ({self.joined['merged']} merged through shared inputs); "
            f"eval_digest {self.eval_digest}"
        )
        return lines


class _Groups:
    """Union-find over group names; the merged group is named after its member with the most tasks."""

    def __init__(self, names: Sequence[str]) -> None:
        self.parent = {n: n for n in names}

    def find(self, name: str) -> str:
        while self.parent[name] != name:
            self.parent[name] = self.parent[self.parent[name]]
            name = self.parent[name]
        return name

    def union(self, a: str, b: str) -> None:
        ra, rb = self.find(a), self.find(b)
        if ra != rb:
            self.parent[max(ra, rb)] = min(ra, rb)


def holdout_split(
    rows: Sequence[Mapping[str, Any]],
    rule: HoldoutRule | Mapping[str, Any],
    *,
    dataset: Mapping[str, Any] | None = None,
) -> Split:
    """Split lock rows (`name`, `index`, `refused`, `input_files`) into eval and train."""
    rule = rule if isinstance(rule, HoldoutRule) else HoldoutRule.parse(rule)
    problems: list[str] = []
    stratum: dict[str, str] = {}
    group: dict[str, str] = {}
    refused: dict[str, str] = {}
    for row in rows:
        name = str(row["name"])
        fields = {"name": name, **dict(row.get("index") or {})}
        if row.get("refused"):
            refused[name] = str(row["refused"]).split(":", 1)[0]
        if rule.stratify_by is not None and rule.stratify_by not in fields:
            if name not in refused:
                problems.append(f"task {name} has no {rule.stratify_by!r} field to stratify by")
            continue
        owner = next((g for g in rule.group_by if g in fields), None)
        if owner is None:
            if name not in refused:
                problems.append(f"task {name} has none of the group_by fields {', '.join(rule.group_by)}")
            continue
        if "input_files" not in row:
            problems.append(
                f"task {name} records no input files (an old lock): refetch with platoon harbor fetch"
            )
            continue
        stratum[name] = str(fields[rule.stratify_by]) if rule.stratify_by is not None else "all"
        group[name] = str(fields[owner])
    if problems:
        raise ConfigError(problems[:20], source=_WHERE)
    # Step 3: merge groups through shared input-file digests.
    members: dict[str, list[str]] = defaultdict(list)
    for name, g in group.items():
        members[g].append(name)
    uf = _Groups(sorted(members))
    by_digest: dict[str, str] = {}
    used_patterns: set[str] = set()
    rows_by_name = {str(r["name"]): r for r in rows}
    for name in sorted(group):
        for path, digest in sorted((rows_by_name[name].get("input_files") or {}).items()):
            hit = [p for p in rule.ignore_inputs if fnmatch.fnmatchcase(path, p)]
            used_patterns.update(hit)
            if hit or digest == _EMPTY:
                continue
            if digest in by_digest:
                uf.union(by_digest[digest], group[name])
            else:
                by_digest[digest] = group[name]
    unused = [p for p in rule.ignore_inputs if p not in used_patterns]
    if unused:
        raise ConfigError(f"{_WHERE}.ignore_inputs: {unused[0]!r} matches no input file")
    clusters: dict[str, list[str]] = defaultdict(list)
    for g in members:
        clusters[uf.find(g)].append(g)
    merged_name: dict[str, str] = {}
    tasks_of: dict[str, list[str]] = {}
    for parts in clusters.values():
        best = min(parts, key=lambda g: (-len(members[g]), g))
        merged_name.update({g: best for g in parts})
        tasks_of[best] = sorted(t for g in parts for t in members[g])
    # Step 4: the target per stratum, exactly on the decimal.
    counts: dict[str, int] = defaultdict(int)
    for name in group:
        counts[stratum[name]] += 1
    fraction = Decimal(rule.fraction)
    target = {s: math.ceil(fraction * n) for s, n in counts.items()}
    # Step 5: walk the groups in seeded hash order; a group goes in whole, or not at all.
    held_count: dict[str, int] = defaultdict(int)
    held_groups: list[str] = []
    for g in sorted(tasks_of, key=lambda g: _order(rule.seed, g)):
        touch: dict[str, int] = defaultdict(int)
        for t in tasks_of[g]:
            touch[stratum[t]] += 1
        if all(held_count[s] + n <= target[s] for s, n in touch.items()):
            for s, n in touch.items():
                held_count[s] += n
            held_groups.append(g)
    held = {t for g in held_groups for t in tasks_of[g]}
    # Step 6: the lists, runnable tasks only, in seeded order.
    eval_ids = sorted((t for t in held if t not in refused), key=lambda t: _order(rule.seed, t))
    train_ids = sorted(
        (t for t in group if t not in held and t not in refused), key=lambda t: _order(rule.seed, t)
    )
    digest = hashlib.sha256("\n".join(sorted(eval_ids)).encode()).hexdigest()
    # Step 7: the report.
    strata: dict[str, dict[str, Any]] = {}
    for s in sorted(counts):
        in_s = [t for t in group if stratum[t] == s]
        groups_s = {merged_name[group[t]] for t in in_s}
        largest = max(groups_s, key=lambda g: (sum(1 for t in tasks_of[g] if stratum[t] == s), g))
        size = sum(1 for t in tasks_of[largest] if stratum[t] == s)
        kinds: dict[str, int] = defaultdict(int)
        for t in in_s:
            if t in refused:
                kinds[refused[t]] += 1
        strata[s] = {
            "selected": len(in_s),
            "runnable": sum(1 for t in in_s if t not in refused),
            "held_out": held_count[s],
            "target": target[s],
            "eval": sum(1 for t in eval_ids if stratum[t] == s),
            "eval_groups": len({merged_name[group[t]] for t in eval_ids if stratum[t] == s}),
            "largest_group": largest,
            "largest_share": size / len(in_s),
            "train": sum(1 for t in train_ids if stratum[t] == s),
            "refusals": dict(sorted(kinds.items())),
        }
    joined = {"groups": len(tasks_of), "merged": sum(1 for parts in clusters.values() if len(parts) > 1)}
    return Split(rule, eval_ids, train_ids, sorted(held), digest, dict(dataset or {}), strata, joined)


def eval_problem(split: Split) -> str | None:
    """Step 8: listing `eval` with no runnable held-out task is a config error, with advice."""
    if split.eval:
        return None
    advice = "raise holdout.fraction or choose a finer group_by"
    if split.joined.get("merged"):
        advice += "; groups were joined through shared input files: holdout.ignore_inputs can leave shared files out"
    return f"{_WHERE}: the eval split holds no runnable task ({advice})"
