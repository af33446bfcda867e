"""The start of `platoon eval` in this process, in order: the policy's key and sample timeout, the output
directory chosen and refused when it cannot be written, is held by a live start or holds another policy's
rollouts, then `evaluation`'s refusals and the task listing, all before anything is written; then
`eval.evaluator.evaluate`. `stage: report` checks the evaluation it reports on, then `eval.evaluator.rebuild_report`.
"""

from __future__ import annotations

import datetime as _dt
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from platoon.errors import ConfigError
from platoon.eval.evaluator import choose_output_dir, evaluate, rebuild_report
from platoon.eval.policy import PolicySpec, check_policy_key, sample_timeout_line
from platoon.eval.tasks import list_tasks
from platoon.rollouts.eval_records import provenance_mismatch
from platoon.rollouts.records import writable_dir_problem
from platoon.startup.capabilities import policy_problems
from platoon.startup.evaluation import (
    check_output_dir_free,
    evaluation_problems,
    ignored_output_dir_lines,
    local_model_problems,
)

if TYPE_CHECKING:
    from platoon.config.loader import LoadedConfig
    from platoon.eval.config_defs import PlatoonEvalConfig

__all__ = ["start_evaluation", "start_report"]

Say = Callable[[str], None]


async def start_evaluation(
    config: PlatoonEvalConfig, loaded: LoadedConfig, *, say: Say, now: _dt.datetime | None = None
) -> dict[str, Any]:
    """Check, then run the evaluation `config` names (stage `full` or `rollouts`); returns what the command
    prints: the report's summary, or for `stage: rollouts` the stage's counts. Raises ConfigError (78) for
    refusals and PlatoonError (1) for a `fail_fast` stop."""
    started = time.monotonic()
    spec = PolicySpec.of_eval(config)
    # The key first: a missing key is refused before anything is prepared or written.
    check_policy_key(spec, in_process=not config.inference.workflow.use_subprocesses)
    line = sample_timeout_line(spec, "inference")
    if line is not None:
        say(line)
    for warning in ignored_output_dir_lines(loaded):
        say(warning)
    choice = choose_output_dir(config, loaded, spec, now=now)
    if (unwritable := writable_dir_problem(choice.path, key="inference.output_dir")) is not None:
        raise ConfigError(unwritable)
    if not choice.fresh:
        check_output_dir_free(choice.path)
        refusal = provenance_mismatch(choice.path, spec.provenance())
        if refusal is not None:
            raise ConfigError(refusal)
    problems = evaluation_problems(config) + local_model_problems(spec)
    if not problems:
        problems = await policy_problems(spec)  # what the Tinker service says it can do, before any rollout
    if problems:
        raise ConfigError(problems)
    # Listed before the directory is made: a service that cannot list is refused with nothing written.
    listing = await list_tasks(config, split=config.split, base_dir=loaded.path.parent)
    return await evaluate(config, loaded, spec=spec, choice=choice, listing=listing, say=say, started=started)


def start_report(config: PlatoonEvalConfig, say: Say) -> dict[str, Any]:
    """`stage: report`: refuse (78) an `inference.output_dir` that is unset, missing, held by a live start or of
    another policy, then rebuild its report from its rollout records."""
    explicit = config.inference.output_dir
    if not explicit:
        raise ConfigError(
            "stage: report rebuilds the report of an existing evaluation: set inference.output_dir to its directory"
        )
    output_dir = Path(os.path.abspath(os.path.expanduser(explicit)))
    if not output_dir.is_dir():
        raise ConfigError(
            f"inference.output_dir: {output_dir} does not exist: there is no evaluation to report on"
        )
    check_output_dir_free(output_dir)
    spec = PolicySpec.of_eval(config)
    refusal = provenance_mismatch(output_dir, spec.provenance())
    if refusal is not None:
        raise ConfigError(refusal)
    return rebuild_report(config, spec, output_dir, say)
