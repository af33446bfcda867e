"""`platoon rollout CONFIG [k=v ...] --task ID [...]`: roll out one task of a training or evaluation
config and print its agent tree (or, with `--json-output`, its summary) on stdout.

The rollout itself is `platoon.eval.one_task`; this module parses the command line and prints.
"""

from __future__ import annotations

from typing import Annotated

import typer

from platoon.cli.output import dump_json, err, out
from platoon.errors import EX_USAGE

ConfigArg = Annotated[
    str, typer.Argument(metavar="CONFIG", help="A training or evaluation config file.", show_default=False)
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
    json_output: Annotated[bool, typer.Option(help="Print the JSON summary instead of the tree.")] = False,
    prepare: Annotated[
        bool, typer.Option(help="Prepare what the rollout needs on this site first (platoon prepare).")
    ] = False,
) -> int:
    """Roll out one task and print its agent tree."""
    import asyncio
    import contextlib
    import sys

    from platoon.cli.config import deprecation_lines
    from platoon.cli.prepare import prepare_first
    from platoon.config import load_config
    from platoon.config.site import describe_site
    from platoon.errors import ConfigError
    from platoon.eval.one_task import WRONG_KIND, RolloutOptions, policy_of, run_adhoc_rollout
    from platoon.eval.tree import rollout_tree
    from platoon.prepare import check_prepared

    if not task:
        err("rollout needs --task ID (ENVIRONMENT::TASK_ID in a mixture)")
        return EX_USAGE
    loaded = load_config(config, overrides or [])
    if loaded.kind not in ("train", "eval") or loaded.config is None:
        raise ConfigError(WRONG_KIND)
    for line in deprecation_lines(loaded):
        err(line)
    for line in describe_site(loaded.site, loaded.site_gave, looked_at=loaded.site_looked_at):
        err(line)
    options = RolloutOptions(
        task=task, split=split, output_dir=output_dir, model=model, model_path=model_path, renderer=renderer
    )
    if prepare:
        from platoon.eval.policy import check_policy_key

        check_policy_key(policy_of(loaded.config, options))  # the key is refused before anything else
        section = "train" if loaded.kind == "train" else "inference"
        passed = [f"{section}.model_name={model}"] if model else []
        passed += [f"{section}.renderer_name={renderer}"] if renderer else []
        if (status := prepare_first(config, [*(overrides or []), *passed])) != 0:
            return status
    # Runs never build or fetch: what the services need must be prepared already (exit 78 naming the command).
    check_prepared(loaded, config, overrides or [])
    try:
        # Environment and harness code run in this process: what they print goes to stderr, so stdout holds the
        # tree (or the JSON summary) alone.
        with contextlib.redirect_stdout(sys.stderr):
            summary, _ = asyncio.run(run_adhoc_rollout(loaded, options, say=err))
    except KeyboardInterrupt:
        err("interrupted")
        return 130
    out(dump_json(summary) if json_output else rollout_tree(summary))
    return 0
