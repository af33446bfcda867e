"""The Tinker service as the policy's backend, for training and evaluation alike: the `TINKER_API_KEY` check
(missing, malformed and refused keys are one-line configuration errors, exit 78, that
never echo the key; the local Tinker-compatible server started for a command issues that command's key itself),
keeping the key out of the environment harness code sees, and closing an SDK session.

The Tinker SDK is never imported here: a refused key is recognised by the shape of the SDK's status error.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
from collections.abc import Iterator, Mapping
from typing import Any
from urllib.parse import urlsplit

from platoon.errors import ConfigError
from platoon.gateway.tinker_sdk import CLIENT_CONFIG_SDK, installed_release

__all__ = [
    "KEY_PREFIX",
    "KEY_VARIABLE",
    "LOCAL_BASE_URL",
    "TinkerKeyError",
    "check_tinker_key",
    "close_session",
    "missing_client_config_error",
    "refused_key_error",
    "uses_local_server",
    "withheld_from_environment",
]

KEY_VARIABLE = "TINKER_API_KEY"
BASE_URL_VARIABLE = "TINKER_BASE_URL"
KEY_PREFIX = "tml-"
LOCAL_BASE_URL = "local"
MISSING = (
    f"{KEY_VARIABLE} is not set: the policy is sampled through Tinker, which needs it; for the embedded local "
    f"server, which needs none, set {BASE_URL_VARIABLE}=local (or tinker_base_url: local in the config)"
)
MALFORMED = f"{KEY_VARIABLE} must start with {KEY_PREFIX}, as the Tinker client requires"
REFUSED_CODES = (401, 403)
#: the route SDKs from 0.25 on ask before their first call (feature flags); servers such as skyrl-tx 0.3.0 lack it
CLIENT_CONFIG_PATH = "/api/v1/client/config"
DETAIL_LIMIT = 300
_KEYLIKE = re.compile(r"tml-[A-Za-z0-9._~+/=-]*")


class TinkerKeyError(ConfigError):
    """A missing, malformed or refused `TINKER_API_KEY`: one line, without the `invalid config:` header."""

    def __init__(self, message: str) -> None:
        super().__init__([message])


def uses_local_server(base_url: str | None, env: Mapping[str, str] | None = None) -> bool:
    """Whether the run talks to the local server: `tinker_base_url: local`, or unset and `TINKER_BASE_URL=local`."""
    environ = os.environ if env is None else env
    chosen = base_url if base_url is not None else environ.get(BASE_URL_VARIABLE) or None
    return chosen == LOCAL_BASE_URL


def check_tinker_key(base_url: str | None, env: Mapping[str, str] | None = None) -> str | None:
    """The key to hand the Tinker client, or TinkerKeyError (exit 78) when it is missing or malformed.

    `base_url` is the config's `tinker_base_url` (None: `$TINKER_BASE_URL` decides). None for the local server:
    the server a command starts issues that command's key, takes no other, and `TINKER_API_KEY` is not read.
    """
    environ = os.environ if env is None else env
    if uses_local_server(base_url, environ):
        return None
    key = environ.get(KEY_VARIABLE, "")
    if not key:
        raise TinkerKeyError(MISSING)
    if not key.startswith(KEY_PREFIX):
        raise TinkerKeyError(MALFORMED)
    return key


def _origin(url: Any) -> str | None:
    # Only scheme://host[:port]: credentials, paths, queries and fragments of a URL are never repeated.
    try:
        parts = urlsplit(str(url))
        host = parts.hostname
        port = parts.port
    except ValueError:
        return None
    if not parts.scheme or not host:
        return None
    host = f"[{host}]" if ":" in host else host
    return f"{parts.scheme}://{host}" + (f":{port}" if port else "")


def _status_error(exc: BaseException) -> BaseException | None:
    """The 401/403 status error: `exc` itself or (for futures' ValueError) a cause or context along its chain."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        status = getattr(current, "status_code", None)
        if isinstance(status, int) and status in REFUSED_CODES:
            return current
        current = current.__cause__ or current.__context__
    return None


def _detail(error: BaseException) -> str:
    body = getattr(error, "body", None)
    response = getattr(error, "response", None)
    if body is None and response is not None:
        try:
            body = response.json()
        except Exception:  # any unparsable body falls back to the text
            body = getattr(response, "text", None)
    if isinstance(body, (bytes, str)):
        try:
            body = json.loads(body)
        except ValueError:
            pass
    found: Any = None
    if isinstance(body, Mapping):
        for key in ("detail", "error", "message"):
            value = body.get(key)
            if isinstance(value, Mapping) and isinstance(value.get("message"), str):
                value = value["message"]
            if value:
                found = value
                break
    elif body:
        found = body
    if found is None:
        found = getattr(response, "text", None) or getattr(error, "message", None) or str(error)
    text = found if isinstance(found, str) else json.dumps(found, default=str)
    return text


def _redact(text: str, env: Mapping[str, str]) -> str:
    key = env.get(KEY_VARIABLE, "")
    if key:
        text = text.replace(key, KEY_VARIABLE)
    return _KEYLIKE.sub(KEY_VARIABLE, text)


def refused_key_error(
    exc: BaseException,
    *,
    base_url: str | None = None,
    what: str | None = None,
    env: Mapping[str, str] | None = None,
) -> TinkerKeyError | None:
    """The one-line error for a Tinker 401/403 (directly or as the cause of a future's ValueError), else None.

    `what` names the call ("a sampling client"); `base_url` is the service URL when the error carries none.
    """
    error = _status_error(exc)
    if error is None:
        return None
    environ = os.environ if env is None else env
    status = getattr(error, "status_code", 0)
    request = getattr(error, "request", None) or getattr(getattr(error, "response", None), "request", None)
    origin = _origin(getattr(request, "url", None)) if request is not None else None
    if origin is None and base_url is not None and base_url != LOCAL_BASE_URL:
        origin = _origin(base_url)
    detail = " ".join(_redact(_detail(error), environ).split())
    if len(detail) > DETAIL_LIMIT:
        detail = detail[: DETAIL_LIMIT - 3] + "..."
    where = f"the Tinker service at {origin}" if origin else "the Tinker service"
    asked = f" when asked for {what}" if what else ""
    return TinkerKeyError(
        f"{where} refused {KEY_VARIABLE}{asked} (HTTP {status}: {detail}): "
        f"set {KEY_VARIABLE} to a key that service accepts"
    )


def missing_client_config_error(exc: BaseException, *, base_url: str | None = None) -> ConfigError | None:
    """The one-line refusal (exit 78) for a service that answered the SDK's client-config request 404 (`exc` or a
    cause along its chain), else None: the SDK raises its bare `NotFoundError` there, before any other call."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        url = getattr(getattr(current, "request", None), "url", None)
        if getattr(current, "status_code", None) == 404 and str(getattr(url, "path", "")).endswith(
            CLIENT_CONFIG_PATH
        ):
            origin = _origin(url) or (_origin(base_url) if base_url else None)
            break
        current = current.__cause__ or current.__context__
    else:
        return None
    where = f"the Tinker service at {origin}" if origin else "the Tinker service"
    first = ".".join(str(part) for part in CLIENT_CONFIG_SDK)
    return ConfigError(
        f"{where} does not answer {CLIENT_CONFIG_PATH}, which Tinker SDKs from {first} on need (tinker "
        f"{installed_release()} is installed): for this server install tinker<{first}, e.g. uv add "
        f"'tinker>=0.16.1,<{first}'"
    )


@contextlib.contextmanager
def withheld_from_environment(names: tuple[str, ...]) -> Iterator[None]:
    """`names` removed from `os.environ` for the block, put back after it (a caller's process keeps its own).

    Function harnesses run in the process that opened the policy, and any process they start inherits its
    environment, so the keys the run already read must not be there while rollouts run.
    """
    saved = {name: os.environ.pop(name) for name in names if name in os.environ}
    try:
        yield
    finally:
        for name, value in saved.items():
            os.environ.setdefault(name, value)


def close_session(client: Any) -> None:
    """Stop the heartbeats of a Tinker client's session (a `ServiceClient` or a client it made).

    The SDK heartbeats a session until the process exits unless told otherwise; a command or a start that is done
    with the service (the local server may already be gone) has nothing to keep alive.
    """
    attributes = getattr(client, "__dict__", None) or {}
    # The client's own holder of its session; SDK 0.38's ServiceClient keeps it as `_session_holder`, made on first
    # use, and its `holder` property would open a session (asking the service) only for this to close it.
    holder = attributes["holder"] if "holder" in attributes else attributes.get("_session_holder")
    close = getattr(holder, "close", None)
    if callable(close):
        with contextlib.suppress(Exception):
            close()
