"""Hosted inference: each call forwarded in its own dialect to `inference.hosted.base_url`.

The gateway keeps agents, budgets and recording; a call is recorded with a provider record instead of tokens (it
never trains). The key is read from its variable once, when the backend is built, sent only upstream, and redacted
from all it relays.
"""

from __future__ import annotations

import asyncio
import email.utils
import json
import os
import random
import re
import time
import uuid
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from platoon.errors import ConfigError
from platoon.gateway.core import (
    CALL_ID_PREFIX,
    AgentClosed,
    ContextWindowExceeded,
    GatewayError,
    ModelGateway,
    PermissionDenied,
    SampleTimeout,
    SamplingFailed,
)
from platoon.gateway.http import anthropic, openai_chat, responses
from platoon.gateway.records import CallRecord
from platoon.harness.agent import ChatReply

if TYPE_CHECKING:
    from platoon.eval.config_defs import HostedConfig
    from platoon.gateway.core import RolloutRecorder
    from platoon.gateway.records import AgentRecord

__all__ = [
    "DIALECTS",
    "HostedBackend",
    "HostedContextExceeded",
    "HostedRefusal",
    "HostedReply",
    "HostedSampler",
    "hosted_gateway",
]

REDACTED = "[redacted]"
#: Keys shorter than this are not searched for in replies (they would match ordinary text).
MIN_REDACTED_KEY = 8
BACKOFF_BASE_S = 0.5
BACKOFF_CAP_S = 8.0
RETRY_AFTER_CAP_S = 60.0
PROBE_PROMPT = "Reply with OK."
PROBE_MAX_TOKENS = 16
PROBE_RETRIES = 2
PROBE_TIMEOUT_CAP_S = 120.0
DEFAULT_MAX_TOKENS = (
    4096  # Messages requires max_tokens: the gateway default when neither call nor config sets it
)

#: dialect name (harness specs' names, and the HTTP seam's short names) -> (wire dialect, path under base_url)
DIALECTS: dict[str, tuple[str, str]] = {
    "openai_chat": ("chat", "/chat/completions"),
    "chat": ("chat", "/chat/completions"),
    "openai_responses": ("responses", "/responses"),
    "responses": ("responses", "/responses"),
    "anthropic_messages": ("messages", "/messages"),
    "messages": ("messages", "/messages"),
    "count_tokens": ("count_tokens", "/messages/count_tokens"),
}
_SPEC_NAMES = {"chat": "openai_chat", "responses": "openai_responses", "messages": "anthropic_messages"}
_FORWARDED_HEADERS = {
    "chat": ("openai-beta",),
    "responses": ("openai-beta",),
    "messages": ("anthropic-version", "anthropic-beta"),
    "count_tokens": ("anthropic-version", "anthropic-beta"),
}
_DROPPED = {
    "chat": ("parallel_tool_calls", "functions", "function_call", "web_search_options", "top_k"),
    "responses": (
        "parallel_tool_calls",
        "previous_response_id",
        "conversation",
        "prompt",
        "background",
        "truncation",
        "web_search_options",
        "top_k",
    ),
    "messages": ("top_k",),
    "count_tokens": ("top_k",),
}
_BUDGET_KEY = {"chat": "max_completion_tokens", "responses": "max_output_tokens", "messages": "max_tokens"}
_CONTEXT_PATTERNS = re.compile(
    r"context_length_exceeded|maximum context length|context window|prompt is too long|too many (input )?tokens"
    r"|input is too long|exceeds the context",
    re.IGNORECASE,
)


# --------------------------------------------------------------------------------------------------------------
# Errors and replies


class HostedRefusal(GatewayError):
    """The provider refused (401/402/403/404 or a redirect): never retried, and it stops the evaluation."""

    status = 502
    kind = "server_error"
    code = "hosted_refusal"

    def __init__(self, message: str, *, provider_status: int) -> None:
        super().__init__(message)
        self.provider_status = provider_status


class HostedContextExceeded(ContextWindowExceeded):
    """The provider's context-length error, as the gateway's context-window error (the dialects map it)."""

    def __init__(self, message: str) -> None:
        self.prompt_tokens = 0
        self.window = 0
        GatewayError.__init__(self, message)


@dataclass
class HostedReply:
    """What a forwarded call answers: the provider's status, content type and (redacted) body, and its record."""

    status: int
    content_type: str
    body: bytes
    record: dict[str, Any] | None = None
    call_id: str | None = None

    def json(self) -> Any:
        return json.loads(self.body)


