"""The policy `platoon eval` and `platoon rollout` sample: a Tinker sampler (a base model or a
`tinker://` checkpoint, on the configured service or the local server), a hosted model, or none; how it is named
in run directories, provenance records and `lock.json`; and opening the gateway its rollouts call.

Tinker, the renderers and the local server are imported only when a policy is opened.
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from platoon.errors import ConfigError, PlatoonError
from platoon.gateway import tinker_sdk
from platoon.gateway.core import ModelGateway, sample_timeout_with_source
from platoon.gateway.default import default_policy
from platoon.gateway.hosted import hosted_gateway
from platoon.gateway.tinker_service import (
    KEY_VARIABLE,
    check_tinker_key,
    close_session,
    missing_client_config_error,
    refused_key_error,
    uses_local_server,
    withheld_from_environment,
)
from platoon.gateway.watch import CallWatch, WatchedHosted, WatchedSampler
from platoon.local_server.engines import DEFAULT_ENGINE
from platoon.local_server.process import start_local_server_process
from platoon.renderers import get_renderer, get_tokenizer
from platoon.rollouts.records import tool_call_parsing_record

if TYPE_CHECKING:
    from platoon.config.training import PlatoonTinkerRLTrainerConfig
    from platoon.eval.config_defs import HostedConfig, PlatoonEvalConfig
    from platoon.gateway.core import ModelGateway

__all__ = [
    "CallWatch",
    "EarlyLocalServer",
    "OpenPolicy",
    "PolicySpec",
    "base_url_origin",
    "check_policy_key",
    "open_policy",
    "policy_slug",
]

TINKER = "tinker"
HOSTED = "hosted"
#: what a policy is called in a run directory when its name has no usable character
FALLBACK_SLUG = "policy"
SLUG_LIMIT = 100
_SLUG_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")
#: function harnesses call the model through `ctx.chat`, which a hosted gateway sends as Chat Completions
FUNCTION_HARNESS_DIALECT = "openai_chat"


def policy_slug(model_path: str | None, model_name: str) -> str:
    """`<policy>` of `runs/eval/<policy>/...`: the checkpoint path without its scheme, else the model
    name; runs of characters outside `[A-Za-z0-9._-]` become `-`, trimmed of `-` and `.`, the last 100 kept."""
    text = model_path.split("://", 1)[-1] if model_path else model_name
    slug = _SLUG_UNSAFE.sub("-", text).strip("-.")
    slug = slug[-SLUG_LIMIT:].strip("-.") if len(slug) > SLUG_LIMIT else slug
    return slug or FALLBACK_SLUG


def base_url_origin(url: str | None) -> str | None:
    """`scheme://host[:port]` of a URL (never its credentials, path or query); `local` stays `local`."""
    if url is None or url == "local":
        return url
    try:
        parts = urlsplit(url)
        host, port = parts.hostname, parts.port
    except ValueError:
        return None
    if not parts.scheme or not host:
        return None
    host = f"[{host}]" if ":" in host else host
    return f"{parts.scheme}://{host}" + (f":{port}" if port else "")


@dataclass(frozen=True)
class PolicySpec:
    """What is sampled: `backend` `tinker`, `hosted` or None (no policy), the model and its settings.

    `base_url` is the config's `tinker_base_url` (None: `$TINKER_BASE_URL` decides).
    """

    backend: str | None
    model: str
    model_path: str | None = None
    renderer: str | None = None
    renderer_kwargs: Mapping[str, Any] = field(default_factory=dict)
    context_window_length: int | None = None
    sample_timeout_seconds: float | None = None
    base_url: str | None = None
    hosted: HostedConfig | None = None
    judges: bool = True
    #: the engine of the local server `base_url: local` starts (`local_server.engine`)
    local_engine: str = DEFAULT_ENGINE

    @classmethod
    def of_eval(cls, config: PlatoonEvalConfig) -> PolicySpec:
        inference = config.inference
        if inference.hosted is not None:
            backend: str | None = HOSTED
        else:
            backend = TINKER if inference.renderer_name is not None else None
        return cls(
            backend=backend,
            model=inference.model_name,
            model_path=inference.model_path,
            renderer=inference.renderer_name,
            renderer_kwargs=dict(inference.renderer_kwargs),
            context_window_length=inference.context_window_length,
            sample_timeout_seconds=inference.sample_timeout_seconds,
            base_url=config.tinker_base_url,
            hosted=inference.hosted,
            judges=inference.judges,
            local_engine=config.local_server.engine,
        )

    @classmethod
    def of_training(cls, config: PlatoonTinkerRLTrainerConfig) -> PolicySpec:
        train = config.train
        return cls(
            backend=TINKER,
            model=train.model_name,
            renderer=train.renderer_name,
            renderer_kwargs=dict(train.renderer_kwargs),
            context_window_length=train.context_window_length,
            sample_timeout_seconds=train.sample_timeout_seconds,
            base_url=config.tinker_base_url,
            local_engine=config.local_server.engine,
        )

    @property
    def slug(self) -> str:
        return policy_slug(self.model_path, self.model)

    def tinker_base_url(self, environ: Mapping[str, str] | None = None) -> str | None:
        """The Tinker service this policy samples: the config's, else `$TINKER_BASE_URL`, else hosted Tinker."""
        env = os.environ if environ is None else environ
        return self.base_url if self.base_url is not None else env.get("TINKER_BASE_URL") or None

    def provenance(self) -> dict[str, Any]:
        """What each rollout records of the policy that made it."""
        if self.backend == TINKER:
            return {
                "judges": self.judges,
                "backend": TINKER,
                "model": self.model,
                "model_path": self.model_path,
                "renderer": self.renderer,
            }
        if self.backend == HOSTED:
            assert self.hosted is not None
            return {
                "judges": self.judges,
                "backend": HOSTED,
                "model": self.model,
                "base_url_origin": base_url_origin(self.hosted.base_url),
            }
        return {"judges": self.judges, "backend": None}

    def lock_record(self, *, probe: Mapping[str, Any] | None = None) -> dict[str, Any] | None:
        """`lock.json.policy`; None without a policy."""
        if self.backend == TINKER:
            return {
                "backend": TINKER,
                "model": self.model,
                "model_path": self.model_path,
                "renderer": self.renderer,
                "base_url_origin": base_url_origin(self.tinker_base_url()),
            }
        if self.backend == HOSTED:
            assert self.hosted is not None
            return {
                "backend": HOSTED,
                "model": self.model,
                "base_url_origin": base_url_origin(self.hosted.base_url),
                "api_key_env": self.hosted.api_key_env,
                "max_concurrent_requests": self.hosted.max_concurrent_requests,
                "probe": dict(probe) if probe is not None else None,
            }
        return None

    def model_record(self) -> dict[str, Any]:
        """The report's `model` section, before the served models are known."""
        origin = (
            base_url_origin(self.hosted.base_url)
            if self.hosted is not None
            else base_url_origin(self.tinker_base_url())
            if self.backend == TINKER
            else None
        )
        return {
            "model_name": self.model,
            "model_path": self.model_path,
            "renderer_name": self.renderer,
            "backend": self.backend,
            "base_url_origin": origin,
        }


