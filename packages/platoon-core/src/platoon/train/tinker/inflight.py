"""The policy versions a rollout actually sampled under in-flight sampling (`train.sampling_client_kind: inflight`).

Each sample was recorded as a range (the version its client was created at, up to the newest version published
when it completed). Where the service says which weights answered each sequence (platoon's local server, through
its `/api/v1/platoon/sample_versions` route, by the sequence ids it answered), the range narrows to that version;
elsewhere (hosted Tinker does not say) the whole range is kept, so staleness counts from its oldest end.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from platoon.rollouts.inflight import SampledCall
    from platoon.rollouts.one_rollout import MemberOutcome

__all__ = ["settle_versions", "versions_sampled"]

log = logging.getLogger("platoon.train")

#: services known not to say which weights answered (the route is absent): asked no more
_SILENT: set[str] = set()
_LOOKUP_TIMEOUT_SECONDS = 30.0


def versions_sampled(
    calls: Iterable[SampledCall], exact: dict[str, int | None], published: Sequence[int]
) -> list[int]:
    """Every policy version the `calls` ran on, or may have: a sequence whose service version (`exact`, 1 for the
    first in-flight publication of this start) is known counts that publication's policy version (`published`),
    any other sample its whole range."""
    versions: set[int] = set()
    for call in calls:
        known = [exact.get(sequence_id) for sequence_id in call.sequence_ids]
        if known and all(k is not None and 1 <= k <= len(published) for k in known):
            versions.update(published[k - 1] for k in known if k is not None)
        else:
            versions.update(range(call.lowest, call.highest + 1))
    return sorted(versions)


async def _service_versions(base_url: str, api_key: str, sequence_ids: list[str]) -> dict[str, int | None]:
    """The service's weights version of each sequence (one version per sample on the local server); {} when the
    service does not say."""
    if not sequence_ids or base_url in _SILENT:
        return {}
    import httpx

    try:
        async with httpx.AsyncClient(timeout=_LOOKUP_TIMEOUT_SECONDS) as client:
            response = await client.post(
                f"{base_url.rstrip('/')}/api/v1/platoon/sample_versions",
                json={"sequence_ids": sequence_ids},
                headers={"X-API-Key": api_key},
            )
    except httpx.HTTPError as exc:  # the ranges stand: honest, only wider
        log.debug("asking %s which weights sampled failed: %s", base_url, exc)
        return {}
    if response.status_code in (404, 405):
        _SILENT.add(base_url)
        return {}
    if response.status_code != 200:
        return {}
    found = response.json().get("versions") or {}
    return {
        sequence_id: versions[0] if isinstance(versions, list) and len(versions) == 1 else None
        for sequence_id, versions in found.items()
    }


async def settle_versions(
    outcome: MemberOutcome,
    calls: Sequence[SampledCall],
    published: Sequence[int],
    *,
    base_url: str | None,
    api_key: str,
) -> None:
    """Set the member's `versions` (what its samples ran on) and `version` (the oldest of them, its staleness and
    the datums' `checkpoint_version`); a member that sampled nothing keeps the version it started at."""
    if not calls:
        outcome.versions = (outcome.version,)
        return
    ids = [sequence_id for call in calls for sequence_id in call.sequence_ids]
    exact = await _service_versions(base_url, api_key, ids) if base_url is not None else {}
    versions = versions_sampled(calls, exact, published)
    outcome.versions = tuple(versions)
    outcome.version = versions[0]
    outcome.sampled = tuple(calls)
