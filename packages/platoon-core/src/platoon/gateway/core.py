"""The recording model gateway core: every model call is rendered, sampled, parsed and recorded with its exact tokens.

In process and transport-free; the HTTP dialects and the MCP tool plane sit on top of `ModelGateway.chat`
and `ModelGateway.agent_for_key`. The hot path avoids deep copies and logging: it runs several times per episode.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import json
import logging
import math
import os
import secrets
import time
import uuid
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from platoon import rollout_progress
from platoon.gateway import tinker_sdk
from platoon.gateway.history import AgentHistory, PromptBuild, build_prompt
from platoon.gateway.measure import (
    OFF_LOOP_CHARS,
    known_token_span,
    prompt_token_floor,
    request_chars,
    token_span,
)
from platoon.gateway.plain_sampling import (
    PlainChunk,
    PlainPrompt,
    PlainSamplingParams,
    loaded_tinker,
)
from platoon.gateway.records import AgentRecord, CallRecord, Interaction
from platoon.harness.agent import ChatReply
from platoon.renderers.base import RendererError
from platoon.request_limits import MAX_PROMPT_TOKENS_ENV, MAX_TOKENS_ENV, limit_from_env

if TYPE_CHECKING:
    from platoon.task import Task

__all__ = [
    "BUDGET_STOP_MESSAGE",
    "CALL_ID_PREFIX",
    "DEFAULT_SAMPLE_TIMEOUT_SECONDS",
    "DEFAULT_TOKEN_LIMIT",
    "MAX_PROMPT_TOKENS_ENV",
    "MAX_TOKENS_ENV",
    "SAMPLE_TIMEOUT_ENV",
    "AgentClosed",
    "AuthenticationFailed",
    "ContextWindowExceeded",
    "GatewayError",
    "InvalidRequest",
    "ModelGateway",
    "PermissionDenied",
    "PromptTooLong",
    "RolloutRecorder",
    "SampleTimeout",
    "SamplingFailed",
    "resolve_sample_timeout",
]

log = logging.getLogger(__name__)

#: Call ids are `tinker-sampling-<hex>`: the interaction map and the trajectory steps are keyed by them.
CALL_ID_PREFIX = "tinker-sampling-"
#: The id of a budget stop reply: it is not sampled, so it names no interaction.
BUDGET_STOP_CALL_PREFIX = "platoon-budget-stop-"
SAMPLE_TIMEOUT_ENV = "TINKER_SAMPLE_TIMEOUT_SECONDS"
DEFAULT_SAMPLE_TIMEOUT_SECONDS = 600.0
#: The most tokens one call may ask to sample, and the longest prompt, when nothing smaller is set: past any model's
#: context, so no real call meets them; a context window (`context_window_length`) bounds both far sooner.
DEFAULT_TOKEN_LIMIT = 1 << 20
#: Calls slower than this are logged (the only logging on the call path).
SLOW_CALL_SECONDS = 30.0
#: Closed agent keys remembered so that late calls get 410 (agent closed) rather than 401 (unknown key).
MAX_CLOSED_KEYS = 65536

_KINDS = frozenset(("policy", "aux", "judge"))
_ACCESS_RANK = {"full": 2, "no_terminal": 1, "read_only": 0}
_PRECEDENCES = ("request", "config")
#: Chat Completions parameters accepted and ignored in process (they shape transport replies, not sampling).
_IGNORED_PARAMS = frozenset(
    (
        "n",
        "stream",
        "stream_options",
        "tool_choice",
        "parallel_tool_calls",
        "logprobs",
        "top_logprobs",
        "user",
        "metadata",
        "store",
        "frequency_penalty",
        "presence_penalty",
        "response_format",
        "model",
        "timeout",
        "logit_bias",
        "service_tier",
        "modalities",
        "audio",
        "prediction",
        "verbosity",
        "web_search_options",
        "safety_identifier",
        "prompt_cache_key",
    )
)


def _sampling_request(prompt: list[int], sampling: dict[str, Any]) -> tuple[Any, Any]:
    """The prompt and settings of one sample: the Tinker SDK's types when the SDK is loaded (the sampler may be one
    of its clients), else `plain_sampling`'s, so that a sampler of platoon's own never imports the SDK.

    Built without validation: the values are checked before, and validating a long token list costs more than the
    rest of the gateway's work on a call.
    """
    tinker = loaded_tinker()
    if tinker is None:
        return PlainPrompt([PlainChunk(prompt)]), PlainSamplingParams(**sampling)
    model_input = tinker.ModelInput.model_construct(
        chunks=[tinker.EncodedTextChunk.model_construct(tokens=prompt, type="encoded_text")]
    )
    return model_input, tinker.SamplingParams.model_construct(**sampling)


# --------------------------------------------------------------------------------------------------------------
# Errors


class GatewayError(Exception):
    """A refused or failed model call; `status` is the HTTP status the dialects answer with, `kind` the error type."""

    status: int = 400
    kind: str = "invalid_request_error"
    code: str | None = None

    def __init__(
        self, message: str, *, status: int | None = None, kind: str | None = None, code: str | None = None
    ):
        super().__init__(message)
        self.message = message
        if status is not None:
            self.status = status
        if kind is not None:
            self.kind = kind
        if code is not None:
            self.code = code


class InvalidRequest(GatewayError):
    """A request the gateway cannot serve as sent: a malformed message or tool that the renderer refused (HTTP 400,
    `invalid_request_error`). The caller's error: it does not count in the agent's `gateway_errors`."""

    status = 400
    kind = "invalid_request_error"


class PermissionDenied(GatewayError):
    """A call the agent may not make: a non-policy call from a policy-only key, or a judge call with judges off."""

    status = 403
    kind = "permission_error"
    code = "permission_denied"


class AgentClosed(GatewayError):
    """A call on a closed agent, or on a gateway that shut down."""

    status = 410
    kind = "agent_closed"
    code = "agent_closed"


class AuthenticationFailed(GatewayError):
    """An unknown agent key."""

    status = 401
    kind = "authentication_error"
    code = "invalid_api_key"


class ContextWindowExceeded(GatewayError):
    """The prompt leaves no room for a single completion token in the context window. `at_least`: refused before
    rendering, `prompt_tokens` being a lower bound on the prompt's length (`platoon.gateway.measure`)."""

    status = 400
    kind = "invalid_request_error"
    code = "context_length_exceeded"

    def __init__(self, prompt_tokens: int, window: int, *, at_least: bool = False):
        self.prompt_tokens = prompt_tokens
        self.window = window
        self.at_least = at_least
        counted = f"at least {prompt_tokens} tokens" if at_least else f"{prompt_tokens} tokens"
        super().__init__(
            f"This model's maximum context length is {window} tokens. However, your messages resulted in "
            f"{counted}. Please reduce the length of the messages."
        )