def check_policy_key(
    spec: PolicySpec, environ: Mapping[str, str] | None = None, *, in_process: bool = True
) -> None:
    """The key check before anything is prepared or written: the Tinker key (unless the local server or a policy
    served in process answers), or the hosted key variable set. Raises a one-line ConfigError (exit 78).

    `in_process` False: the rollouts run in subprocess slots, which a policy served in this process never reaches,
    so the Tinker key is checked whatever is served."""
    env = os.environ if environ is None else environ
    if spec.backend == HOSTED:
        assert spec.hosted is not None
        name = spec.hosted.api_key_env
        if name is not None and not env.get(name, "").strip():
            raise ConfigError(
                f"inference.hosted.api_key_env names {name}, which is not set: set it to the hosted server's key "
                "(or api_key_env: null for a server without auth)"
            )
        return
    if spec.backend == TINKER and (default_policy() is None or not in_process):
        check_tinker_key(spec.base_url, env)


def sample_timeout_line(spec: PolicySpec, section: str) -> str | None:
    """The stderr line naming the sample timeout in force; a bad environment value is a 78."""
    if spec.backend != TINKER:
        return None

    try:
        seconds, source = sample_timeout_with_source(
            spec.sample_timeout_seconds, f"{section}.sample_timeout_seconds"
        )
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    return f"sample timeout {seconds:g} s ({source})"


# ---------------------------------------------------------------------------------------------------------------
# Watching calls for run-wide problems


