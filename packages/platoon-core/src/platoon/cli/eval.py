"""`platoon eval CONFIG [k=v ...] [--prepare]`: evaluate a policy on every task of the
config's split and print the report's summary as JSON on stdout; diagnostics go to stderr.

The start is `platoon.startup.evaluation_start` (its checks, then `platoon.eval.evaluator`); this module only
loads the config and prints.
"""

from __future__ import annotations

from typing import Annotated

import typer

from platoon.cli.output import dump_json, err, out
from platoon.errors import EX_CONFIG

ConfigArg = Annotated[
    str, typer.Argument(metavar="CONFIG", help="The evaluation config file.", show_default=False)
]
Overrides = Annotated[
    list[str] | None, typer.Argument(metavar="[K=V]...", help="k=v overrides.", show_default=False)
]


def eval_(
    config: ConfigArg,
    overrides: Overrides = None,
    prepare: Annotated[
        bool, typer.Option(help="Prepare what the evaluation needs on this site first (platoon prepare).")
    ] = False,
) -> int:
    """Evaluate a policy on every task of a split and write a report."""
    import asyncio
    import contextlib
    import sys

    from platoon.config import load_config
    from platoon.deprecations import deprecation_lines
    from platoon.eval.config_defs import PlatoonEvalConfig
    from platoon.eval.policy import PolicySpec, check_policy_key
    from platoon.startup.evaluation_start import start_evaluation, start_report
    from platoon.startup.preamble import start_run

    loaded = load_config(config, overrides or [], kind="eval")
    resolved = loaded.config
    if not isinstance(resolved, PlatoonEvalConfig):
        err(f"{config}: not an evaluation config (its schema is {loaded.schema_name})")
        return EX_CONFIG
    if resolved.stage == "report":
        for line in deprecation_lines(loaded):
            err(line)
        if prepare:
            err("--prepare is ignored with stage: report (the report is rebuilt from the rollouts on disk)")
        out(dump_json(start_report(resolved, err)["summary"]))
        return 0
    status = start_run(
        loaded,
        config,
        overrides or [],
        say=err,
        prepare=prepare,
        # the key is refused before anything is prepared; without --prepare, `start_evaluation` checks it first thing
        check_key=(lambda: check_policy_key(PolicySpec.of_eval(resolved))) if prepare else None,
    )
    if status != 0:
        return status
    try:
        # Environment code runs in this process: what it prints goes to stderr, so stdout holds the summary only.
        with contextlib.redirect_stdout(sys.stderr):
            result = asyncio.run(start_evaluation(resolved, loaded, say=err))
    except KeyboardInterrupt:
        err("interrupted")
        return 130
    out(dump_json(result))
    return 0