class PromptTooLong(GatewayError):
    """The prompt is longer than the gateway's prompt limit (`max_prompt_tokens`). `at_least`: refused before
    rendering, `prompt_tokens` being a lower bound."""

    status = 400
    kind = "invalid_request_error"
    code = "context_length_exceeded"

    def __init__(self, prompt_tokens: int, limit: int, *, at_least: bool = False):
        self.prompt_tokens = prompt_tokens
        self.limit = limit
        counted = f"at least {prompt_tokens}" if at_least else str(prompt_tokens)
        super().__init__(
            f"the prompt is {counted} tokens, over the gateway's limit of {limit} prompt tokens "
            f"({MAX_PROMPT_TOKENS_ENV} raises it)"
        )


class SampleTimeout(GatewayError, TimeoutError):
    """A `sample_async` round trip that outlived the sample timeout (HTTP 504, `sample_timeout`)."""

    status = 504
    kind = "timeout"
    code = "sample_timeout"


class SamplingFailed(GatewayError):
    """The sampler failed (or answered something other than one sequence); counted in the agent's gateway errors."""

    status = 500
    kind = "server_error"


# --------------------------------------------------------------------------------------------------------------
# Settings


def resolve_sample_timeout(configured: float | None) -> float:
    """The sample timeout: the config key, else `$TINKER_SAMPLE_TIMEOUT_SECONDS`, else 600 s.

    Raises `ValueError` for a value that is not a finite positive number (a config error at start).
    """
    if configured is not None:
        return _positive_seconds(configured, "sample_timeout_seconds")
    raw = os.environ.get(SAMPLE_TIMEOUT_ENV, "").strip()
    if raw:
        try:
            value = float(raw)
        except ValueError:
            raise ValueError(f"{SAMPLE_TIMEOUT_ENV} must be a number of seconds; got {raw!r}") from None
        return _positive_seconds(value, SAMPLE_TIMEOUT_ENV)
    return DEFAULT_SAMPLE_TIMEOUT_SECONDS


def sample_timeout_with_source(configured: float | None, key: str) -> tuple[float, str]:
    """`resolve_sample_timeout` and where the number came from: `key`, `$TINKER_SAMPLE_TIMEOUT_SECONDS` or the
    default (the one line a run logs). Raises `ValueError` like it."""
    seconds = resolve_sample_timeout(configured)
    if configured is not None:
        return seconds, key
    if os.environ.get(SAMPLE_TIMEOUT_ENV, "").strip():
        return seconds, f"${SAMPLE_TIMEOUT_ENV}"
    return seconds, "the default"


def _positive_seconds(value: Any, what: str) -> float:
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not math.isfinite(value)
        or value <= 0
    ):
        raise ValueError(f"{what} must be a finite positive number of seconds; got {value!r}")
    return float(value)


@dataclass
class _AgentSettings:
    """Per-agent gateway state that is not part of the record: inherited by the agent's children."""

    sampling: dict[str, Any]  # the agent's sampling defaults (over the gateway's)
    policy_only: bool  # a key placed where policy-run code can read it: aux and judge calls are refused
    #: the gateway-enforced step budget this agent's policy calls count against (shared with HTTP-minted children)
    call_cap: _CallCap | None = None
    #: the agent's recorded calls, for token-in history (its own: a child's conversation is its own)
    history: AgentHistory = field(default_factory=AgentHistory)


#: The budget stop's synthetic reply; `{n}` is the cap.
BUDGET_STOP_MESSAGE = (
    "[platoon] The step budget of {n} model calls is used up: no turns are left. Stop here; the task is graded as "
    "it stands."
)
#: Stop replies sent past the cap before further policy calls are refused (400).
MAX_BUDGET_STOPS = 8


@dataclass(eq=False)
class _CallCap:
    """A gateway-enforced step budget: policy calls admitted (recorded or still sampling) and stop replies sent."""

    owner: AgentRecord
    limit: int
    used: int = 0
    stops: int = 0


@dataclass(eq=False)
class RolloutRecorder:
    """One rollout's shared state: its agents in opening order and the interaction map keyed by call id."""

    rollout_id: str
    judges: bool = True
    sampling_precedence: str = "request"
    #: the rollout config's inference params (`temperature`, `top_p`, `top_k`, `max_completion_tokens`)
    config_sampling: dict[str, Any] = field(default_factory=dict)
    agents: list[AgentRecord] = field(default_factory=list)
    interactions: dict[str, Interaction] = field(default_factory=dict)
    #: the rollout's own sampler, when the gateway's binds one per rollout (in-flight sampling); else the gateway's
    sampler: Any = None
    _settings: dict[str, _AgentSettings] = field(default_factory=dict, repr=False)

    def root(self) -> AgentRecord:
        """The rollout's root agent (the first agent opened without a parent)."""
        for agent in self.agents:
            if agent.parent is None:
                return agent
        raise LookupError(f"rollout {self.rollout_id} has no root agent")

    def agent(self, agent_id: str) -> AgentRecord:
        """The agent with this id."""
        for agent in self.agents:
            if agent.agent_id == agent_id:
                return agent
        raise KeyError(agent_id)


