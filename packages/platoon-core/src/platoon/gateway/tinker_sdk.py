"""The Tinker SDK calls whose form differs across the SDKs platoon supports (`tinker>=0.16.1,<0.39`).

SDK 0.38 made every client method return an awaitable future (client-making ones included) and deprecated the
`_async` methods; before 0.38 the plain client-making and REST methods block until done, and the `_async` ones are
those an event loop awaits. Every other SDK call platoon makes has one form on every SDK in the range (the training
submissions, `forward_backward`, `optim_step`, `save_state`, `save_weights_for_sampler`, return an awaitable
`APIFuture` from the plain method on all of them), so it is called directly.
"""

from __future__ import annotations

import functools
import importlib.metadata
import inspect
import sys
from collections.abc import Awaitable, Callable
from typing import Any

__all__ = [
    "asks_client_config",
    "call",
    "checkpoint_deleter",
    "futures_sdk",
    "installed_release",
    "made",
    "rest_client",
    "sample",
    "sdk_version",
    "service_client",
]

#: the first SDK whose plain methods all return awaitable futures (and whose `_async` methods warn)
FUTURES_SDK = (0, 38)
#: the first SDK that asks the service's `/api/v1/client/config` before its first call, and fails without it
CLIENT_CONFIG_SDK = (0, 25)


def installed_release() -> str | None:
    """The installed Tinker SDK's version string (read from its metadata: nothing is imported), None without one."""
    try:
        return importlib.metadata.version("tinker")
    except importlib.metadata.PackageNotFoundError:
        return None


@functools.cache
def sdk_version() -> tuple[int, ...]:
    """The installed SDK's release as numbers: `0.38.0` -> (0, 38, 0); () without an SDK."""
    numbers = []
    for part in (installed_release() or "").split(".")[:3]:
        digits = "".join(c for c in part if c.isdigit())  # "0rc1" -> 0
        numbers.append(int(digits or 0))
    return tuple(numbers)


def futures_sdk() -> bool:
    """Whether the installed SDK's plain methods return awaitable futures (0.38 and later)."""
    return sdk_version() >= FUTURES_SDK


def asks_client_config() -> bool:
    """Whether the installed SDK asks the service's `/api/v1/client/config` before its first call (0.25 on)."""
    return sdk_version() >= CLIENT_CONFIG_SDK


async def call(client: Any, method: str, *args: Any, **kwargs: Any) -> Any:
    """The result of `client.<method>(...)` for a call that has an `_async` twin before 0.38: the client-making
    calls (`create_lora_training_client`, `create_sampling_client`, ...), `sample`, the REST calls."""
    if futures_sdk():
        return await getattr(client, method)(*args, **kwargs)
    return await getattr(client, f"{method}_async")(*args, **kwargs)


def made(value: Any) -> Any:
    """The client a client-making call returned, for synchronous callers (scripts, tests): 0.38 returns a future of
    it (and deprecates using that future as the client), earlier SDKs the client itself."""
    return value.result() if futures_sdk() else value


async def sample(sampler: Any, *args: Any, **kwargs: Any) -> Any:
    """One `sample` of the SDK's `SamplingClient`, or of a platoon sampler (anything else with `sample_async`:
    the followed, watched and scripted samplers, which hand the call on to an SDK client in turn)."""
    tinker = sys.modules.get("tinker")  # not loaded: no SDK client exists in this process
    if tinker is not None and isinstance(sampler, tinker.SamplingClient):
        return await call(sampler, "sample", *args, **kwargs)
    return await sampler.sample_async(*args, **kwargs)


def service_client(*, api_key: str, base_url: str | None) -> Any:
    """A `tinker.ServiceClient` of `base_url` (None: the SDK's default) with `api_key`; blocks on SDKs that open
    their session here, so an event loop calls it in a thread."""
    import tinker

    kwargs: dict[str, Any] = {"api_key": api_key}
    if base_url is not None:
        kwargs["base_url"] = base_url
    if "default_headers_overrides" not in inspect.signature(tinker.ServiceClient).parameters:
        # 0.16 reads the key header from TINKER_API_KEY, which platoon withholds from its process while harnesses
        # run there, so the header goes in explicitly; later SDKs (0.38) send `api_key` as the header themselves
        # and warn about a `default_headers` argument, which they ignore.
        kwargs["default_headers"] = {"X-API-Key": api_key}
    return tinker.ServiceClient(**kwargs)


def rest_client(service: Any, *, api_key: str, base_url: str | None) -> Any:
    """A REST client of the same service and key as `service`."""
    import tinker

    if futures_sdk():
        # 0.38 deprecates `create_rest_client` for a RestClient of its own, which needs no session.
        kwargs: dict[str, Any] = {"api_key": api_key}
        if base_url is not None:
            kwargs["base_url"] = base_url
        return tinker.RestClient(**kwargs)
    return service.create_rest_client()


def checkpoint_deleter(
    service: Any, *, api_key: str, base_url: str | None
) -> Callable[[str], Awaitable[None]]:
    """`delete(tinker_path)`: the REST delete of one checkpoint; the REST client is made at the first delete."""
    rest: list[Any] = []

    async def delete(path: str) -> None:
        if not rest:
            rest.append(rest_client(service, api_key=api_key, base_url=base_url))
        await call(rest[0], "delete_checkpoint_from_tinker_path", path)

    return delete
