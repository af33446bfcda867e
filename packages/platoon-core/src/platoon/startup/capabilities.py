"""The start's capability check: what the Tinker service says it can do (its server-capabilities answer), checked
against the config before the first rollout, each refusal one line (exit 78).

The answer lists the models a service serves (with their context length, and whether they train and sample on
SDKs from 0.25 on); platoon's local server adds the loss functions it computes (`supported_loss_fns`). A service
that lists no losses is asked with a one-datum `forward` of the configured loss on the run's training client: it
changes no weights, and a 4xx answer means the service would refuse every update. `platoon config validate` asks
the same answer where it can reach the service (it creates no training client, so it cannot probe a loss).
Where the installed SDK asks the service's client-config route before its first call (0.25 on), `config validate`
and `platoon eval` ask it too, and a service without it (skyrl-tx 0.3.0) is refused naming the SDK to install.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from platoon.errors import ConfigError
from platoon.extras import installed
from platoon.gateway.tinker_sdk import asks_client_config, installed_release
from platoon.gateway.tinker_service import (
    CLIENT_CONFIG_PATH,
    check_tinker_key,
    missing_client_config_error,
    refused_key_error,
    uses_local_server,
)
from platoon.startup.retired_models import retired

if TYPE_CHECKING:
    from platoon.config.training import PlatoonTinkerRLTrainerConfig
    from platoon.eval.policy import PolicySpec

__all__ = [
    "Capabilities",
    "ServedModel",
    "TrainingServiceCheck",
    "ask_capabilities",
    "capability_problems",
    "client_config_problem",
    "loss_probe_problem",
    "policy_problems",
    "service_name",
    "service_problems",
]

#: the Tinker API route of the server-capabilities answer
CAPABILITIES_PATH = "/api/v1/get_server_capabilities"
#: the longest service message a refusal quotes
DETAIL_LIMIT = 300
#: how long `config validate` waits for a service's answer before it leaves the service unchecked
VALIDATE_TIMEOUT_SECONDS = 20.0


@dataclass(frozen=True)
class ServedModel:
    """One model of a capabilities answer; None where the service does not say."""

    name: str
    max_context_length: int | None = None
    trainable: bool | None = None
    sampleable: bool | None = None


@dataclass(frozen=True)
class Capabilities:
    """What a service says it can do: its models, and the loss functions it computes (None: it does not say)."""

    models: tuple[ServedModel, ...]
    loss_fns: tuple[str, ...] | None = None

    @classmethod
    def from_answer(cls, answer: Any) -> Capabilities:
        """Read a capabilities answer (its JSON), keeping what is well formed."""
        body = answer if isinstance(answer, Mapping) else {}
        models: list[ServedModel] = []
        for entry in body.get("supported_models") or ():
            if not isinstance(entry, Mapping) or not isinstance(entry.get("model_name"), str):
                continue
            context = entry.get("max_context_length")
            models.append(
                ServedModel(
                    entry["model_name"],
                    context if isinstance(context, int) and not isinstance(context, bool) else None,
                    _flag(entry.get("trainable")),
                    _flag(entry.get("sampleable")),
                )
            )
        losses = body.get("supported_loss_fns")
        listed = tuple(str(name) for name in losses) if isinstance(losses, list) else None
        return cls(tuple(models), listed)

    def model(self, name: str) -> ServedModel | None:
        return next((model for model in self.models if model.name == name), None)


def _flag(value: Any) -> bool | None:
    return value if isinstance(value, bool) else None


def service_name(base_url: str | None, *, local: bool = False) -> str:
    """How a refusal names the service: the local server, a URL, or hosted Tinker (the SDK's default URL)."""
    if local:
        return "the local Tinker server"
    if base_url:
        return f"the Tinker service at {base_url.rstrip('/')}"
    return "hosted Tinker (the SDK's default URL)"


async def ask_capabilities(
    base_url: str | None, api_key: str | None, *, max_retries: int = 3, timeout: float = 60.0
) -> Capabilities:
    """The service's capabilities answer, asked with the SDK's own HTTP client (its default URL, headers and
    proxies). The SDK's typed answer drops the fields it does not know (the local server's `supported_loss_fns`),
    so the answer is read as JSON; a service without the route (404) answers no capabilities."""
    client = _http_client(base_url, api_key, max_retries=max_retries, timeout=timeout)
    try:
        answer = await client.get(CAPABILITIES_PATH, cast_to=object)
    except Exception as exc:
        if _status(exc)[0] in (404, 405, 501):
            return Capabilities(())
        raise
    finally:
        await client.close()
    return Capabilities.from_answer(answer)


def _http_client(base_url: str | None, api_key: str | None, *, max_retries: int, timeout: float) -> Any:
    """The SDK's own HTTP client of the service (its default URL, headers and proxies)."""
    from tinker._client import AsyncTinker

    kwargs: dict[str, Any] = {"api_key": api_key, "max_retries": max_retries, "timeout": timeout}
    if api_key is not None:
        # the key also as the header older SDKs send it in (the trainer withholds TINKER_API_KEY from its env)
        kwargs["default_headers"] = {"X-API-Key": api_key}
    if base_url is not None:
        kwargs["base_url"] = base_url
    return AsyncTinker(**kwargs)


async def client_config_problem(base_url: str | None, api_key: str | None) -> str | None:
    """The one-line refusal of a service that lacks the client-config route the installed SDK asks before its first
    call (0.25 on; none is asked before), else None: `config validate` says what the start would meet."""
    if not asks_client_config():
        return None
    client = _http_client(base_url, api_key, max_retries=0, timeout=VALIDATE_TIMEOUT_SECONDS)
    try:
        await client.post(CLIENT_CONFIG_PATH, body={"sdk_version": installed_release()}, cast_to=object)
    except Exception as exc:  # anything but a missing route is left for the start to meet
        missing = missing_client_config_error(exc, base_url=base_url)
        return missing.problems[0] if missing is not None else None
    finally:
        await client.close()
    return None


def capability_problems(
    capabilities: Capabilities,
    *,
    model: str,
    who: str,
    train: bool,
    loss_fn: str | None = None,
    context_window_length: int | None = None,
    prefix: str = "train",
) -> list[str]:
    """What the answer says the run cannot do, one line each: a model the service does not list (a retired one
    with the replacement hosted Tinker recommends), one it lists as not trainable (`train`) or not sampleable, a
    context window past the model's, a loss function it does not list."""
    problems: list[str] = []
    served = capabilities.model(model)
    if served is None and capabilities.models:
        why = retired(model)
        names = ", ".join(entry.name for entry in capabilities.models)
        gone = f" ({why})" if why else ""
        problems.append(
            f"{prefix}.model_name: {who} does not serve {model!r}{gone}; it serves {names}: set "
            f"{prefix}.model_name to one of them"
        )
    if served is not None:
        use, able = ("train", served.trainable) if train else ("sample", served.sampleable)
        if able is False:
            problems.append(
                f"{prefix}.model_name: {who} lists {model!r} but cannot {use} it now; pick another model it serves"
            )
        limit = served.max_context_length
        if context_window_length is not None and limit is not None and context_window_length > limit:
            problems.append(
                f"{prefix}.context_window_length: {context_window_length} is over the {limit} tokens {who} gives "
                f"{model!r}: lower it to {limit} or less, or leave it unset"
            )
    listed = capabilities.loss_fns
    if loss_fn is not None and listed is not None and loss_fn not in listed:
        problems.append(
            f"{prefix}.loss_fn: {who} does not compute the loss {loss_fn!r}; it computes {', '.join(listed)}: set "
            f"{prefix}.loss_fn to one of them"
        )
    return problems


#: losses a one-token probe cannot ask about: a `stable_reinforce` datum must name sequences the service sampled
#: (its provenance), so a made-up one is refused whether or not the service computes the loss. The installed SDK's
#: loss list (checked before) is all that is known of them until the first update.
UNPROBED_LOSS_FNS = frozenset({"stable_reinforce"})


def _probe_datum(loss_fn: str) -> Any:
    """One datum of one token for `loss_fn`, with every input the trainer sends (zero advantages and weights: it
    would change nothing even if it were trained)."""
    from tinker import types

    inputs: dict[str, Any] = {"target_tokens": [0]}
    if loss_fn == "cross_entropy":
        inputs["weights"] = [0.0]
    else:
        inputs["logprobs"] = [0.0]
        inputs["advantages"] = [0.0]
    return types.Datum(model_input=types.ModelInput.from_ints([0]), loss_fn_inputs=inputs)


def _status(exc: BaseException) -> tuple[int | None, Any]:
    """(HTTP status, the error) of `exc` or the first of its causes that carries one."""
    seen: BaseException | None = exc
    for _ in range(10):
        if seen is None:
            break
        status = getattr(seen, "status_code", None)
        if isinstance(status, int):
            return status, seen
        seen = seen.__cause__ or seen.__context__
    return None, exc


def _detail(error: Any) -> str:
    """The service's own words in an error, on one line: FastAPI's `detail` list joins its messages."""
    body = getattr(error, "body", None)
    if isinstance(body, (bytes, str)):
        try:
            body = json.loads(body)
        except ValueError:
            pass
    found: Any = (
        body.get("detail") or body.get("error") or body.get("message") if isinstance(body, Mapping) else body
    )
    if isinstance(found, list):
        found = "; ".join(
            str(item.get("msg")) if isinstance(item, Mapping) and item.get("msg") else str(item)
            for item in found
        )
    text = found if isinstance(found, str) and found else str(getattr(error, "message", None) or error)
    text = " ".join(text.split())
    return text if len(text) <= DETAIL_LIMIT else text[: DETAIL_LIMIT - 3] + "..."


async def loss_probe_problem(
    training_client: Any,
    loss_fn: str,
    loss_fn_config: Mapping[str, Any] | None,
    *,
    who: str,
    prefix: str = "train",
) -> str | None:
    """Whether the service computes `loss_fn` with `loss_fn_config`, asked with a one-datum `forward` (which
    changes no weights): the refusal when it answers 4xx, else None. Any other failure is left to the run."""
    import pydantic

    config = {key: float(value) for key, value in (loss_fn_config or {}).items() if value is not None} or None
    try:
        future = training_client.forward([_probe_datum(loss_fn)], loss_fn, config)
        if asyncio.iscoroutine(future):
            future = await future
        await future
    except pydantic.ValidationError:
        # the SDK itself refuses the request (the offline check names the loss first; this is a knob)
        return f"{prefix}.loss_fn_config: the installed Tinker SDK refuses {loss_fn!r} with {config}"
    except Exception as exc:
        status, error = _status(exc)
        if status is None or not 400 <= status < 500 or status in (401, 403, 408, 409, 429):
            return None  # not a refusal of the request: the run meets it, and says so, if it persists
        knobs = f" with loss_fn_config {json.dumps(config, sort_keys=True)}" if config else ""
        return (
            f"{prefix}.loss_fn: {who} refused a forward with the loss {loss_fn!r}{knobs} (HTTP {status}: "
            f"{_detail(error)}): set {prefix}.loss_fn (and {prefix}.loss_fn_config) to what it computes"
        )
    return None


class TrainingServiceCheck:
    """A training start's capability check. The answer is asked once: by the start itself, before it holds the run
    directory, for a service it can reach at once; as the trainer's session opens, before the training client is
    created (a model the service does not serve would fail there), for the local server it starts. The loss probe
    follows the training client's creation. Both come before the launch checkpoint and the first rollout."""

    def __init__(self, config: PlatoonTinkerRLTrainerConfig) -> None:
        self.config = config
        self.capabilities: Capabilities | None = None

    def _who(self, base_url: str | None) -> str:
        return service_name(base_url, local=uses_local_server(self.config.tinker_base_url))

    async def before_training_client(
        self, base_url: str | None, api_key: str | None, *, early: bool = False
    ) -> None:
        """Ask the service (once) and raise ConfigError with every problem its answer shows; a refused key is its
        one-line refusal. `early` (the start, before the trainer): a service out of reach is left for the trainer,
        which asks again as its session opens and says what it meets."""
        if self.capabilities is not None:
            return
        train = self.config.train
        try:
            answer = await ask_capabilities(base_url, api_key, max_retries=1 if early else 3)
        except Exception as exc:
            refused = refused_key_error(exc, base_url=base_url, what="its capabilities")
            if refused is not None:
                raise refused from None
            if early:
                return
            raise
        self.capabilities = answer
        problems = capability_problems(
            self.capabilities,
            model=train.model_name,
            who=self._who(base_url),
            train=True,
            loss_fn=train.loss_fn,
            context_window_length=train.context_window_length,
        )
        if problems:
            raise ConfigError(problems)

    async def with_training_client(self, client: Any, base_url: str | None) -> None:
        """Probe the configured loss where the answer did not list the service's losses."""
        if self.capabilities is not None and self.capabilities.loss_fns is not None:
            return
        train = self.config.train
        if train.loss_fn in UNPROBED_LOSS_FNS:
            return
        problem = await loss_probe_problem(
            client, train.loss_fn, train.loss_fn_config, who=self._who(base_url)
        )
        if problem is not None:
            raise ConfigError(problem)


def service_problems(config: PlatoonTinkerRLTrainerConfig) -> list[str]:
    """`config validate`'s capability check of a training config's service (not the local server, which only a
    start builds): the problems of its answer, asked once; none when it is out of reach within
    `VALIDATE_TIMEOUT_SECONDS` or answers no capabilities (the start then says what it meets)."""
    if uses_local_server(config.tinker_base_url) or not installed("tinker"):
        return []
    try:
        api_key = check_tinker_key(config.tinker_base_url)
    except ConfigError:  # the preflight said so already
        return []
    base_url = config.tinker_base_url or os.environ.get("TINKER_BASE_URL") or None
    missing_route = asyncio.run(client_config_problem(base_url, api_key))
    if missing_route is not None:
        return [missing_route]
    capabilities = asyncio.run(_answer_once(base_url, api_key))
    if capabilities is None:
        return []
    train = config.train
    return capability_problems(
        capabilities,
        model=train.model_name,
        who=service_name(base_url),
        train=True,
        loss_fn=train.loss_fn,
        context_window_length=train.context_window_length,
    )


async def policy_problems(spec: PolicySpec) -> list[str]:
    """An evaluation's capability check of the Tinker service its policy samples (`platoon eval` and `config
    validate`; not the local server, not a hosted model): a service without the route the installed SDK asks
    first, a base model the service does not serve or cannot sample, a context window past the model's. A
    checkpoint (`inference.model_path`) is the service's to open."""
    if spec.backend != "tinker" or uses_local_server(spec.base_url):
        return []
    if not installed("tinker"):
        return []
    try:
        api_key = check_tinker_key(spec.base_url)
    except ConfigError:  # the key check says so
        return []
    base_url = spec.tinker_base_url()
    missing_route = await client_config_problem(base_url, api_key)
    if missing_route is not None:
        return [missing_route]
    if spec.model_path is not None:
        return []
    capabilities = await _answer_once(base_url, api_key)
    if capabilities is None:
        return []
    return capability_problems(
        capabilities,
        model=spec.model,
        who=service_name(base_url),
        train=False,
        context_window_length=spec.context_window_length,
        prefix="inference",
    )


async def _answer_once(base_url: str | None, api_key: str | None) -> Capabilities | None:
    """The service's answer, asked once within `VALIDATE_TIMEOUT_SECONDS`; None when it is out of reach."""
    try:
        return await ask_capabilities(base_url, api_key, max_retries=0, timeout=VALIDATE_TIMEOUT_SECONDS)
    except Exception:  # out of reach, or no answer: what can be checked is checked
        return None
