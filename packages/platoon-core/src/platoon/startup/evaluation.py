"""What `platoon eval` and `platoon rollout` refuse before they write anything (exit 78), one line each: the mixture
rules, every component resolving, with `inference.judges: false` the entries whose reward processor or program may
read the verdicts that turns off, and an output directory a live process holds. `preflight_problems` is every
refusal of an evaluation's start, as `platoon config validate` reports them.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from platoon.errors import ConfigError
from platoon.eval.evaluator import choose_output_dir
from platoon.eval.policy import TINKER, PolicySpec, check_policy_key, sample_timeout_line
from platoon.eval.tasks import list_tasks
from platoon.gateway.tinker_service import uses_local_server
from platoon.naming import split_ref
from platoon.rollouts.eval_records import provenance_mismatch
from platoon.rollouts.records import RunDirInUse, check_run_dir_free, writable_dir_problem
from platoon.startup.capabilities import policy_problems
from platoon.startup.checks import component_problems, run_problems
from platoon.startup.tinker import local_model_problem

if TYPE_CHECKING:
    from platoon.config.loader import LoadedConfig
    from platoon.eval.config_defs import PlatoonEvalConfig

__all__ = [
    "CORE_PROGRAMS",
    "CORE_REWARD_PROCESSORS",
    "check_output_dir_free",
    "evaluation_problems",
    "ignored_output_dir_lines",
    "judges_problems",
    "local_model_problems",
    "preflight_problems",
]

#: programs and reward processors core ships: they never read child verdicts behind the evaluation's back
CORE_PROGRAMS = frozenset({"single", "gym"})
CORE_REWARD_PROCESSORS = frozenset({"platoon-delegation"})


def evaluation_problems(config: Any, *, training: bool = False) -> list[str]:
    """The mixture rules (no length of training needed), every component resolving, and the judges-off refusals;
    `training`: `platoon rollout` of a training config, which has no judges to turn off."""
    problems = run_problems(config, kind="eval")
    if problems:
        return problems
    problems = component_problems(config)
    if not training:
        problems += judges_problems(config)
    return problems


def local_model_problems(spec: PolicySpec, *, where: str = "inference.model_name") -> list[str]:
    """The refusal of a base model the local Tinker-compatible server cannot serve, when the policy samples there
    (a typo or a missing directory is named before the server starts, not reported by its first sampler)."""
    if spec.backend != TINKER or not uses_local_server(spec.base_url):
        return []
    problem = local_model_problem(spec.model, where=where)
    return [] if problem is None else [problem]


def judges_problems(config: Any) -> list[str]:
    """With `inference.judges: false`, entries grading children with verifiers whose own reward processor or
    non-core program might read the verdicts are refused at start."""
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


def check_output_dir_free(
    output_dir: Path,
    *,
    key: str = "inference.output_dir",
    way_out: str = "stop that evaluation, or set another inference.output_dir (or none, for a fresh directory)",
) -> None:
    """Refuse (78) a directory a live process holds, saying how this command gets another one."""
    try:
        check_run_dir_free(output_dir)
    except RunDirInUse as exc:
        held = exc.problems[0].split("; stop that run", 1)[0]
        raise ConfigError(f"{key}: {held}; {way_out}") from None


def ignored_output_dir_lines(loaded: LoadedConfig) -> list[str]:
    """The warning that `inference.workflow.rollout_config.output_dir` is ignored (rollouts go under the
    evaluation's own directory)."""
    inference = loaded.data.get("inference")
    workflow = inference.get("workflow") if isinstance(inference, Mapping) else None
    rollout = workflow.get("rollout_config") if isinstance(workflow, Mapping) else None
    if isinstance(rollout, Mapping) and rollout.get("output_dir") is not None:
        return [
            "inference.workflow.rollout_config.output_dir is ignored: platoon eval writes rollouts under its "
            "output directory (inference.output_dir)"
        ]
    return []


async def preflight_problems(config: PlatoonEvalConfig, loaded: LoadedConfig) -> list[str]:
    """Every refusal an evaluation's start makes before it writes anything, one line each, writing nothing (what
    `platoon config validate` reports for an evaluation config): the policy's key, the sample timeout, a writable
    output directory no live start holds and no other policy's rollouts fill, every component resolving, the
    tasks, and what the policy's Tinker service says it can do."""
    problems: list[str] = []
    spec = PolicySpec.of_eval(config)
    for check in (
        lambda: check_policy_key(spec, in_process=not config.inference.workflow.use_subprocesses),
        lambda: sample_timeout_line(spec, "inference"),
    ):
        try:
            check()
        except ConfigError as exc:
            problems += exc.problems
    choice = choose_output_dir(config, loaded, spec)
    # A fresh directory's name is a time stamp of the start: what can be checked now is `<runs>/eval`.
    target = choice.path.parents[1] if choice.fresh else choice.path
    if (unwritable := writable_dir_problem(target, key="inference.output_dir")) is not None:
        problems.append(unwritable)
    elif not choice.fresh:
        try:
            check_output_dir_free(choice.path)
        except ConfigError as exc:
            problems += exc.problems
        if (refusal := provenance_mismatch(choice.path, spec.provenance())) is not None:
            problems.append(refusal)
    config_problems = evaluation_problems(config) + local_model_problems(spec)
    problems += config_problems
    if not config_problems:
        try:
            await list_tasks(config, split=config.split, base_dir=loaded.path.parent)
        except ConfigError as exc:
            problems += exc.problems
    if not problems:
        problems += await policy_problems(spec)  # the start's capability check, where the service is in reach
    return problems