@dataclass
class _Attempt:
    status: int | None = None
    headers: Mapping[str, str] = field(default_factory=dict)
    body: bytes = b""
    error: str | None = None  # a transport failure, a timeout, a cut or failed stream
    timed_out: bool = False


class _Unset:
    """The default of `api_key`: read the key from `api_key_env` (None itself means no auth)."""


UNSET = _Unset()


def _read_key(config: HostedConfig, environ: Mapping[str, str] | None) -> str | None:
    """The key `api_key_env` names, stripped; None for no auth or an empty variable."""
    name = config.api_key_env
    if name is None:
        return None
    value = (os.environ if environ is None else environ).get(name, "").strip()
    return value or None


def _one_line(text: str, limit: int = 300) -> str:
    line = " ".join(text.split())
    return line if len(line) <= limit else line[: limit - 3] + "..."


def _provider_message(body: bytes) -> str:
    """The error message of a provider's JSON error body, else the body's text."""
    try:
        data = json.loads(body)
    except ValueError:
        return body.decode("utf-8", "replace")
    if isinstance(data, dict):
        error = data.get("error")
        if isinstance(error, dict) and isinstance(error.get("message"), str):
            return str(error["message"])
        if isinstance(error, str):
            return error
        if isinstance(data.get("message"), str):
            return str(data["message"])
    return body.decode("utf-8", "replace")


# --------------------------------------------------------------------------------------------------------------
# The backend