# --------------------------------------------------------------------------------------------------------------
# The gateway


class ModelGateway:
    """One per process: owns the sampler, the renderer, the model name, the sampling defaults and the timeouts."""

    #: a hosted-inference backend (`platoon.gateway.hosted.HostedSampler`): when set, calls go to it after the
    #: refusals and the budget stop instead of render -> sample -> parse
    backend: Any = None

    def __init__(
        self,
        sampler: Any,
        renderer: Any,
        *,
        model_name: str,
        max_tokens: int = 4096,
        temperature: float = 1.0,
        top_k: int = -1,
        top_p: float = 1.0,
        seed: int | None = None,
        context_window_length: int | None = None,
        sample_timeout_seconds: float | None = None,
        max_request_tokens: int | None = None,
        max_prompt_tokens: int | None = None,
    ) -> None:
        if context_window_length is not None and context_window_length < 1:
            raise ValueError(
                f"context_window_length must be a positive token count; got {context_window_length!r}"
            )
        #: the most tokens one call may ask to sample (`max_tokens`): more is refused (400), not cut
        self.max_request_tokens = limit_from_env(
            MAX_TOKENS_ENV, DEFAULT_TOKEN_LIMIT, given=max_request_tokens
        )
        #: the longest prompt a call may render, in tokens: longer is refused (400)
        self.max_prompt_tokens = limit_from_env(
            MAX_PROMPT_TOKENS_ENV, DEFAULT_TOKEN_LIMIT, given=max_prompt_tokens
        )
        #: swappable: a worker's following client replaces the sampler when new weights are published
        self.sampler = sampler
        self.renderer = renderer
        self.model_name = model_name
        self.defaults: dict[str, Any] = {
            "max_tokens": max_tokens,
            "temperature": temperature,
            "top_k": top_k,
            "top_p": top_p,
            "seed": seed,
        }
        self.context_window_length = context_window_length
        self.sample_timeout_seconds = resolve_sample_timeout(sample_timeout_seconds)
        # The renderer's stops and render kwargs are fixed for its life: work them out once, not per call.
        self._stop_ids: list[int] = list(renderer.stop_token_ids())
        self._stop_set = frozenset(self._stop_ids)
        self._render_kwargs = _accepted_kwargs(renderer.render_prompt)
        # Renderers that read replies better knowing the prompt and tools (the chat-template one) take them.
        parse = getattr(renderer, "parse_completion", None)  # hosted gateways have no renderer of their own
        self._parse_with_context = parse is not None and _takes_keywords(parse, "prompt", "tools")
        self._dropped_render_kwargs: set[str] = set()
        self._rollouts: dict[str, RolloutRecorder] = {}
        self._by_key: dict[str, AgentRecord] = {}
        self._closed_keys: OrderedDict[str, None] = OrderedDict()
        self._shut_down = False

    @property
    def tokenizer(self) -> Any:
        """The renderer's tokenizer."""
        return self.renderer.tokenizer

    @property
    def is_shut_down(self) -> bool:
        return self._shut_down

    # ---- rollouts and agents -------------------------------------------------------------------------------

    def open_rollout(
        self,
        rollout_id: str | None = None,
        *,
        judges: bool = True,
        sampling_precedence: str = "request",
        config_sampling: Mapping[str, Any] | None = None,
    ) -> RolloutRecorder:
        """Start recording a rollout; its agents are opened with `open_agent` (the root first)."""
        if self._shut_down:
            raise AgentClosed("the model gateway is shutting down: no new rollouts")
        if sampling_precedence not in _PRECEDENCES:
            raise ValueError(
                f"sampling_precedence must be 'request' or 'config'; got {sampling_precedence!r}"
            )
        rollout_id = rollout_id or str(uuid.uuid4())
        if rollout_id in self._rollouts:
            raise ValueError(f"rollout {rollout_id!r} is already open on this gateway")
        config = {k: v for k, v in (config_sampling or {}).items() if v is not None}
        if "max_tokens" in config and "max_completion_tokens" not in config:
            config["max_completion_tokens"] = config.pop("max_tokens")
        rollout = RolloutRecorder(
            rollout_id, judges=judges, sampling_precedence=sampling_precedence, config_sampling=config
        )
        # An in-flight sampler binds the rollout to the client it starts with, whoever makes its calls later.
        bind = getattr(self.sampler, "for_rollout", None)
        rollout.sampler = bind() if callable(bind) else None
        self._rollouts[rollout_id] = rollout
        return rollout

    def rollout(self, rollout_id: str) -> RolloutRecorder:
        """The open rollout with this id."""
        return self._rollouts[rollout_id]

    def release_rollout(self, rollout: RolloutRecorder) -> None:
        """Close the rollout's agents and forget it (its records stay on the `RolloutRecorder`)."""
        for agent in rollout.agents:
            self.close_agent(agent)
        self._rollouts.pop(rollout.rollout_id, None)

    def open_agent(
        self,
        rollout: RolloutRecorder,
        *,
        parent: AgentRecord | None = None,
        role: str = "policy",
        goal: str | None = None,
        task: Task | None = None,
        max_steps: int | None = None,
        access: str | None = None,
        sampling: Mapping[str, Any] | None = None,
        policy_only: bool | None = None,
    ) -> AgentRecord:
        """Mint an agent: a random 256-bit URL-safe secret and fresh agent and trajectory ids.

        A child gets depth+1 and `fork_step` = the parent's step count (its policy and aux calls so far); it
        inherits the parent's access (a narrower `access` may be asked for, never a wider one), sampling defaults
        and policy-only restriction. `sampling` sets this agent's own defaults over the inherited ones.
        """
        if self._shut_down:
            raise AgentClosed("the model gateway is shutting down: no new agents")
        if self._rollouts.get(rollout.rollout_id) is not rollout:
            raise ValueError(f"rollout {rollout.rollout_id!r} is not open on this gateway")
        if access is not None and access not in _ACCESS_RANK:
            raise ValueError(f"access must be one of {', '.join(_ACCESS_RANK)}; got {access!r}")
        if parent is None:
            if any(agent.parent is None for agent in rollout.agents):
                raise ValueError(f"rollout {rollout.rollout_id} already has a root agent; pass parent=")
            depth, fork_step = 0, None
            access = access or "full"
            inherited: dict[str, Any] = {}
            restricted = bool(policy_only)
        else:
            if parent.rollout_id != rollout.rollout_id:
                raise ValueError("a child agent must be opened in its parent's rollout")
            depth = parent.depth + 1
            fork_step = sum(1 for call in parent.calls if call.kind != "judge")
            if access is None or _ACCESS_RANK[access] > _ACCESS_RANK[parent.access]:
                access = parent.access
            parent_settings = rollout._settings[parent.agent_id]
            inherited = parent_settings.sampling
            restricted = parent_settings.policy_only or bool(policy_only)
        agent = AgentRecord(
            agent_id=str(uuid.uuid4()),
            secret=secrets.token_urlsafe(32),
            rollout_id=rollout.rollout_id,
            trajectory_id=str(uuid.uuid4()),
            role=role,
            parent=parent,
            depth=depth,
            fork_step=fork_step,
            goal=goal,
            task=task,
            max_steps=max_steps,
            access=access,
            started=time.perf_counter(),
        )
        own = {k: v for k, v in (sampling or {}).items() if v is not None}
        rollout._settings[agent.agent_id] = _AgentSettings(
            sampling={**inherited, **own} if own else inherited, policy_only=restricted
        )
        rollout.agents.append(agent)
        self._by_key[agent.secret] = agent
        return agent

    def agent_for_key(self, key: str) -> AgentRecord:
        """The open agent a key belongs to: 401 for an unknown key, 410 for a closed agent (the transports' auth)."""
        agent = self._by_key.get(key)
        if agent is not None:
            return agent
        if key in self._closed_keys:
            raise AgentClosed("this agent is closed: its rollout has finished")
        raise AuthenticationFailed("unknown agent key")

    def close_agent(self, agent: AgentRecord) -> None:
        """Close an agent: later calls are refused (410) and nothing more is recorded on it."""
        if agent.closed:
            return
        agent.closed = True
        if agent.ended is None:
            agent.ended = time.perf_counter()
        if self._by_key.pop(agent.secret, None) is not None:
            self._closed_keys[agent.secret] = None
            while len(self._closed_keys) > MAX_CLOSED_KEYS:
                self._closed_keys.popitem(last=False)

    def shut_down(self) -> None:
        """Close every agent and refuse new rollouts and agents (a stopping worker)."""
        self._shut_down = True
        for agent in list(self._by_key.values()):
            self.close_agent(agent)

    # ---- the call path -------------------------------------------------------------------------------------

    async def chat(
        self,
        agent: AgentRecord,
        messages: list[dict[str, Any]],
        *,
        tools: list[dict[str, Any]] | None = None,
        kind: str = "policy",
        **sampling: Any,
    ) -> ChatReply:
        """Render, sample, parse and record one call; `sampling` are Chat Completions parameters."""
        # 1. Refusals before sampling.
        if kind not in _KINDS:
            raise GatewayError(f"unknown call kind {kind!r}: use policy, aux or judge")
        if self._shut_down:
            raise AgentClosed("the model gateway is shutting down")
        if agent.closed:
            raise AgentClosed("this agent is closed: its rollout has finished")
        rollout = self._rollouts.get(agent.rollout_id)
        if rollout is None:
            raise AgentClosed("this agent's rollout is no longer open")
        settings = rollout._settings[agent.agent_id]
        if kind != "policy":
            if settings.policy_only:
                raise PermissionDenied(f"this agent key may make policy calls only, not {kind} calls")
            if kind == "judge" and not rollout.judges:
                agent.misc["judges_refused"] = agent.misc.get("judges_refused", 0) + 1
                raise PermissionDenied("judge calls are disabled for this rollout (judges: false)")
        # The gateway-enforced step budget (a synthetic stop instead of a sample) hooks in here.
        stopped = self._budget_stop(agent, kind)
        if stopped is not None:
            return stopped
        if self.backend is not None:  # hosted inference: forwarded and recorded without tokens
            reply: ChatReply = await self.backend.chat(
                agent, rollout, messages, tools=tools, kind=kind, sampling=sampling
            )
            return reply

        # 2. Prepare the sampling parameters and the render kwargs.
        params, stop, render_kwargs = self._prepare(rollout, settings, kind, sampling)

        # A capped policy call counts against its budget from here (no await since the budget check, so concurrent
        # calls see it; a large prompt's render awaits a thread); a refused, failed or cancelled one gives it back.
        cap = settings.call_cap if kind == "policy" else None
        if cap is not None:
            cap.used += 1
        try:
            # 4, first cheaply: a prompt that cannot fit the context window, or is over the prompt limit, is refused
            # before it renders.
            window = self.context_window_length
            limit = self.max_prompt_tokens
            bounded = window is not None and window <= limit
            bound = window if window is not None and bounded else limit + 1
            # The messages' text is counted once, for both of its uses: this bound, and whether to render off the
            # loop (counting stops past what either needs to know).
            chars = request_chars(messages, None, enough=max(bound, OFF_LOOP_CHARS))
            floor = await self._token_floor(messages, bound, chars)
            if window is not None and bounded:
                if floor >= window:
                    agent.context_overflows += 1
                    raise ContextWindowExceeded(floor, window, at_least=True)
            elif floor > limit:
                raise PromptTooLong(floor, limit, at_least=True)

            # 3. Render (reusing the exact tokens of this agent's earlier calls where the conversation repeats them).
            built = await self._render(agent, messages, tools, render_kwargs, chars)
            prompt = built.tokens

            # 4. Fit to the context window.
            max_tokens = params["max_tokens"]
            if window is not None:
                headroom = window - len(prompt)
                if headroom < 1:
                    agent.context_overflows += 1
                    raise ContextWindowExceeded(len(prompt), window)
                if max_tokens is None or max_tokens > headroom:
                    max_tokens = headroom
            if len(prompt) > limit:
                raise PromptTooLong(len(prompt), limit)

            # 5. Sample once under the sample timeout.
            model_input, sampling_params = _sampling_request(
                prompt,
                {
                    "max_tokens": max_tokens,
                    "seed": params["seed"],
                    "stop": self._stop_ids if stop is None else stop,
                    "temperature": params["temperature"],
                    "top_k": params["top_k"],
                    "top_p": params["top_p"],
                },
            )
        except BaseException:
            if cap is not None:
                cap.used -= 1
            raise
        sampled = False
        started = time.perf_counter()
        try:
            with rollout_progress.bounded_wait(self.sample_timeout_seconds):
                async with asyncio.timeout(self.sample_timeout_seconds):
                    response = await tinker_sdk.sample(
                        rollout.sampler or self.sampler,
                        prompt=model_input,
                        num_samples=1,
                        sampling_params=sampling_params,
                    )
            rollout_progress.note()
            sequences = response.sequences
            if len(sequences) != 1:
                raise SamplingFailed(f"the sampler returned {len(sequences)} sequences for one sample")
            sampled = True
        except TimeoutError:
            agent.gateway_errors += 1
            raise SampleTimeout(
                f"sampling did not finish within the sample timeout of {self.sample_timeout_seconds:g}s"
            ) from None
        except GatewayError:
            agent.gateway_errors += 1
            raise
        except Exception as exc:  # any sampler failure is the gateway's, not the harness's
            agent.gateway_errors += 1
            raise SamplingFailed(f"sampling failed: {type(exc).__name__}: {exc}") from exc
        finally:
            if cap is not None and not sampled:
                cap.used -= 1
        ended = time.perf_counter()
        if ended - started > SLOW_CALL_SECONDS:
            log.warning("slow model call: %.1fs for %d prompt tokens", ended - started, len(prompt))
        sequence = sequences[0]
        tokens = list(sequence.tokens)
        stop_reason = str(sequence.stop_reason)

        # 6. Parse.
        message, generation = self._parse(tokens, stop_reason, stop, prompt=prompt, tools=tools)

        # 7. Record, only while the agent is open (a closed agent's late reply is returned, not recorded).
        # 128 random bits as 32 hex digits, as a uuid4's hex, without building a UUID object on every call.
        call_id = CALL_ID_PREFIX + os.urandom(16).hex()
        if not agent.closed:
            prompt_tokens = tuple(prompt)
            rollout.interactions[call_id] = Interaction(
                call_id=call_id,
                prompt_tokens=prompt_tokens,
                sampled_tokens=tuple(tokens),
                logprobs=tuple(sequence.logprobs or ()),
                stop_reason=stop_reason,
                routing_id=_routing_id(sequence),
                sequence_id=_sequence_id(sequence),
            )
            settings.history.record(
                built, call_id, tokens, message, stop_reason=stop_reason, prompt=prompt_tokens
            )
            generation["history"] = built.history
            n_prompt, n_completion = len(prompt), len(tokens)
            agent.calls.append(
                CallRecord(
                    call_id=call_id,
                    kind=kind,
                    model=self.model_name,
                    message=message,
                    finish_reason=generation["finish_reason"],
                    usage={
                        "prompt_tokens": n_prompt,
                        "completion_tokens": n_completion,
                        "total_tokens": n_prompt + n_completion,
                    },
                    started=started,
                    ended=ended,
                    generation=generation,
                )
            )
        # The reply gets its own top-level dict: a harness editing it must not rewrite the recorded step.
        return ChatReply(call_id, dict(message), generation["finish_reason"])

    async def _render(
        self,
        agent: AgentRecord,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None,
        render_kwargs: dict[str, Any],
        message_chars: int | None = None,
    ) -> PromptBuild:
        """The prompt of one call. A large request renders in a worker thread: tokenizing megabytes takes
        seconds, and the event loop serves every other agent (and `/healthz`) meanwhile; a small one renders here,
        where it costs less than the thread hop (`OFF_LOOP_CHARS`). A renderer's refusal of a message is the
        caller's error (`InvalidRequest`, 400), not the gateway's. `message_chars`: `request_chars` of the
        messages alone, when the caller counted them already (up to at least `OFF_LOOP_CHARS`)."""
        try:
            if message_chars is None:
                message_chars = request_chars(messages, None)
            # The tools are the same on most calls of an agent: their id and size are looked up, not measured again
            # (the id goes to the render, which needs it too; nothing can change them before it runs here).
            rollout = self._rollouts.get(agent.rollout_id)
            settings = None if rollout is None else rollout._settings.get(agent.agent_id)
            tools_id = None if settings is None or not tools else settings.history.tools_id(tools)
            chars = message_chars
            if chars < OFF_LOOP_CHARS and tools:
                chars += (
                    request_chars((), tools)
                    if settings is None or tools_id is None
                    else settings.history.tools_chars(tools, tools_id)
                )
            if chars < OFF_LOOP_CHARS:
                return self._render_now(agent, messages, tools, render_kwargs, tools_id)
            try:
                return await asyncio.to_thread(self._render_now, agent, messages, tools, render_kwargs)
            except KeyError:
                if agent.rollout_id not in self._rollouts:  # released while the thread rendered
                    raise AgentClosed("this agent's rollout is no longer open") from None
                raise
        except RendererError as exc:
            raise InvalidRequest(f"the messages cannot be rendered: {exc}") from exc

    async def _token_floor(self, messages: list[dict[str, Any]], window: int, chars: int) -> int:
        """A lower bound on the prompt's token count (`platoon.gateway.measure.prompt_token_floor`); 0 when the
        request is too short to matter or the tokenizer's vocabulary cannot be read. `chars`: `request_chars` of
        the messages, counted up to at least `window`."""
        # A character is at most 4 UTF-8 bytes and a token at least one byte: fewer than window / 4 characters
        # cannot reach the window, and most requests stop here.
        if 4 * chars < window:
            return 0
        tokenizer = getattr(self.renderer, "tokenizer", None)
        known, span = known_token_span(tokenizer)
        if not known:  # read once per tokenizer (a vocabulary of 150k tokens), off the loop
            span = await asyncio.to_thread(token_span, tokenizer)
        return 0 if span is None else prompt_token_floor(messages, span)

    def warm_up(self) -> None:
        """The one-time load a first call would otherwise pay: the tokenizer's table for the context-window bound.
        Blocking and thread-safe: `GatewayServer` runs it in a thread before it serves. (The Tinker SDK is not
        imported: a sampler that is one of its clients was made by a process that has imported it.)"""
        if self.context_window_length is not None:
            token_span(getattr(self.renderer, "tokenizer", None))

    async def prompt_length(
        self,
        agent: AgentRecord,
        messages: list[dict[str, Any]],
        *,
        tools: list[dict[str, Any]] | None = None,
        render_kwargs: Mapping[str, Any] | None = None,
    ) -> int:
        """The token count of the prompt `chat` would build for this request (Anthropic's `count_tokens`); nothing
        is sampled or recorded. Render kwargs the renderer does not take are dropped, as `chat` drops them."""
        kwargs = self._filter_render_kwargs(dict(render_kwargs)) if render_kwargs else {}
        built = await self._render(agent, messages, tools, kwargs)
        return len(built.tokens)

    def _render_now(
        self,
        agent: AgentRecord,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None,
        render_kwargs: dict[str, Any],
        tools_id: int | None = None,
    ) -> PromptBuild:
        """The prompt of one call, rendered synchronously: token-in history over the agent's recorded calls
        (`tools_id`: the tools' content id, made just before on this thread; None: made here)."""
        rollout = self._rollouts[agent.rollout_id]
        history = rollout._settings[agent.agent_id].history
        return build_prompt(self.renderer, history, messages, tools, render_kwargs, tools_id=tools_id)

    def restrict_to_policy(self, agent: AgentRecord) -> None:
        """Mark `agent` policy-only from now on (its children inherit it): its key is about to be placed where
        model-written code can read it (a harness in a task sandbox), so its aux and judge calls are refused."""
        self._settings_of(agent).policy_only = True

    def set_call_cap(self, agent: AgentRecord, max_calls: int) -> None:
        """Enforce a step budget at the gateway: `agent`'s policy calls, and those of the agents
        it mints over HTTP (`share_call_cap`), in-flight ones included, are capped at `max_calls`; each policy call
        past the cap gets the budget stop reply. The agent's misc `budget` records the cap and the stops."""
        if isinstance(max_calls, bool) or not isinstance(max_calls, int) or max_calls < 0:
            raise ValueError(f"the step budget must be a non-negative number of calls; got {max_calls!r}")
        settings = self._settings_of(agent)
        settings.call_cap = _CallCap(owner=agent, limit=max_calls, used=agent.policy_calls)
        agent.misc["budget"] = {"enforce": "gateway", "max_steps": max_calls, "stops": 0}

    def share_call_cap(self, parent: AgentRecord, child: AgentRecord) -> None:
        """Count `child`'s policy calls against `parent`'s gateway-enforced step budget, if it has one."""
        cap = self._settings_of(parent).call_cap
        if cap is not None:
            self._settings_of(child).call_cap = cap

    def call_cap(self, agent: AgentRecord) -> int | None:
        """The gateway-enforced step budget `agent`'s policy calls count against, or None."""
        cap = self._settings_of(agent).call_cap
        return None if cap is None else cap.limit

    def _settings_of(self, agent: AgentRecord) -> _AgentSettings:
        rollout = self._rollouts.get(agent.rollout_id)
        if rollout is None or agent.agent_id not in rollout._settings:
            raise ValueError(f"agent {agent.agent_id} is not in an open rollout of this gateway")
        return rollout._settings[agent.agent_id]

    def _budget_stop(self, agent: AgentRecord, kind: str) -> ChatReply | None:
        """The gateway-enforced step budget's synthetic stop: a policy call past the
        cap gets a final assistant message, not sampled and not recorded; past `MAX_BUDGET_STOPS` it is refused."""
        if kind != "policy":
            return None
        rollout = self._rollouts.get(agent.rollout_id)
        settings = None if rollout is None else rollout._settings.get(agent.agent_id)
        cap = None if settings is None else settings.call_cap
        if cap is None or cap.used < cap.limit:
            return None
        if cap.stops >= MAX_BUDGET_STOPS:
            raise GatewayError(
                f"the step budget of {cap.limit} model calls is used up and {MAX_BUDGET_STOPS} stop replies were "
                "sent: no further model calls are answered"
            )
        cap.stops += 1
        budget = cap.owner.misc.get("budget")
        if isinstance(budget, dict):
            budget["stops"] = cap.stops
        else:
            cap.owner.misc["budget"] = {"enforce": "gateway", "max_steps": cap.limit, "stops": cap.stops}
        message = {
            "role": "assistant",
            "content": BUDGET_STOP_MESSAGE.format(n=cap.limit),
            "tool_calls": None,
            "reasoning_content": None,
        }
        return ChatReply(BUDGET_STOP_CALL_PREFIX + uuid.uuid4().hex, message, "stop")

    def _prepare(
        self, rollout: RolloutRecorder, settings: _AgentSettings, kind: str, request: dict[str, Any]
    ) -> tuple[dict[str, Any], list[Any] | None, dict[str, Any]]:
        """Sampling = the request's own over the agent's defaults over the rollout's inference params over the
        gateway's; the config's for policy calls under `sampling_precedence: config`. Returns the params, the
        caller's stop list (None: the renderer's stop tokens) and the render kwargs."""
        own: dict[str, Any] = {}
        render_kwargs: dict[str, Any] = {}
        stop: list[Any] | None = None
        if request:
            extra = request.get("extra_body")
            if isinstance(extra, Mapping):
                # OpenAI clients send extra_body keys at the top level; the top level wins.
                request = {**extra, **request}
            for key, value in request.items():
                if value is None:
                    continue
                if key in ("max_tokens", "max_completion_tokens"):
                    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                        raise GatewayError(f"{key} must be a non-negative integer; got {value!r}")
                    if value > self.max_request_tokens:
                        raise GatewayError(
                            f"{key} is {value}, over the gateway's limit of {self.max_request_tokens} tokens "
                            f"({MAX_TOKENS_ENV} raises it)"
                        )
                    if key == "max_completion_tokens" or "max_completion_tokens" not in request:
                        own["max_tokens"] = value
                elif key == "temperature":
                    own[key] = _number(key, value, 0.0, 2.0)
                elif key == "top_p":
                    own[key] = _number(key, value, 0.0, 1.0)
                elif key in ("top_k", "seed"):
                    if isinstance(value, bool) or not isinstance(value, int):
                        raise GatewayError(f"{key} must be an integer; got {value!r}")
                    own[key] = value
                elif key == "stop":
                    stop = _stop_list(value)
                elif key == "chat_template_kwargs":
                    if not isinstance(value, Mapping):
                        raise GatewayError("chat_template_kwargs must be an object")
                    render_kwargs.update(value)
                elif key == "reasoning_effort":
                    if value == "none":
                        render_kwargs.setdefault("enable_thinking", False)
                elif key == "n":
                    if value != 1:
                        raise GatewayError(f"n must be 1; got {value!r}")
                elif key not in _IGNORED_PARAMS and key != "extra_body":
                    raise GatewayError(f"unsupported sampling parameter {key!r}")
        config = rollout.config_sampling
        # The rollout's inference params fill what neither the call nor the agent's defaults set.
        filled: dict[str, Any] = {k: config[k] for k in ("temperature", "top_p", "top_k") if k in config}
        if "max_completion_tokens" in config:
            filled["max_tokens"] = config["max_completion_tokens"]
        params = {**self.defaults, **filled, **settings.sampling, **own}
        if kind == "policy" and rollout.sampling_precedence == "config":
            for key in ("temperature", "top_p", "top_k"):
                params[key] = config.get(key, self.defaults[key])
            if "max_completion_tokens" in config:
                params["max_tokens"] = config["max_completion_tokens"]
        if render_kwargs:
            render_kwargs = self._filter_render_kwargs(render_kwargs)
        return params, stop, render_kwargs

    def _filter_render_kwargs(self, kwargs: dict[str, Any]) -> dict[str, Any]:
        accepted = self._render_kwargs
        if accepted is None:
            return kwargs
        kept = {k: v for k, v in kwargs.items() if k in accepted}
        for name in kwargs.keys() - kept.keys():
            if name not in self._dropped_render_kwargs:  # logged once per name, not per call
                self._dropped_render_kwargs.add(name)
                log.info("the renderer takes no %r render kwarg: ignored", name)
        return kept

    def _parse(
        self,
        tokens: list[int],
        stop_reason: str,
        stop: list[Any] | None,
        *,
        prompt: list[int],
        tools: list[dict[str, Any]] | None,
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        """The assistant message and the generation counters of one sampled sequence."""
        # The renderer reads content, reasoning and tool blocks; the text of blocks it did not emit (unparsed
        # ones included) stays in the content where the model wrote it, so the harness sees what the model wrote.
        if self._parse_with_context:
            parsed = self.renderer.parse_completion(tokens, stop_reason, prompt=prompt, tools=tools or None)
        else:
            parsed = self.renderer.parse_completion(tokens, stop_reason)
        raw = parsed.message
        content = raw.get("content")
        if not isinstance(content, str):
            content = "" if content is None else str(content)
        # Tool calls only when a stop token was sampled and the budget did not run out: a truncated response
        # never runs tools. Enforced here too, whatever the renderer did; a stop *string* is not a stop token.
        last = tokens[-1] if tokens else None
        emit = stop_reason != "length" and (last in self._stop_set if stop is None else last in stop)
        calls = raw.get("tool_calls") or ()
        if emit:
            tool_calls = [_openai_tool_call(call) for call in calls]
        else:
            tool_calls = []
            # Rare: a renderer that emitted calls the rule forbids (a caller's stop list); keep their text visible,
            # in place when the renderer says how the content reads without them.
            unemitted = getattr(parsed, "unemitted_content", None)
            if calls and isinstance(unemitted, str):
                content = unemitted
            else:
                for call in calls:
                    function = _openai_tool_call(call)["function"]
                    content += json.dumps({"name": function["name"], "arguments": function["arguments"]})
        reasoning = raw.get("reasoning_content") or None
        if tool_calls:
            finish_reason = "tool_calls"
        elif stop_reason == "length":
            finish_reason = "length"
        else:
            finish_reason = "stop"
        message = {
            "role": "assistant",
            "content": content,
            "tool_calls": tool_calls or None,
            "reasoning_content": reasoning,
        }
        generation = {
            "stop_reason": stop_reason,
            "generated_tokens": len(tokens),
            "parse_success": bool(getattr(parsed, "ok", True)),
            "parsed_tool_calls": _count(getattr(parsed, "parsed_tool_calls", 0)),
            "emitted_tool_calls": len(tool_calls),
            "recovered_tool_calls": _count(getattr(parsed, "recovered_tool_calls", 0)),
            "unparsed_tool_calls": _count(getattr(parsed, "unparsed_tool_calls", 0)),
            "finish_reason": finish_reason,
        }
        return message, generation


# --------------------------------------------------------------------------------------------------------------
# Helpers


def _parameters(fn: Any) -> tuple[inspect.Parameter, ...] | None:
    """`fn`'s parameters as `inspect.signature` lists them (None where it has none); a bound method's are read once
    per function, since every gateway asks about its renderer's methods."""
    function, bound_to = getattr(fn, "__func__", None), getattr(fn, "__self__", None)
    if function is None or bound_to is None or not inspect.isfunction(function):
        return _signature_parameters(fn)
    listed = _function_parameters(function)
    if not listed or listed[0].kind is inspect.Parameter.VAR_POSITIONAL:
        return _signature_parameters(fn)  # inspect's own answer for what binding does not simply shorten
    return listed[1:]  # the bound `self` (or `cls`) is given


@functools.lru_cache(maxsize=64)
def _function_parameters(function: Any) -> tuple[inspect.Parameter, ...] | None:
    return _signature_parameters(function)


def _signature_parameters(fn: Any) -> tuple[inspect.Parameter, ...] | None:
    try:
        return tuple(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return None


def _takes_keywords(fn: Any, *names: str) -> bool:
    """Whether `fn` can be called with these keyword arguments."""
    listed = _parameters(fn)
    if listed is None:
        return False
    parameters = {param.name: param for param in listed}
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()):
        return True
    return all(
        name in parameters
        and parameters[name].kind in (inspect.Parameter.KEYWORD_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
        for name in names
    )


def _accepted_kwargs(fn: Any) -> frozenset[str] | None:
    """The keyword names `fn` takes beyond messages and tools; None when it takes any (`**kwargs`)."""
    parameters = _parameters(fn)
    if parameters is None:
        return frozenset()
    names = set()
    for position, param in enumerate(parameters):
        if position == 0:  # the messages
            continue
        if param.kind is inspect.Parameter.VAR_KEYWORD:
            return None
        if param.kind in (inspect.Parameter.KEYWORD_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD):
            names.add(param.name)
    return frozenset(names - {"tools"})


def _number(key: str, value: Any, low: float, high: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not low <= value <= high:
        raise GatewayError(f"{key} must be a number in [{low:g}, {high:g}]; got {value!r}")
    return float(value)


def _stop_list(value: Any) -> list[Any]:
    if isinstance(value, (str, int)) and not isinstance(value, bool):
        return [value]
    if isinstance(value, Sequence) and all(
        isinstance(item, (str, int)) and not isinstance(item, bool) for item in value
    ):
        return list(value)
    raise GatewayError(f"stop must be a string or a list of strings or token ids; got {value!r}")


def _count(value: Any) -> int:
    if isinstance(value, (list, tuple)):
        return len(value)
    return int(value or 0)


def _routing_id(sequence: Any) -> str | None:
    # Workers patch the response model to keep the per-sequence routing id; otherwise it is an extra.
    # Read from the instance dict: a missing attribute on a pydantic model costs a slow __getattr__ fallback.
    fields = getattr(sequence, "__dict__", None) or {}
    routing = fields.get("routing_id")
    if routing is None:
        extra = getattr(sequence, "__pydantic_extra__", None)
        if extra:
            routing = extra.get("routing_id")
    return None if routing is None else str(routing)


def _sequence_id(sequence: Any) -> str | None:
    # SDKs from 0.38 stamp each sequence with its id; older ones have no such field (read from the instance dict,
    # as `_routing_id` does, to skip pydantic's slow fallback for a missing attribute).
    fields = getattr(sequence, "__dict__", None) or {}
    found = fields.get("sequence_id")
    return str(found) if found else None


def _openai_tool_call(call: Any) -> dict[str, Any]:
    """An OpenAI tool-call dict with JSON-string arguments and an id (minted when the renderer gave none)."""
    if isinstance(call, Mapping):
        function = call.get("function")
        if not isinstance(function, Mapping):
            function = call
        call_id = call.get("id")
        name = function.get("name")
        arguments = function.get("arguments")
    else:
        function = getattr(call, "function", None) or call
        call_id = getattr(call, "id", None)
        name = getattr(function, "name", None)
        arguments = getattr(function, "arguments", None)
    if not isinstance(arguments, str):
        arguments = json.dumps({} if arguments is None else arguments, ensure_ascii=False)
    return {
        "id": call_id or f"call_{uuid.uuid4().hex[:24]}",
        "type": "function",
        "function": {"name": name, "arguments": arguments},
    }