@dataclass
class OpenPolicy:
    """An opened policy: the gateway every rollout calls, the renderer (None for hosted), what the probe found."""

    spec: PolicySpec
    gateway: ModelGateway
    watch: CallWatch
    renderer: Any = None
    probe: dict[str, Any] | None = None
    #: the Tinker sampling client itself (subprocess slots sample it from their own processes)
    sampler: Any = None
    #: the Tinker service the sampler talks to (for refusal messages in slots)
    base_url: str | None = None
    #: the hosted key, read once when the policy opened (subprocess slots receive it over their socket)
    hosted_key: str | None = field(default=None, repr=False)

    def tool_call_parsing(self) -> dict[str, Any] | None:
        """`lock.json.tool_call_parsing` of a Tinker policy: the chat-template renderer's parser choice, else the
        named renderer parsing its own format."""
        if self.spec.backend != TINKER or self.renderer is None:
            return None

        return tool_call_parsing_record(self.spec.model, str(self.spec.renderer), self.renderer)


def key_variables(spec: PolicySpec) -> tuple[str, ...]:
    """The variables holding the policy's keys: withheld from harness code while the policy is open."""
    if spec.backend == HOSTED:
        assert spec.hosted is not None
        return (spec.hosted.api_key_env,) if spec.hosted.api_key_env else ()
    return (KEY_VARIABLE,) if spec.backend == TINKER else ()


def _dialects(entries: Any) -> list[str]:
    # TOML-spec harnesses (each with its own dialect) arrive with the spec runner; function harnesses chat.
    return [FUNCTION_HARNESS_DIALECT] if entries else []


class EarlyLocalServer:
    """The local server's child started ahead of the policy that samples it, so its start-up (importing torch,
    loading the model) runs while this process does its own (writing the run's records, resolving components).

    `open_policy(local_server=...)` takes its base URL and key and stops it when the policy closes; `stop()` is idempotent,
    so whoever started it stops it again on the way out of a start that failed before the policy opened.
    """

    def __init__(self, model: str, say: Any = None, *, engine: str = DEFAULT_ENGINE) -> None:
        import asyncio
        import functools

        if say is not None:
            say(f"starting the local Tinker-compatible server for {model}")
        # Submitted to a thread now (a coroutine would wait for the event loop, which the caller's synchronous
        # imports hold); the thread only waits for the child's URL line.
        loop = asyncio.get_running_loop()
        self._start = loop.run_in_executor(
            None, functools.partial(start_local_server_process, model=model, engine=engine)
        )
        self._stopped = False

    @classmethod
    def for_policy(
        cls, spec: PolicySpec, *, say: Any = None, in_process: bool = True
    ) -> EarlyLocalServer | None:
        """The early start of `spec`'s local server, or None when `open_policy` would start none (a hosted model,
        a served policy, another Tinker service)."""
        if spec.backend != TINKER or not uses_local_server(spec.base_url):
            return None
        if in_process and default_policy() is not None:
            return None
        return cls(spec.model, say, engine=spec.local_engine)

    async def connection(self) -> tuple[str, str]:
        """The server's base URL and the key it issued for this command, once it listens (its failure to start is
        raised here)."""
        url, key, _ = await self._start
        return url, key

    async def stop(self) -> None:
        """Stop the child (waiting for its start first); a start that failed has nothing to stop."""
        import asyncio

        if self._stopped:
            return
        self._stopped = True
        try:
            _, _, stop = await self._start
        except (
            Exception
        ):  # its failure is reported by whoever awaited `base_url`, or made moot by an earlier one
            return
        await asyncio.to_thread(stop)


