"""`platoon rollout`: one task through its entry's route, on the policy of a training
config (`train.*` on `tinker_base_url`) or an evaluation config (`inference.*` or `inference.hosted`), into an
ad-hoc run directory `<runs>/adhoc/<UTC time>-<slug>` with the resolved config, `lock.json`,
`trajectory_collection.json` and the event file under `rollouts/events/`.

Every refusal (exit 78; 64 for contradictory options), an unknown task id included, comes before the run directory
is written and before the local server starts.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import logging
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from platoon.errors import ConfigError, PlatoonError, UsageError

if TYPE_CHECKING:
    from platoon.config.loader import LoadedConfig
    from platoon.eval.policy import EarlyLocalServer, PolicySpec
    from platoon.eval.tasks import EvalTask
    from platoon.trajectory import TrajectoryCollection

__all__ = ["RolloutOptions", "policy_of", "run_adhoc_rollout", "run_dir_for"]

log = logging.getLogger("platoon.eval")

WRONG_KIND = "rollout needs a training config (train:) or an evaluation config (inference:)"
SLUG_LIMIT = 60
FALLBACK_SLUG = "task"
_SLUG_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")
ROLLOUT_LABEL = "rollout"

Say = Callable[[str], None]


@dataclasses.dataclass(frozen=True)
class RolloutOptions:
    """The command line's choices: the task, split, run directory and policy replacements."""

    task: str
    split: str | None = None
    output_dir: str | None = None
    model: str | None = None
    model_path: str | None = None
    renderer: str | None = None
    #: sample the base model: no checkpoint, neither the run's newest nor the config's `model_path`
    base: bool = False


def task_slug(task_id: str) -> str:
    """The run dir's slug: runs outside `[A-Za-z0-9._-]` as `-`, stripped of `-`, the last 60 kept."""
    slug = _SLUG_UNSAFE.sub("-", task_id).strip("-")
    slug = slug[-SLUG_LIMIT:].strip("-")
    return slug or FALLBACK_SLUG


def run_dir_for(loaded: LoadedConfig, options: RolloutOptions, *, now: _dt.datetime | None = None) -> Path:
    """`--output-dir`, else `<runs>/adhoc/<UTC YYYYMMDDTHHMMSSZ>-<slug>` (`-2`, `-3` on collision), `<runs>` the
    site profile's runs, else `./runs`."""
    from platoon.eval.evaluator import STAMP_FORMAT, fresh_dir

    if options.output_dir:
        return Path(os.path.abspath(os.path.expanduser(options.output_dir)))
    site_runs = loaded.site.runs if loaded.site is not None else None
    runs = Path(site_runs) if site_runs is not None else Path(os.path.abspath("runs"))
    stamp = (now or _dt.datetime.now(_dt.UTC)).strftime(STAMP_FORMAT)
    return fresh_dir(runs / "adhoc", f"{stamp}-{task_slug(options.task)}")


def _is_training(config: Any) -> bool:
    from platoon.config.training import PlatoonTinkerRLTrainerConfig

    return isinstance(config, PlatoonTinkerRLTrainerConfig)


def policy_of(config: Any, options: RolloutOptions) -> PolicySpec:
    """The policy a rollout samples: the training config's `train.*` or the evaluation config's `inference.*`,
    with `--model`, `--model-path` and `--renderer` replacing them (refused where they cannot apply, exit 64)."""
    from platoon.eval.policy import TINKER, PolicySpec

    if _is_training(config):
        spec = PolicySpec.of_training(config)
    else:
        spec = PolicySpec.of_eval(config)
        if spec.hosted is not None:
            given = [
                flag
                for flag, value in (
                    ("--renderer", options.renderer),
                    ("--model-path", options.model_path),
                    ("--base", options.base),
                )
                if value
            ]
            if given:
                raise UsageError(
                    f"{' and '.join(given)} do not apply to a hosted model (inference.hosted is set): its server "
                    "renders and samples; --model replaces the served model"
                )
    if options.base and options.model_path:
        raise UsageError("--base samples the base model and --model-path a checkpoint: give one of them")
    if options.model_path:
        from platoon.config.tinker import check_checkpoint_path

        try:
            check_checkpoint_path(options.model_path)
        except ValueError as exc:
            raise UsageError(f"--model-path: {exc}") from None
    renderer = options.renderer or spec.renderer
    if renderer is None and spec.hosted is None and options.model_path:
        raise UsageError(
            "--model-path is a Tinker policy setting, and without a renderer no Tinker policy is served: give "
            "--renderer (or set inference.renderer_name)"
        )
    backend = spec.backend if spec.hosted is not None else (TINKER if renderer is not None else None)
    return dataclasses.replace(
        spec,
        backend=backend,
        model=options.model or spec.model,
        model_path=None if options.base else options.model_path or spec.model_path,
        renderer=renderer,
    )


