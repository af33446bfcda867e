"""`platoon harbor check CONFIG [k=v ...]`: the dataset check of every Harbor entry of a config (platoon_harbor.check):
a table per entry (task, oracle, noop, seconds, verdict), each quarantined task's reason, and the check file it wrote.

Exit codes: 0 when the check ran (a quarantined task is a result, not an error); 78 for a config problem or a dataset
whose lock or images are not prepared (it names `platoon prepare`); 64 usage.
"""

from __future__ import annotations

import asyncio
from typing import Annotated

import typer

from platoon.console import err, out, table
from platoon.errors import EX_CONFIG, ConfigError

Config = Annotated[str, typer.Argument(metavar="CONFIG", help="A run config.", show_default=False)]
Overrides = Annotated[
    list[str] | None, typer.Argument(metavar="[K=V]...", help="Config overrides.", show_default=False)
]
Concurrency = Annotated[
    int, typer.Option("--concurrency", min=1, help="Tasks checked at once (each runs two sandboxes).")
]


def check(config: Config, overrides: Overrides = None, concurrency: Concurrency = 4) -> int:
    """Run platoon-oracle and platoon-noop on every task of each Harbor entry; quarantine the unsound tasks.

    A task whose oracle does not reach the reward's maximum, or whose noop scores above its minimum, is
    quarantined with its reason in a check file beside the dataset's lock; runs skip it (service_kwargs.harbor_check).
    """
    from platoon.envs.service import EnvNotPrepared
    from platoon.prepare import cache_root_of, entry_label, load_environments, prepare_command
    from platoon_harbor import check as checking
    from platoon_harbor import check_file
    from platoon_harbor.prepare import entry_images, harbor_cache, image_problems

    loaded, entries = load_environments(config, list(overrides or []))
    harbor = [(index, entry) for index, entry in enumerate(entries) if entry.service == "harbor"]
    if not harbor:
        raise ConfigError(f"{config}: names no `service: harbor` entry (nothing to check)")
    for index, entry in harbor:
        where = entry_label(entry, index)
        options = dict(entry.service_kwargs or {})
        cache = harbor_cache(options, cache_root_of(loaded))
        try:
            problems = image_problems(entry_images(options, cache, config=config))
        except EnvNotPrepared as exc:
            problems = [exc.message]
        if problems:
            err(f"{where}: {problems[0]}; prepare it with: {prepare_command(config, overrides or [])}")
            return EX_CONFIG

        def progress(verdict: checking.TaskVerdict, number: int, total: int, where: str = where) -> None:
            err(f"{where} check: {number}/{total} {verdict.task}: {verdict.verdict}")

        verdicts = asyncio.run(checking.check_entry(options, concurrency=concurrency, progress=progress))
        path = check_file.check_path(options, cache, config=config)
        records = {verdict.task: verdict.record() for verdict in verdicts}
        check_file.write_verdicts(path, check_file.dataset_label(options), records)
        rows = [(v.task, v.oracle, v.noop, f"{v.seconds:.1f}", v.verdict) for v in verdicts]
        out(table(("task", "oracle", "noop", "seconds", "verdict"), rows))
        for verdict in verdicts:
            if verdict.reason is not None:
                out(f"quarantined {verdict.task}: {verdict.reason}")
        out(f"{where} check: {check_file.summary(records, path)}")
    return 0
