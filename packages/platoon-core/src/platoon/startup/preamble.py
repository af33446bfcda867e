"""The preamble `platoon train`, `eval` and `rollout` run between loading their config and starting: what the
config and site profile have to say, then the refusals that come before anything is prepared or written, then
`--prepare` and the prepared check. `config validate` reports the same lines and refusals.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from platoon.config.site import describe_site
from platoon.deprecations import deprecation_lines
from platoon.errors import ConfigError
from platoon.sandbox_runs import site_provider_problem
from platoon.startup.prepare import check_prepared, run_prepare

if TYPE_CHECKING:
    from platoon.config.loader import LoadedConfig

__all__ = ["deprecation_lines", "start_run"]


def start_run(
    loaded: LoadedConfig,
    config: str,
    overrides: Sequence[str],
    *,
    say: Callable[[str], None],
    prepare: bool,
    check_key: Callable[[], object] | None = None,
    prepare_overrides: Sequence[str] = (),
    check_site_provider: bool = True,
) -> int:
    """Say the config's deprecations and the site profile's lines; refuse (78) a site's sandbox provider that no
    installed distribution provides, then what `check_key` refuses (the policy's key, before anything is
    prepared); with `prepare`, run `platoon prepare` first (`prepare_overrides` added to the config's), its lines
    said; then refuse (`NotPrepared`, 78) what the services need and is not prepared, since a run never builds or
    fetches. Returns 0 when the run may start, else prepare's status."""
    for line in deprecation_lines(loaded):
        say(line)
    for line in describe_site(loaded.site, loaded.site_gave, looked_at=loaded.site_looked_at):
        say(line)
    if check_site_provider and (unavailable := site_provider_problem(loaded.site)) is not None:
        raise ConfigError(unavailable)
    if check_key is not None:
        check_key()
    if prepare and (status := run_prepare(config, [*overrides, *prepare_overrides], out=say, err=say)) != 0:
        return status
    check_prepared(loaded, config, overrides)
    return 0
