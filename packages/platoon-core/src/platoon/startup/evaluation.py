"""What `platoon eval` and `platoon rollout` refuse of a config before they list tasks (exit 78), one line each:
the mixture rules, every component resolving, and, with `inference.judges: false`, the entries whose reward
processor or program may read the verdicts that turns off.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "CORE_PROGRAMS",
    "CORE_REWARD_PROCESSORS",
    "evaluation_problems",
    "judges_problems",
]

#: programs and reward processors core ships: they never read child verdicts behind the evaluation's back
CORE_PROGRAMS = frozenset({"single", "gym"})
CORE_REWARD_PROCESSORS = frozenset({"platoon-delegation"})


def evaluation_problems(config: Any, *, training: bool = False) -> list[str]:
    """The mixture rules (no length of training needed), every component resolving, and the judges-off refusals;
    `training`: `platoon rollout` of a training config, which has no judges to turn off."""
    from platoon.startup.checks import component_problems, run_problems

    problems = run_problems(config, kind="eval")
    if problems:
        return problems
    problems = component_problems(config)
    if not training:
        problems += judges_problems(config)
    return problems


def judges_problems(config: Any) -> list[str]:
    """With `inference.judges: false`, entries grading children with verifiers whose own reward processor or
    non-core program might read the verdicts are refused at start."""
    from platoon.naming import split_ref

    if config.inference.judges:
        return []
    problems = []
    for index, entry in enumerate(config.environments or []):
        if entry.agents.child_grading != "verifier":
            continue
        readers = []
        if entry.reward_processor and entry.reward_processor not in CORE_REWARD_PROCESSORS:
            readers.append(f"its reward processor {entry.reward_processor!r}")
        if split_ref(entry.program)[0] not in CORE_PROGRAMS:
            readers.append(f"its program {entry.program!r}")
        if readers:
            problems.append(
                f"environments.{index}: agents.child_grading is verifier and {' and '.join(readers)} may read "
                "the verifiers' verdicts, which inference.judges: false turns off; set inference.judges: true, "
                "or grade children another way"
            )
    return problems