def _renderer_problem(spec: PolicySpec) -> str | None:
    import difflib

    from platoon.renderers import renderer_names

    if spec.renderer is None or spec.hosted is not None:
        return None
    known = renderer_names()
    if spec.renderer in known:
        return None
    close = difflib.get_close_matches(spec.renderer, known, n=3, cutoff=0.6)
    hint = f" (did you mean {', '.join(close)}?)" if close else ""
    return f"--renderer: unknown renderer {spec.renderer!r}{hint}"


def _local_model_problem(spec: PolicySpec, options: RolloutOptions, *, training: bool) -> str | None:
    """A base model the local server (when the policy samples it) cannot serve: refused before it starts."""
    from platoon.eval.policy import TINKER
    from platoon.gateway.tinker_service import uses_local_server
    from platoon.startup.tinker import local_model_problem

    if spec.backend != TINKER or not uses_local_server(spec.base_url):
        return None
    where = "--model" if options.model else ("train.model_name" if training else "inference.model_name")
    return local_model_problem(spec.model, where=where)


def _phase_rollout_config(config: Any, split: str) -> Any:
    """The rollout config of the phase the split belongs to."""
    if not _is_training(config):
        return config.inference.workflow.rollout_config
    if split == "train":
        return config.train.workflow_config.rollout_config
    return config.eval.workflow_config.rollout_config


def _write_outputs(run_dir: Path, collection: TrajectoryCollection, task_id: str) -> None:
    from platoon.rollouts.eval_records import COLLECTION_FILE, write_json
    from platoon.trajectory_events import write_events

    write_json(run_dir / COLLECTION_FILE, collection.to_dict())
    try:
        write_events(collection, run_dir / "rollouts", task_id=task_id)
    except OSError as exc:  # the viewer's copy: a failure to write it only warns
        log.warning("writing the event file failed: %s", exc)


async def run_adhoc_rollout(
    loaded: LoadedConfig, options: RolloutOptions, *, say: Say, now: _dt.datetime | None = None
) -> tuple[dict[str, Any], Path]:
    """Roll out `options.task` and return its summary and the run directory."""
    from platoon.eval.evaluator import check_output_dir_free
    from platoon.eval.policy import EarlyLocalServer, check_policy_key, sample_timeout_line
    from platoon.eval.tasks import resolve_task
    from platoon.rollouts import records
    from platoon.startup.evaluation import evaluation_problems

    config: Any = loaded.config
    if config is None or loaded.kind not in ("train", "eval"):
        raise ConfigError(WRONG_KIND)
    training = _is_training(config)
    split = options.split or ("train" if training else config.split)
    spec = policy_of(config, options)
    check_policy_key(spec)
    line = sample_timeout_line(spec, "train" if training else "inference")
    if line is not None:
        say(line)
    problems = evaluation_problems(config, training=training)
    for problem in (_renderer_problem(spec), _local_model_problem(spec, options, training=training)):
        if problem is not None:
            problems.append(problem)
    if problems:
        raise ConfigError(problems)
    run_dir = run_dir_for(loaded, options, now=now)
    if (unwritable := records.writable_dir_problem(run_dir, key="--output-dir")) is not None:
        raise ConfigError(unwritable)
    check_output_dir_free(run_dir, key="--output-dir", way_out="stop that run, or give another --output-dir")
    # The task last, since it may import the environment's SDK; a task the service refuses starts nothing.
    item, service = await resolve_task(config, options.task, base_dir=loaded.path.parent, split=split)
    # Every refusal is behind us: the local server's child starts now, so its start-up (torch, the model) runs
    # while this process writes the run's records and resolves its components; the policy then takes it over.
    server = EarlyLocalServer.for_policy(spec, say=say)
    try:
        return await _roll_out(
            loaded,
            spec=spec,
            split=split,
            task=(item, service),
            run_dir=run_dir,
            server=server,
            say=say,
        )
    finally:
        if server is not None:
            await server.stop()


