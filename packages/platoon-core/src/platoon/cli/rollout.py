"""`platoon rollout CONFIG [k=v ...] --task ID [...]`: roll out one task of a training or evaluation
config and print its agent tree (or, with `--json-output`, its summary) on stdout.

CONFIG may also be a training run's directory (its `config.resolved.yaml`). A training config whose run has saved
checkpoints samples the newest one (`--base`: the base model). The start is `platoon.startup.rollout_start` (its
checks, then `platoon.eval.one_task`); this module parses the command line, picks the checkpoint and prints.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from platoon.cli.output import dump_json, err, out
from platoon.errors import EX_USAGE

if TYPE_CHECKING:
    from platoon.config.loader import LoadedConfig

ConfigArg = Annotated[
    str,
    typer.Argument(
        metavar="CONFIG",
        help="A training or evaluation config file, or a training run's directory.",
        show_default=False,
    ),
]
Overrides = Annotated[
    list[str] | None, typer.Argument(metavar="[K=V]...", help="k=v overrides.", show_default=False)
]


def rollout(
    config: ConfigArg,
    overrides: Overrides = None,
    task: Annotated[str, typer.Option(help="The task id (ENVIRONMENT::TASK_ID in a mixture).")] = "",
    split: Annotated[
        str | None, typer.Option(help="The split: default train (training configs) or the config's split.")
    ] = None,
    output_dir: Annotated[
        str | None, typer.Option(help="The run directory; default runs/adhoc/<UTC time>-<task>.")
    ] = None,
    model: Annotated[str | None, typer.Option(help="The model to sample instead of the config's.")] = None,
    model_path: Annotated[str | None, typer.Option(help="A tinker:// sampler checkpoint to sample.")] = None,
    renderer: Annotated[str | None, typer.Option(help="The renderer instead of the config's.")] = None,
    base: Annotated[
        bool, typer.Option("--base", help="Sample the base model, not the training run's newest checkpoint.")
    ] = False,
    json_output: Annotated[bool, typer.Option(help="Print the JSON summary instead of the tree.")] = False,
    prepare: Annotated[
        bool, typer.Option(help="Prepare what the rollout needs on this site first (platoon prepare).")
    ] = False,
) -> int:
    """Roll out one task and print its agent tree."""
    import asyncio
    import contextlib
    import dataclasses
    import sys

    from platoon.config import load_config
    from platoon.errors import ConfigError
    from platoon.eval.one_task import WRONG_KIND, RolloutOptions, policy_of
    from platoon.eval.policy import check_policy_key
    from platoon.eval.tree import rollout_tree
    from platoon.startup.preamble import start_run
    from platoon.startup.rollout_start import start_adhoc_rollout

    if not task:
        err("rollout needs --task ID (ENVIRONMENT::TASK_ID in a mixture)")
        return EX_USAGE
    run_dir, config = _run_dir_config(config)
    loaded = load_config(config, overrides or [])
    if loaded.kind not in ("train", "eval") or loaded.config is None:
        raise ConfigError(WRONG_KIND)
    options = RolloutOptions(
        task=task,
        split=split,
        output_dir=output_dir,
        model=model,
        model_path=model_path,
        renderer=renderer,
        base=base,
    )
    section = "train" if loaded.kind == "train" else "inference"
    passed = [f"{section}.model_name={model}"] if model else []
    passed += [f"{section}.renderer_name={renderer}"] if renderer else []
    status = start_run(
        loaded,
        config,
        overrides or [],
        say=err,
        prepare=prepare,
        # the key is refused before anything is prepared; without --prepare, the rollout checks it first thing
        check_key=(lambda: check_policy_key(policy_of(loaded.config, options))) if prepare else None,
        prepare_overrides=passed,
        check_site_provider=False,  # a rollout does not refuse the site's provider up front (train and eval do)
    )
    if status != 0:
        return status
    if loaded.kind == "train" and not (base or model or model_path):
        options = dataclasses.replace(options, model_path=_newest_checkpoint(loaded, run_dir))
    try:
        # Environment and harness code run in this process: what they print goes to stderr, so stdout holds the
        # tree (or the JSON summary) alone.
        with contextlib.redirect_stdout(sys.stderr):
            summary, _ = asyncio.run(start_adhoc_rollout(loaded, options, say=err))
    except KeyboardInterrupt:
        err("interrupted")
        return 130
    out(dump_json(summary) if json_output else rollout_tree(summary))
    return 0


def _run_dir_config(given: str) -> tuple[Path | None, str]:
    """(the run directory CONFIG names, or None for a config file; the config file to load)."""
    from platoon.errors import ConfigError
    from platoon.rollouts.records import RESOLVED_CONFIG_FILE

    path = Path(given).expanduser()
    if not path.is_dir():
        return None, given
    if not (path / RESOLVED_CONFIG_FILE).is_file():
        raise ConfigError(
            f"{given}: a directory without {RESOLVED_CONFIG_FILE}: give a config file, or a run directory that "
            "platoon train wrote"
        )
    return path.absolute(), str(path / RESOLVED_CONFIG_FILE)


def _newest_checkpoint(loaded: LoadedConfig, run_dir: Path | None) -> str | None:
    """The sampler path of the training run's newest checkpoint, said in one line; None (the base model) before
    its first checkpoint, or when its checkpoints are of another model than the config's."""
    from platoon.rollouts.records import read_identity
    from platoon.startup.training import run_dir_of
    from platoon.train.tinker.checkpoints import CheckpointLog

    config: Any = loaded.config  # a training config
    run = run_dir if run_dir is not None else run_dir_of(config)
    if not run.is_dir():
        return None  # no run yet: the base model is the only one there is
    model = config.train.model_name
    identity = read_identity(run)
    if identity is not None and identity.model != model:
        err(f"sampling the base model {model}: the checkpoints of {run} are of {identity.model}")
        return None
    row = CheckpointLog(run).latest_sampler()
    if row is None:
        err(f"sampling the base model {model}: {run} has no checkpoint yet")
        return None
    err(f"sampling checkpoint {row.name} (step {row.batch}) of {run}; pass --base to sample the base model")
    return row.sampler_path
