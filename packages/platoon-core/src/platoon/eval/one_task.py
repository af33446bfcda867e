"""`platoon rollout`: one task through its entry's route, on the policy of a training
config (`train.*` on `tinker_base_url`) or an evaluation config (`inference.*` or `inference.hosted`), into an
ad-hoc run directory `<runs>/adhoc/<UTC time>-<slug>` with the resolved config, `lock.json`,
`trajectory_collection.json` and the event file under `rollouts/events/`.

Every refusal (exit 78; 64 for contradictory options), an unknown task id included, comes before the run directory
is written and before the local server starts: `platoon.startup.rollout_start` makes them, then calls `roll_out`.
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

from platoon.config.tinker import check_checkpoint_path
from platoon.config.training import PlatoonTinkerRLTrainerConfig
from platoon.episode.rollout import process_rewards
from platoon.errors import ConfigError, PlatoonError, UsageError
from platoon.eval.components import component_records
from platoon.eval.evaluator import STAMP_FORMAT, fresh_dir, judges_lock
from platoon.eval.policy import TINKER, EarlyLocalServer, PolicySpec, open_policy
from platoon.eval.tasks import entries_by_label
from platoon.eval.tree import rollout_summary
from platoon.rollouts import records
from platoon.rollouts.eval_records import COLLECTION_FILE, write_json
from platoon.rollouts.one_rollout import MemberRequest, run_member
from platoon.trajectory_events import write_events

if TYPE_CHECKING:
    from platoon.config.loader import LoadedConfig
    from platoon.eval.tasks import EvalTask
    from platoon.trajectory import TrajectoryCollection

__all__ = ["RolloutOptions", "is_training", "policy_of", "roll_out", "run_dir_for", "task_slug"]

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
    if options.output_dir:
        return Path(os.path.abspath(os.path.expanduser(options.output_dir)))
    site_runs = loaded.site.runs if loaded.site is not None else None
    runs = Path(site_runs) if site_runs is not None else Path(os.path.abspath("runs"))
    stamp = (now or _dt.datetime.now(_dt.UTC)).strftime(STAMP_FORMAT)
    return fresh_dir(runs / "adhoc", f"{stamp}-{task_slug(options.task)}")


def is_training(config: Any) -> bool:
    """Whether `config` is a training config (its policy is `train.*`), not an evaluation config."""
    return isinstance(config, PlatoonTinkerRLTrainerConfig)


def policy_of(config: Any, options: RolloutOptions) -> PolicySpec:
    """The policy a rollout samples: the training config's `train.*` or the evaluation config's `inference.*`,
    with `--model`, `--model-path` and `--renderer` replacing them (refused where they cannot apply, exit 64)."""
    if is_training(config):
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


def _phase_rollout_config(config: Any, split: str) -> Any:
    """The rollout config of the phase the split belongs to."""
    if not is_training(config):
        return config.inference.workflow.rollout_config
    if split == "train":
        return config.train.workflow_config.rollout_config
    return config.eval.workflow_config.rollout_config


def _write_outputs(run_dir: Path, collection: TrajectoryCollection, task_id: str) -> None:
    write_json(run_dir / COLLECTION_FILE, collection.to_dict())
    try:
        write_events(collection, run_dir / "rollouts", task_id=task_id)
    except OSError as exc:  # the viewer's copy: a failure to write it only warns
        log.warning("writing the event file failed: %s", exc)


async def roll_out(
    loaded: LoadedConfig,
    *,
    spec: PolicySpec,
    split: str,
    task: tuple[EvalTask, Any],
    run_dir: Path,
    say: Say,
) -> tuple[dict[str, Any], Path]:
    """Roll out a checked start's task (its item and service) into `run_dir`; returns its summary and the run
    directory."""
    # Every refusal is behind us: the local server's child starts now, so its start-up (torch, the model) runs
    # while this process writes the run's records and resolves its components; the policy then takes it over.
    server = EarlyLocalServer.for_policy(spec, say=say)
    try:
        return await _roll_out(
            loaded,
            spec=spec,
            split=split,
            task=task,
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
    config: Any = loaded.config
    training = is_training(config)
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
