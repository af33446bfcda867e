"""The host variables an agent's commands may keep: the one list, for every place that starts them.

A process sandbox's commands and a locally placed harness start from these and nothing else of the host's
environment, so API keys, tokens and `DOCKER_HOST` stay with platoon; the caller adds the sandbox's own variables
and platoon's routes and markers. Container providers (docker, singularity, enroot) take none of the host's: their
commands start from the image's environment.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

__all__ = ["HOST_ENV_ALLOWLIST", "allowed_host_env"]

#: Where programs are, who and where the user is, how text and time read, and where the CA certificates are: none of
#: it a secret, all of it what ordinary tools look for.
HOST_ENV_ALLOWLIST = (
    "PATH",
    "HOME",
    "USER",
    "LOGNAME",
    "SHELL",
    "LANG",
    "LANGUAGE",
    "LC_ALL",
    "LC_CTYPE",
    "TZ",
    "TERM",
    "SSL_CERT_FILE",
    "SSL_CERT_DIR",
    "REQUESTS_CA_BUNDLE",
)


def allowed_host_env(environ: Mapping[str, str] | None = None, extra: tuple[str, ...] = ()) -> dict[str, str]:
    """The allowlisted variables (and `extra` names) that `environ` (default: this process's) sets."""
    source = os.environ if environ is None else environ
    return {name: source[name] for name in (*HOST_ENV_ALLOWLIST, *extra) if name in source}
