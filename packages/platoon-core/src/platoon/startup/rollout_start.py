"""The start of `platoon rollout` in this process, in order: the config's kind, the policy (the command line's
replacements applied) and its key, the sample timeout, `evaluation`'s refusals, the renderer and local model the
policy names, a writable run directory no live process holds, then the task itself (an unknown id is refused),
all before anything is written; then `eval.one_task.roll_out`.
"""

from __future__ import annotations

import datetime as _dt
import difflib
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from platoon.errors import ConfigError
from platoon.eval.one_task import WRONG_KIND, RolloutOptions, is_training, policy_of, roll_out, run_dir_for
from platoon.eval.policy import PolicySpec, check_policy_key, sample_timeout_line
from platoon.eval.tasks import resolve_task
from platoon.renderers import renderer_names
from platoon.rollouts.records import writable_dir_problem
from platoon.startup.evaluation import check_output_dir_free, evaluation_problems, local_model_problems

if TYPE_CHECKING:
    from platoon.config.loader import LoadedConfig

__all__ = ["start_adhoc_rollout"]

Say = Callable[[str], None]


def _renderer_problem(spec: PolicySpec) -> str | None:
    if spec.renderer is None or spec.hosted is not None:
        return None
    known = renderer_names()
    if spec.renderer in known:
        return None
    close = difflib.get_close_matches(spec.renderer, known, n=3, cutoff=0.6)
    hint = f" (did you mean {', '.join(close)}?)" if close else ""
    return f"--renderer: unknown renderer {spec.renderer!r}{hint}"


def _local_model_where(options: RolloutOptions, *, training: bool) -> str:
    """The setting a refused local base model is named by: the command line's, else the config's."""
    return "--model" if options.model else ("train.model_name" if training else "inference.model_name")


async def start_adhoc_rollout(
    loaded: LoadedConfig, options: RolloutOptions, *, say: Say, now: _dt.datetime | None = None
) -> tuple[dict[str, Any], Path]:
    """Check, then roll out `options.task`; returns its summary and the run directory."""
    config: Any = loaded.config
    if config is None or loaded.kind not in ("train", "eval"):
        raise ConfigError(WRONG_KIND)
    training = is_training(config)
    split = options.split or ("train" if training else config.split)
    spec = policy_of(config, options)
    check_policy_key(spec)
    line = sample_timeout_line(spec, "train" if training else "inference")
    if line is not None:
        say(line)
    problems = evaluation_problems(config, training=training)
    if (renderer := _renderer_problem(spec)) is not None:
        problems.append(renderer)
    problems += local_model_problems(spec, where=_local_model_where(options, training=training))
    if problems:
        raise ConfigError(problems)
    run_dir = run_dir_for(loaded, options, now=now)
    if (unwritable := writable_dir_problem(run_dir, key="--output-dir")) is not None:
        raise ConfigError(unwritable)
    check_output_dir_free(run_dir, key="--output-dir", way_out="stop that run, or give another --output-dir")
    # The task last, since it may import the environment's SDK; a task the service refuses starts nothing.
    item, service = await resolve_task(config, options.task, base_dir=loaded.path.parent, split=split)
    return await roll_out(loaded, spec=spec, split=split, task=(item, service), run_dir=run_dir, say=say)