class HostedBackend:
    """Forwards calls to `config.base_url` in their own dialect; the HTTP server's `ChatBackend`.

    `inference_params` are the rollout's (`temperature`, `top_p`, `max_completion_tokens`) filling unset
    sampling; `sampling_precedence: config` makes them win for policy calls. `workers`: the worker processes
    `max_concurrent_requests` is split across.
    """

    def __init__(
        self,
        config: HostedConfig,
        *,
        model: str,
        inference_params: Mapping[str, Any] | None = None,
        sampling_precedence: str = "request",
        workers: int = 1,
        gateway: ModelGateway | None = None,
        environ: Mapping[str, str] | None = None,
        api_key: str | _Unset | None = UNSET,
        sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep,
    ) -> None:
        self.config = config
        self.model = model
        self.base_url = config.base_url.rstrip("/")
        parts = urlsplit(self.base_url)
        self.origin = f"{parts.scheme}://{parts.netloc}"
        params = dict(inference_params or {})
        if "max_tokens" in params and "max_completion_tokens" not in params:
            params["max_completion_tokens"] = params.pop("max_tokens")
        self.inference_params = {k: v for k, v in params.items() if v is not None}
        self.sampling_precedence = sampling_precedence
        self.gateway = gateway
        # Read once, here: the evaluation then withholds the variable from its environment, where harness code
        # runs (docs/gateway.md), and subprocess slots receive the key itself over their socket.
        self._api_key = _read_key(config, environ) if isinstance(api_key, _Unset) else api_key
        self._sleep = sleep
        limit = config.max_concurrent_requests
        self._slots = None if limit is None else asyncio.Semaphore(max(1, limit // max(1, workers)))

    # ---- the key

    @property
    def api_key(self) -> str | None:
        """The key sent upstream (None: no auth); never logged, recorded or relayed."""
        return self._api_key

    def _key(self) -> str | None:
        return self._api_key

    def redact(self, text: str, key: str | None = None) -> str:
        """`text` with the key replaced by `[redacted]` (keys under 8 characters are not searched)."""
        key = self._key() if key is None else key
        if key and len(key) >= MIN_REDACTED_KEY:
            return text.replace(key, REDACTED)
        return text

    def _redact_bytes(self, body: bytes, key: str | None) -> bytes:
        if key and len(key) >= MIN_REDACTED_KEY:
            return body.replace(key.encode(), REDACTED.encode())
        return body

    # ---- normalization

    def normalize(self, dialect: str, body: Mapping[str, Any], *, kind: str = "policy") -> dict[str, Any]:
        """The body as forwarded: training's refusals, plain function tools, dropped fields, the model replaced,
        unset sampling filled from the rollout's inference params (top_k never forwarded)."""
        wire = DIALECTS[dialect][0]
        out = {k: v for k, v in body.items() if k not in _DROPPED[wire]}
        if "stop_sequences" in out and wire in ("messages", "count_tokens"):
            raise GatewayError(
                "stop_sequences are not supported: they would replace the model's end-of-turn stops"
            )
        choice = out.pop("tool_choice", None)
        if choice is not None:
            name = choice.get("type") if isinstance(choice, Mapping) else choice
            if name not in ("auto", "none"):
                raise GatewayError(f"tool_choice {name!r} is not supported: use auto or none")
        if "tools" in out:
            out["tools"] = _plain_tools(wire, out["tools"])
            if not out["tools"]:
                del out["tools"]
        _validate(wire, out)
        out["model"] = self.model
        if wire == "count_tokens":
            return out
        budget_key = _BUDGET_KEY[wire]
        config = self.inference_params
        if kind == "policy" and self.sampling_precedence == "config":
            for key in ("temperature", "top_p"):
                out.pop(key, None)
            if "max_completion_tokens" in config:
                for key in ("max_tokens", "max_completion_tokens", "max_output_tokens"):
                    out.pop(key, None)
        for key in ("temperature", "top_p"):
            if key not in out and key in config:
                out[key] = config[key]
        has_budget = any(k in out for k in ("max_tokens", "max_completion_tokens", "max_output_tokens"))
        if not has_budget:
            if "max_completion_tokens" in config:
                out[budget_key] = config["max_completion_tokens"]
            elif wire == "messages":
                out[budget_key] = DEFAULT_MAX_TOKENS
        return out

    def _headers(self, wire: str, incoming: Mapping[str, str] | None, key: str | None) -> dict[str, str]:
        headers = {"content-type": "application/json", "accept": "application/json, text/event-stream"}
        lowered = {k.lower(): v for k, v in (incoming or {}).items()}
        for name in _FORWARDED_HEADERS[wire]:
            if name in lowered:
                headers[name] = lowered[name]
        if wire in ("messages", "count_tokens"):
            headers.setdefault("anthropic-version", "2023-06-01")
            if key:
                headers["x-api-key"] = key
        elif key:
            headers["authorization"] = f"Bearer {key}"
        return headers

    # ---- one forwarded call

    async def forward(
        self,
        dialect: str,
        body: Mapping[str, Any],
        headers: Mapping[str, str] | None = None,
        *,
        agent: AgentRecord | None = None,
        kind: str = "policy",
        max_retries: int | None = None,
        timeout_s: float | None = None,
    ) -> HostedReply:
        """Normalize and forward one call with retries; record it on `agent` when it succeeds.

        Raises `HostedRefusal` (401/402/403/404/3xx), `HostedContextExceeded`, `SampleTimeout`/`SamplingFailed`
        for transport failures that outlived the retries. Other 4xx (and 429/5xx after the retries) come back as
        the provider's reply.
        """
        if dialect not in DIALECTS:
            raise GatewayError(
                f"unknown hosted dialect {dialect!r}: use one of {', '.join(sorted(DIALECTS))}"
            )
        wire, path = DIALECTS[dialect]
        payload = self.normalize(dialect, body, kind=kind)
        stream = bool(payload.get("stream"))
        retries = self.config.max_retries if max_retries is None else max_retries
        timeout = self.config.timeout_s if timeout_s is None else timeout_s
        started = time.perf_counter()
        key = self._key()
        request_headers = self._headers(wire, headers, key)
        data = json.dumps(payload, ensure_ascii=False).encode()
        url = self.base_url + path
        attempts = 0
        rate_limited = False
        attempt = _Attempt()
        for n in range(1, retries + 2):
            attempts = n
            attempt = await self._attempt(url, data, request_headers, timeout, wire, stream)
            status = attempt.status
            if status == 429:
                rate_limited = True
            if attempt.error is None and status is not None and 200 <= status < 300:
                break
            if status is not None and (300 <= status < 400 or status in (401, 402, 403, 404)):
                answer = self.redact(_one_line(_provider_message(attempt.body) or f"HTTP {status}"), key)
                raise HostedRefusal(
                    f"the hosted model at {self.origin} refused a {_SPEC_NAMES.get(wire, wire)} call: "
                    f"HTTP {status}: {answer}",
                    provider_status=status,
                )
            if (
                status is not None
                and attempt.error is None
                and 400 <= status < 500
                and status not in (408, 409, 429)
            ):
                message = _provider_message(attempt.body)
                if _CONTEXT_PATTERNS.search(message):
                    if agent is not None:
                        agent.context_overflows += 1
                    raise HostedContextExceeded(self.redact(message, key))
                return HostedReply(
                    status, _content_type(attempt.headers), self._redact_bytes(attempt.body, key)
                )
            if n > retries:
                break
            await self._sleep(_delay(n, attempt.headers))
        ended = time.perf_counter()
        if attempt.error is not None or attempt.status is None or not 200 <= attempt.status < 300:
            if agent is not None:
                agent.gateway_errors += 1
            if attempt.error is not None or attempt.status is None:
                message = self.redact(
                    f"the hosted model at {self.origin} failed after {attempts} attempts: {attempt.error}",
                    key,
                )
                raise (SampleTimeout if attempt.timed_out else SamplingFailed)(message)
            return HostedReply(
                attempt.status, _content_type(attempt.headers), self._redact_bytes(attempt.body, key)
            )
        reply = HostedReply(
            attempt.status, _content_type(attempt.headers), self._redact_bytes(attempt.body, key)
        )
        if wire == "count_tokens":
            return reply
        # Summarized from the redacted body: the key must not reach the agent's records either.
        summary = _summary(wire, reply.body, stream)
        record = {
            "dialect": _SPEC_NAMES[wire],
            "usage": summary["usage"],
            "model": summary["model"],
            "response_id": summary["id"],
            "request_id": attempt.headers.get("x-request-id") or attempt.headers.get("request-id"),
            "stop_reason": summary["stop_reason"],
            "refusal": summary["refusal"],
            "attempts": attempts,
            "rate_limited": rate_limited,
            "cost": self.cost(summary["usage"]),
        }
        reply.record = record
        if agent is not None:
            reply.call_id = self._record(agent, kind, summary, record, started, ended)
        return reply

    async def _attempt(
        self, url: str, data: bytes, headers: dict[str, str], timeout: float, wire: str, stream: bool
    ) -> _Attempt:
        import httpx

        async def go() -> _Attempt:
            # Redirects are refusals, never followed; streams are read whole before relaying.
            async with (
                httpx.AsyncClient(timeout=timeout, follow_redirects=False) as client,
                client.stream("POST", url, content=data, headers=headers) as response,
            ):
                body = await response.aread()
                out = _Attempt(response.status_code, dict(response.headers), body)
            if stream and out.status is not None and 200 <= out.status < 300:
                out.error = _stream_problem(wire, body)
            return out

        try:
            if self._slots is None:
                return await go()
            async with self._slots:
                return await go()
        except httpx.TimeoutException as exc:
            return _Attempt(error=f"timed out after {timeout:g}s ({type(exc).__name__})", timed_out=True)
        except httpx.HTTPError as exc:
            return _Attempt(error=f"{type(exc).__name__}: {exc}")

    def cost(self, usage: Mapping[str, int]) -> float | None:
        """USD of a call from `pricing` (per million tokens); None when unpriced."""
        pricing = self.config.pricing
        if pricing is None:
            return None
        cached = usage.get("cached_input_tokens", 0)
        written = usage.get("cache_write_tokens", 0)
        fresh = max(0, usage.get("input_tokens", 0) - cached - written)
        cached_price = pricing.cached_input if pricing.cached_input is not None else pricing.input
        write_price = pricing.cache_write if pricing.cache_write is not None else pricing.input
        total = (
            fresh * pricing.input
            + cached * cached_price
            + written * write_price
            + usage.get("output_tokens", 0) * pricing.output
        )
        return total / 1_000_000

    def _record(
        self,
        agent: AgentRecord,
        kind: str,
        summary: dict[str, Any],
        record: dict[str, Any],
        started: float,
        ended: float,
    ) -> str:
        """Append the call to the agent (no interaction: it has no tokens and never trains); returns its id."""
        call_id = CALL_ID_PREFIX + uuid.uuid4().hex
        if agent.closed:
            return call_id
        usage = record["usage"]
        agent.calls.append(
            CallRecord(
                call_id=call_id,
                kind=kind,
                model=record["model"] or self.model,
                message=summary["message"],
                finish_reason=summary["finish_reason"],
                usage={
                    "prompt_tokens": usage["input_tokens"],
                    "completion_tokens": usage["output_tokens"],
                    "total_tokens": usage["input_tokens"] + usage["output_tokens"],
                },
                started=started,
                ended=ended,
                generation={"finish_reason": summary["finish_reason"], "provider": record},
                step_misc={"exclude_from_training": True},
            )
        )
        return call_id

    # ---- the HTTP server's seam (`ChatBackend`)

    async def chat(self, agent: AgentRecord, body: dict[str, Any], dialect: str, *, kind: str) -> Any:
        """Forward an HTTP call (the gateway's refusals first); returns a starlette `Response` with the provider's
        status, content type and redacted body."""
        from starlette.responses import Response

        if dialect != "count_tokens":
            _admit(self.gateway, agent, kind)
        reply = await self.forward(dialect, body, agent=agent, kind=kind)
        headers = {"x-platoon-call-id": reply.call_id} if reply.call_id else None
        return Response(reply.body, status_code=reply.status, media_type=reply.content_type, headers=headers)

    # ---- the probe

    async def probe(self, dialects: Iterable[str]) -> None:
        """One "Reply with OK." call (16 tokens) per dialect, 2 retries, timeout min(timeout_s, 120); a failure
        raises a one-line `ConfigError` naming the dialect, the origin and the provider's answer."""
        timeout = min(self.config.timeout_s, PROBE_TIMEOUT_CAP_S)
        for dialect in dict.fromkeys(dialects):
            if dialect not in DIALECTS or DIALECTS[dialect][0] == "count_tokens":
                raise ConfigError(f"hosted probe: unknown dialect {dialect!r}")
            wire = DIALECTS[dialect][0]
            name = _SPEC_NAMES[wire]
            if wire == "responses":
                body: dict[str, Any] = {"input": PROBE_PROMPT, "max_output_tokens": PROBE_MAX_TOKENS}
            else:
                body = {
                    "messages": [{"role": "user", "content": PROBE_PROMPT}],
                    _BUDGET_KEY[wire]: PROBE_MAX_TOKENS,
                }
            try:
                reply = await self.forward(
                    dialect, body, kind="aux", max_retries=PROBE_RETRIES, timeout_s=timeout
                )
            except GatewayError as exc:
                answer = exc.message
            else:
                if 200 <= reply.status < 300:
                    continue
                answer = f"HTTP {reply.status}: {_provider_message(reply.body)}"
            raise ConfigError(
                _one_line(
                    self.redact(f"hosted probe failed for dialect {name} at {self.origin}: {answer}"), 500
                )
            )


# --------------------------------------------------------------------------------------------------------------
# In-process calls (`ctx.chat`)


class HostedSampler:
    """What a `ModelGateway` takes as `backend` for in-process calls: `ctx.chat` becomes an unstreamed Chat
    Completions body forwarded to the hosted model, recorded on the agent with its provider record."""

    def __init__(self, backend: HostedBackend) -> None:
        self.backend = backend

    async def chat(
        self,
        agent: AgentRecord,
        rollout: RolloutRecorder,
        messages: list[dict[str, Any]],
        *,
        tools: list[dict[str, Any]] | None,
        kind: str,
        sampling: Mapping[str, Any],
    ) -> ChatReply:
        body: dict[str, Any] = {**sampling, "messages": messages, "stream": False}
        body.pop("stream_options", None)
        if tools:
            body["tools"] = tools
        reply = await self.backend.forward("chat", body, agent=agent, kind=kind)
        if not 200 <= reply.status < 300:
            error = GatewayError(_provider_message(reply.body), status=reply.status)
            if reply.status >= 500 or reply.status == 429:
                error = SamplingFailed(f"the hosted model answered HTTP {reply.status}: {error.message}")
            raise error
        summary = _summary("chat", reply.body, False)
        return ChatReply(reply.call_id or "", dict(summary["message"]), summary["finish_reason"])


def hosted_gateway(
    config: HostedConfig,
    *,
    model: str,
    inference_params: Mapping[str, Any] | None = None,
    sampling_precedence: str = "request",
    workers: int = 1,
    environ: Mapping[str, str] | None = None,
    api_key: str | _Unset | None = UNSET,
) -> ModelGateway:
    """A `ModelGateway` whose calls go to the hosted model (no renderer, no sampler, no tokens).

    The key is `api_key` when given (None: no auth), else read once from `api_key_env` in `environ`."""
    gateway = ModelGateway(None, _NoRenderer(), model_name=model)
    backend = HostedBackend(
        config,
        model=model,
        inference_params=inference_params,
        sampling_precedence=sampling_precedence,
        workers=workers,
        gateway=gateway,
        environ=environ,
        api_key=api_key,
    )
    gateway.backend = HostedSampler(backend)
    return gateway


class _NoRenderer:
    """The renderer of a hosted gateway: nothing is rendered in process."""

    tokenizer = None

    def stop_token_ids(self) -> list[int]:
        return []

    def render_prompt(self, messages: Any, tools: Any = None) -> list[int]:
        raise RuntimeError("a hosted gateway renders nothing: its calls go to the hosted model")


# --------------------------------------------------------------------------------------------------------------
# Helpers


def _admit(gateway: ModelGateway | None, agent: AgentRecord, kind: str) -> None:
    """The gateway's refusals before sampling, for calls forwarded over HTTP."""
    if kind not in ("policy", "aux", "judge"):
        raise GatewayError(f"unknown call kind {kind!r}: use policy, aux or judge")
    if agent.closed or (gateway is not None and gateway.is_shut_down):
        raise AgentClosed("this agent is closed: its rollout has finished")
    if gateway is None or kind == "policy":
        return
    try:
        rollout = gateway.rollout(agent.rollout_id)
    except KeyError:
        raise AgentClosed("this agent's rollout is no longer open") from None
    settings = rollout._settings.get(agent.agent_id)
    if settings is not None and settings.policy_only:
        raise PermissionDenied(f"this agent key may make policy calls only, not {kind} calls")
    if kind == "judge" and not rollout.judges:
        agent.misc["judges_refused"] = agent.misc.get("judges_refused", 0) + 1
        raise PermissionDenied("judge calls are disabled for this rollout (judges: false)")


def _validate(wire: str, body: dict[str, Any]) -> None:
    """Refuse what training would refuse, with training's message (the HTTP dialects' request parsers)."""
    parser = {
        "chat": openai_chat.parse_request,
        "responses": responses.parse_request,
        "messages": anthropic.parse_request,
    }.get(wire)
    if parser is not None:
        parser(dict(body))


def _plain_tools(wire: str, tools: Any) -> Any:
    """Tools reduced to plain functions (name, description, parameters) in the dialect's shape."""
    if not isinstance(tools, list):
        return tools  # the dialect's parser refuses it with training's message
    out: list[Any] = []
    for tool in tools:
        if not isinstance(tool, Mapping):
            out.append(tool)
            continue
        if wire == "chat":
            nested = tool.get("function")
            function: Mapping[str, Any] = nested if isinstance(nested, Mapping) else tool
            if tool.get("type") == "custom" or not function.get("name"):
                out.append(tool)  # refused by the parser with training's message
                continue
            plain = {"name": function["name"], "description": function.get("description") or ""}
            if function.get("parameters") is not None:
                plain["parameters"] = function["parameters"]
            out.append({"type": "function", "function": plain})
        elif wire == "responses":
            if tool.get("type") != "function" or not tool.get("name"):
                continue  # only function tools are kept
            plain = {"type": "function", "name": tool["name"], "description": tool.get("description") or ""}
            if tool.get("parameters") is not None:
                plain["parameters"] = tool["parameters"]
            out.append(plain)
        else:
            if not tool.get("name"):
                continue  # nameless entries are dropped
            schema = tool.get("input_schema") or {"type": "object", "properties": {}}
            out.append(
                {"name": tool["name"], "description": tool.get("description") or "", "input_schema": schema}
            )
    return out


def _content_type(headers: Mapping[str, str]) -> str:
    return headers.get("content-type", "application/json")


def _delay(attempt: int, headers: Mapping[str, str]) -> float:
    """`retry-after-ms`/`retry-after` (capped at 60 s), else 0.5 * 2^(n-1) capped at 8 s plus up to 25% jitter."""
    raw_ms = headers.get("retry-after-ms")
    if raw_ms:
        try:
            return min(max(float(raw_ms) / 1000, 0.0), RETRY_AFTER_CAP_S)
        except ValueError:
            pass
    raw = headers.get("retry-after")
    if raw:
        try:
            return min(max(float(raw), 0.0), RETRY_AFTER_CAP_S)
        except ValueError:
            when = email.utils.parsedate_to_datetime(raw) if raw else None
            if when is not None:
                return min(max(when.timestamp() - time.time(), 0.0), RETRY_AFTER_CAP_S)
    base = min(BACKOFF_BASE_S * 2 ** (attempt - 1), BACKOFF_CAP_S)
    return base * (1 + random.uniform(0, 0.25))


def _sse_events(body: bytes) -> list[tuple[str | None, str]]:
    """(event name, data) of each SSE event."""
    events: list[tuple[str | None, str]] = []
    for chunk in re.split(r"\r?\n\r?\n", body.decode("utf-8", "replace")):
        name: str | None = None
        data: list[str] = []
        for line in chunk.splitlines():
            if line.startswith("event:"):
                name = line[6:].strip()
            elif line.startswith("data:"):
                data.append(line[5:].lstrip())
        if name is not None or data:
            events.append((name, "\n".join(data)))
    return events


def _stream_problem(wire: str, body: bytes) -> str | None:
    """Why a streamed reply must be retried: an error event, or a stream cut off before its end."""
    events = _sse_events(body)
    for name, data in events:
        if name in ("error", "response.failed"):
            return f"the stream carried an error event: {_one_line(data)}"
        if wire == "chat" and data.startswith("{") and '"error"' in data:
            try:
                if isinstance(json.loads(data).get("error"), dict):
                    return f"the stream carried an error: {_one_line(data)}"
            except ValueError:
                pass
    names = {name for name, _ in events}
    datas = [data for _, data in events]
    ended = {
        "chat": "[DONE]" in datas,
        "responses": bool(names & {"response.completed", "response.incomplete"}),
        "messages": "message_stop" in names,
    }.get(wire, True)
    return None if ended else "the stream was cut off before its end"


def _usage(wire: str, usage: Mapping[str, Any] | None) -> dict[str, int]:
    """Normalized usage: input tokens (cached and cache writes included), output, cached input, cache writes."""
    u = usage or {}

    def num(value: Any) -> int:
        return int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else 0

    if wire == "chat":
        details = u.get("prompt_tokens_details") or {}
        return {
            "input_tokens": num(u.get("prompt_tokens")),
            "output_tokens": num(u.get("completion_tokens")),
            "cached_input_tokens": num(details.get("cached_tokens")),
            "cache_write_tokens": 0,
        }
    if wire == "responses":
        details = u.get("input_tokens_details") or {}
        return {
            "input_tokens": num(u.get("input_tokens")),
            "output_tokens": num(u.get("output_tokens")),
            "cached_input_tokens": num(details.get("cached_tokens")),
            "cache_write_tokens": 0,
        }
    read, write = num(u.get("cache_read_input_tokens")), num(u.get("cache_creation_input_tokens"))
    return {
        "input_tokens": num(u.get("input_tokens")) + read + write,
        "output_tokens": num(u.get("output_tokens")),
        "cached_input_tokens": read,
        "cache_write_tokens": write,
    }


def _summary(wire: str, body: bytes, stream: bool) -> dict[str, Any]:
    """id, served model, usage, raw stop reason, refusal, the assistant message and its finish reason."""
    data: dict[str, Any] = {}
    if stream:
        data = _from_stream(wire, body)
    else:
        try:
            loaded = json.loads(body)
            data = loaded if isinstance(loaded, dict) else {}
        except ValueError:
            data = {}
    message: dict[str, Any] = {
        "role": "assistant",
        "content": "",
        "tool_calls": None,
        "reasoning_content": None,
    }
    refusal: Any = None
    stop_reason: Any = None
    if wire == "chat":
        choices = data.get("choices") or [{}]
        choice = choices[0] if isinstance(choices[0], dict) else {}
        got = choice.get("message") or {}
        message.update({k: got.get(k) for k in ("content", "tool_calls", "reasoning_content") if k in got})
        refusal = got.get("refusal")
        stop_reason = choice.get("finish_reason")
    elif wire == "responses":
        texts: list[str] = []
        calls: list[dict[str, Any]] = []
        for item in data.get("output") or []:
            if not isinstance(item, dict):
                continue
            if item.get("type") == "message":
                for part in item.get("content") or []:
                    if isinstance(part, dict) and part.get("type") == "output_text":
                        texts.append(str(part.get("text", "")))
                    elif isinstance(part, dict) and part.get("type") == "refusal":
                        refusal = part.get("refusal")
            elif item.get("type") == "function_call":
                calls.append(
                    {
                        "id": item.get("call_id"),
                        "type": "function",
                        "function": {"name": item.get("name"), "arguments": item.get("arguments", "")},
                    }
                )
        message.update(content="".join(texts), tool_calls=calls or None)
        details = data.get("incomplete_details") or {}
        stop_reason = details.get("reason") or data.get("status")
    else:
        texts = []
        calls = []
        for block in data.get("content") or []:
            if not isinstance(block, dict):
                continue
            if block.get("type") == "text":
                texts.append(str(block.get("text", "")))
            elif block.get("type") == "tool_use":
                arguments = json.dumps(block.get("input") or {}, ensure_ascii=False)
                calls.append(
                    {
                        "id": block.get("id"),
                        "type": "function",
                        "function": {"name": block.get("name"), "arguments": arguments},
                    }
                )
        message.update(content="".join(texts), tool_calls=calls or None)
        stop_reason = data.get("stop_reason")
        refusal = "refusal" if stop_reason == "refusal" else None
    if message.get("tool_calls"):
        finish = "tool_calls"
    elif stop_reason in ("length", "max_tokens", "max_output_tokens"):
        finish = "length"
    else:
        finish = "stop"
    return {
        "id": data.get("id"),
        "model": data.get("model"),
        "usage": _usage(wire, data.get("usage")),
        "stop_reason": stop_reason,
        "refusal": refusal,
        "message": message,
        "finish_reason": finish,
    }


def _from_stream(wire: str, body: bytes) -> dict[str, Any]:
    """A non-streamed-shaped summary body assembled from a stream's events."""
    out: dict[str, Any] = {}
    events = _sse_events(body)
    parsed: list[tuple[str | None, dict[str, Any]]] = []
    for name, data in events:
        try:
            value = json.loads(data)
        except ValueError:
            continue
        if isinstance(value, dict):
            parsed.append((name, value))
    if wire == "responses":
        for name, value in parsed:
            if (name or value.get("type")) in ("response.completed", "response.incomplete"):
                response = value.get("response")
                if isinstance(response, dict):
                    return response
        return out
    if wire == "chat":
        content: list[str] = []
        calls: dict[int, dict[str, Any]] = {}
        finish = None
        for _, chunk in parsed:
            out.setdefault("id", chunk.get("id"))
            out["model"] = chunk.get("model", out.get("model"))
            if chunk.get("usage"):
                out["usage"] = chunk["usage"]
            for choice in chunk.get("choices") or []:
                delta = choice.get("delta") or {}
                if isinstance(delta.get("content"), str):
                    content.append(delta["content"])
                for call in delta.get("tool_calls") or []:
                    slot = calls.setdefault(
                        int(call.get("index", 0)),
                        {"id": None, "type": "function", "function": {"name": None, "arguments": ""}},
                    )
                    slot["id"] = call.get("id") or slot["id"]
                    function = call.get("function") or {}
                    slot["function"]["name"] = function.get("name") or slot["function"]["name"]
                    slot["function"]["arguments"] += function.get("arguments") or ""
                finish = choice.get("finish_reason") or finish
        message = {"content": "".join(content), "tool_calls": [calls[i] for i in sorted(calls)] or None}
        out["choices"] = [{"message": message, "finish_reason": finish}]
        return out
    blocks: dict[int, dict[str, Any]] = {}
    usage: dict[str, Any] = {}
    for name, value in parsed:
        kind = name or value.get("type")
        if kind == "message_start":
            started: dict[str, Any] = value.get("message") or {}
            out.update(id=started.get("id"), model=started.get("model"))
            usage.update(started.get("usage") or {})
        elif kind == "content_block_start":
            blocks[int(value.get("index", 0))] = dict(value.get("content_block") or {})
        elif kind == "content_block_delta":
            block = blocks.setdefault(int(value.get("index", 0)), {"type": "text", "text": ""})
            delta = value.get("delta") or {}
            if delta.get("type") == "text_delta":
                block["text"] = block.get("text", "") + delta.get("text", "")
            elif delta.get("type") == "input_json_delta":
                block["_json"] = block.get("_json", "") + delta.get("partial_json", "")
        elif kind == "message_delta":
            out["stop_reason"] = (value.get("delta") or {}).get("stop_reason")
            usage.update({k: v for k, v in (value.get("usage") or {}).items() if v is not None})
    for block in blocks.values():
        raw = block.pop("_json", None)
        if raw:
            try:
                block["input"] = json.loads(raw)
            except ValueError:
                block["input"] = {"_raw_arguments": raw}
    out["content"] = [blocks[i] for i in sorted(blocks)]
    out["usage"] = usage
    return out