@contextlib.asynccontextmanager
async def open_policy(
    spec: PolicySpec,
    *,
    rollout_config: Any,
    entries: Any = (),
    say: Any = None,
    in_process: bool = True,
    local_server: EarlyLocalServer | None = None,
) -> AsyncIterator[OpenPolicy]:
    """Open `spec` for the life of the block: the gateway over its sampler (Tinker), the hosted model (probed
    first), or the policy `platoon.testing.serve_policy` installed in process.

    `rollout_config` gives a hosted model its sampling defaults; `entries` are the environment entries (their
    harnesses' dialects are probed); `say` prints progress lines; `in_process` False (subprocess slots) never
    takes the served policy, which slot processes cannot see; `local_server` is the local server started early
    (`EarlyLocalServer.for_policy`), which the policy then uses and stops. Refusals are ConfigErrors (exit 78).

    The policy's key is read once, as it opens; inside the block its variable is withheld from this process's
    environment, where function harnesses run and which the processes they start inherit.
    """
    import asyncio

    watch = CallWatch()
    if spec.backend is None:
        raise ConfigError(
            "no policy is served (no renderer_name and no hosted model): set inference.renderer_name for a "
            "Tinker policy, or inference.hosted"
        )
    if spec.backend == HOSTED:
        assert spec.hosted is not None
        params = rollout_config.inference_params.model_dump()
        gateway = hosted_gateway(
            spec.hosted,
            model=spec.model,
            inference_params=params,
            sampling_precedence=rollout_config.sampling_precedence,
        )
        backend = gateway.backend.backend
        dialects = _dialects(entries)
        # The probe comes before any rollout: a server that refuses the key or the model stops here, in one line.
        await backend.probe(dialects)
        gateway.backend = WatchedHosted(gateway.backend, watch)
        probe = {"ok": True, "dialects": dialects}
        with withheld_from_environment(key_variables(spec)):
            yield OpenPolicy(spec, gateway, watch, probe=probe, hosted_key=backend.api_key)
        return

    served = default_policy() if in_process else None
    if served is not None:
        # `serve_policy` in this process: the scripted policy answers, with the config's renderer and settings.
        gateway = served.gateway(
            model_name=spec.model,
            renderer=spec.renderer,
            renderer_kwargs=dict(spec.renderer_kwargs),
            sample_timeout_seconds=spec.sample_timeout_seconds,
        )
        with withheld_from_environment(key_variables(spec)):
            yield OpenPolicy(spec, gateway, watch, renderer=gateway.renderer)
        return

    base_url = spec.tinker_base_url()
    api_key = check_tinker_key(spec.base_url)
    sampler: Any = None
    try:
        if uses_local_server(spec.base_url):
            if local_server is None:
                local_server = EarlyLocalServer(spec.model, say, engine=spec.local_engine)
            base_url, api_key = await local_server.connection()
        assert api_key is not None  # checked above, or the local server's own
        sampler = await _sampling_client(spec, base_url, api_key, refused_key_error)

        tokenizer = await asyncio.to_thread(get_tokenizer, spec.model)
        assert spec.renderer is not None
        renderer = get_renderer(spec.renderer, tokenizer, renderer_kwargs=dict(spec.renderer_kwargs))
        gateway = ModelGateway(
            WatchedSampler(sampler, watch, base_url),
            renderer,
            model_name=spec.model,
            context_window_length=spec.context_window_length,
            sample_timeout_seconds=spec.sample_timeout_seconds,
        )
        with withheld_from_environment(key_variables(spec)):
            yield OpenPolicy(spec, gateway, watch, renderer=renderer, sampler=sampler, base_url=base_url)
    finally:
        close_session(sampler)
        if local_server is not None:
            await local_server.stop()


async def _sampling_client(spec: PolicySpec, base_url: str | None, api_key: str, refused: Any) -> Any:
    """A Tinker sampling client of the checkpoint (`model_path`) or the base model; a refused key is one line."""
    import asyncio

    import tinker  # noqa: F401  (imported here first: a first import in the thread below can race another)

    service = None
    try:
        service = await asyncio.to_thread(
            lambda: tinker_sdk.service_client(api_key=api_key, base_url=base_url)
        )
        if spec.model_path is not None:
            return await tinker_sdk.call(service, "create_sampling_client", model_path=spec.model_path)
        return await tinker_sdk.call(service, "create_sampling_client", base_model=spec.model)
    except Exception as exc:
        close_session(service)  # a session that opened but gave no sampler must not heartbeat on
        error = refused(exc, base_url=base_url, what="a sampling client") or missing_client_config_error(
            exc, base_url=base_url
        )
        if error is not None:
            raise error from None
        # The service's answer (an unknown checkpoint, an unreachable server) in one line, not a traceback.
        what = spec.model_path or spec.model
        raise PlatoonError(
            f"the Tinker service could not open a sampler of {what}: {type(exc).__name__}: "
            + _service_answer(exc)[:300]
        ) from None


def _service_answer(exc: BaseException) -> str:
    """What the service said, once: an HTTP error's `detail` (or `error`) with its status, else the message."""
    body = getattr(exc, "body", None)
    if isinstance(body, Mapping):
        said = body.get("detail") or body.get("error")
        if isinstance(said, str) and said.strip():
            status = getattr(exc, "status_code", None)
            return f"{status} {' '.join(said.split())}" if isinstance(status, int) else " ".join(said.split())
    return " ".join(str(exc).split())
