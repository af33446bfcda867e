"""Wrappers that watch a policy's model calls for run-wide refusals: a Tinker sampler whose key the
service refuses, a hosted server refusing the key or the model. Either stops new rollouts; shared by the
evaluator's in-process gateway and its subprocess slots.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from platoon.errors import ConfigError
from platoon.gateway import tinker_sdk
from platoon.gateway.hosted import HostedRefusal
from platoon.gateway.tinker_service import refused_key_error

__all__ = ["CallWatch", "WatchedHosted", "WatchedSampler"]


@dataclass
class CallWatch:
    """Run-wide problems seen on model calls: a refused Tinker key, a hosted server refusing the key or model.

    Either stops new rollouts; `refusals` counts the refused calls per rollout id.
    """

    key_refusal: ConfigError | None = None
    hosted_refusal: str | None = None
    refusals: dict[str, int] = field(default_factory=dict)

    @property
    def stopped(self) -> bool:
        return self.key_refusal is not None or self.hosted_refusal is not None


class WatchedSampler:
    """A Tinker sampler that notes a refused key (401/403) in the watch before the gateway wraps the error."""

    def __init__(self, sampler: Any, watch: CallWatch, base_url: str | None) -> None:
        self._sampler = sampler
        self._watch = watch
        self._base_url = base_url

    async def sample_async(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return await tinker_sdk.sample(self._sampler, *args, **kwargs)
        except Exception as exc:
            refused = refused_key_error(exc, base_url=self._base_url, what="a sample")
            if refused is not None and self._watch.key_refusal is None:
                self._watch.key_refusal = refused
            raise

    def __getattr__(self, name: str) -> Any:
        return getattr(self._sampler, name)


class WatchedHosted:
    """A hosted gateway backend that notes refusals (401/402/403/404, redirects): they stop the evaluation."""

    def __init__(self, backend: Any, watch: CallWatch) -> None:
        self._backend = backend
        self._watch = watch

    async def chat(self, agent: Any, rollout: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return await self._backend.chat(agent, rollout, *args, **kwargs)
        except HostedRefusal as exc:
            if self._watch.hosted_refusal is None:
                self._watch.hosted_refusal = exc.message
            refusals = self._watch.refusals
            refusals[rollout.rollout_id] = refusals.get(rollout.rollout_id, 0) + 1
            raise

    def __getattr__(self, name: str) -> Any:
        return getattr(self._backend, name)