async def _roll_out(
    loaded: LoadedConfig,
    *,
    spec: PolicySpec,
    split: str,
    task: tuple[EvalTask, Any],
    run_dir: Path,
    server: EarlyLocalServer | None,
    say: Say,
) -> tuple[dict[str, Any], Path]:
    from platoon.episode.rollout import process_rewards
    from platoon.eval.components import component_records
    from platoon.eval.evaluator import judges_lock
    from platoon.eval.policy import open_policy
    from platoon.eval.tasks import entries_by_label
    from platoon.eval.tree import rollout_summary
    from platoon.rollouts import records
    from platoon.rollouts.one_rollout import MemberRequest, run_member

    config: Any = loaded.config
    training = _is_training(config)
    item, service = task
    entry = entries_by_label(config)[item.label][1]
    rollout_config = _phase_rollout_config(config, split).model_copy(
        update={
            "model_name": spec.model,
            "return_dict": True,
            "train": False,
            "judges": spec.judges,
            "output_dir": str(run_dir / "rollouts"),
        }
    )
    run_dir.mkdir(parents=True, exist_ok=True)
    say(f"rolling out {item.task_id} (split {split}) into {run_dir}")
    records.hold_run_dir(run_dir, label=ROLLOUT_LABEL)
    try:
        records.write_resolved_config(run_dir, loaded)
        records.write_lock(run_dir, loaded, component_records(config, split=split))
        if not training:
            records.update_lock(run_dir, judges=judges_lock(config))
        else:
            records.update_lock(run_dir, judges={"enabled": True})
        async with open_policy(
            spec, rollout_config=rollout_config, entries=config.environments, say=say, local_server=server
        ) as policy:
            fields: dict[str, Any] = {"policy": spec.lock_record(probe=policy.probe)}
            parsing = policy.tool_call_parsing()
            if parsing is not None:
                fields["tool_call_parsing"] = parsing
            records.update_lock(run_dir, **fields)
            request = MemberRequest(
                task=item.task,
                task_id=item.task_id,
                label=item.label,
                entry=entry,
                split=split,
                rollout_number=0,
                rollout_config=rollout_config,
            )
            outcome = await run_member(request, service=service, gateway=policy.gateway, version=lambda: 0)
            if policy.watch.key_refusal is not None:
                raise policy.watch.key_refusal
            if policy.watch.hosted_refusal is not None:
                raise ConfigError(policy.watch.hosted_refusal)
        collection = outcome.collection
        if collection is None or collection.root is None:
            raise PlatoonError(
                f"the rollout of {item.task_id} produced no trajectories: {outcome.error or outcome.disposition}"
            )
        _write_outputs(run_dir, collection, item.task_id)
        # The entry's reward processor scores the rollout as training would (after its files are written, so a
        # processor that raises leaves the trajectories to look at).
        processor = entry.reward_processor or collection.root.misc.get("reward_processor")
        scores = process_rewards(str(processor), collection) if processor else None
        return rollout_summary(collection, item.task_id, scores), run_dir
    finally:
        held = records.read_process(run_dir)
        if held is not None and held.pid == os.getpid():
            (run_dir / records.PROCESS_FILE).unlink(missing_ok=True)
