"""The environment contract: services open sessions on tasks, sessions expose tools and grade.

Standard library only. `Outcome` says whether a measurement is valid: infrastructure failures are untrainable
outcomes, never reward 0.
"""

from __future__ import annotations

import dataclasses
import enum
import inspect
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, Protocol, runtime_checkable

if TYPE_CHECKING:  # pragma: no cover
    from platoon.task import Task

__all__ = [
    "OUTCOME_STATUSES",
    "REASON_LIMIT",
    "EnvNotPrepared",
    "EnvSession",
    "EnvSetupError",
    "EnvironmentService",
    "ForkMode",
    "Outcome",
    "OutcomeStatus",
    "SessionNeeds",
    "ToolResult",
    "ToolSpec",
    "infra_from_exception",
    "open_accepts_needs",
    "task_check_refusals",
]

#: an error text kept as an outcome's reason is cut here (the full text stays on the agent's result)
REASON_LIMIT = 500

OutcomeStatus = Literal["scored", "invalid", "error", "timeout", "cancelled"]

#: Every outcome status; only `scored` is trainable.
OUTCOME_STATUSES: tuple[str, ...] = ("scored", "invalid", "error", "timeout", "cancelled")


@dataclass
class Outcome:
    """The result of grading a session (or of failing to).

    A `scored` outcome carries its primary reward under `rewards[primary]`; every other status is untrainable.
    Metadata `grade_reason` keeps the grader's own reason when the rollout reports another,
    `platoon_zero: true` marks a zero platoon assigned itself, and `evidence` (a mapping: what the grader ran and
    saw, such as a verifier's `exit_code`, `seconds` and `output`) is written with the trajectory's outcome.
    """

    status: OutcomeStatus
    rewards: dict[str, float] = field(default_factory=dict)
    primary: str = "reward"
    reason: str | None = None
    failure_kind: str | None = None
    metadata: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.status not in OUTCOME_STATUSES:
            raise ValueError(
                f"Outcome status must be one of {', '.join(OUTCOME_STATUSES)}; got {self.status!r}"
            )
        if self.status == "scored":
            if self.primary not in self.rewards:
                raise ValueError(
                    f"a scored Outcome needs its primary reward {self.primary!r} in rewards; got {sorted(self.rewards)}"
                )
            value = self.rewards[self.primary]
            # A scored NaN or a bool would train silently wrong; refuse it where it is made.
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise ValueError(f"Outcome reward {self.primary!r} must be a finite number; got {value!r}")

    @property
    def reward(self) -> float | None:
        """The primary reward when scored, else None."""
        return float(self.rewards[self.primary]) if self.status == "scored" else None

    @property
    def trainable(self) -> bool:
        """Whether this outcome may be trained on (status `scored`)."""
        return self.status == "scored"

    @classmethod
    def infra(
        cls,
        failure_kind: str,
        *,
        status: OutcomeStatus = "error",
        reason: str | None = None,
        metadata: Mapping[str, Any] | None = None,
    ) -> Outcome:
        """An untrainable outcome for an infrastructure failure; status `scored` is refused."""
        if status == "scored":
            raise ValueError("Outcome.infra cannot make a scored outcome; use Outcome('scored', ...)")
        return cls(status, reason=reason, failure_kind=failure_kind, metadata=dict(metadata or {}))


def infra_from_exception(exc: BaseException, *, what: str | None = None) -> Outcome:
    """The untrainable outcome of an infrastructure exception: the kind it names in a `failure_kind` attribute
    (`EnvSetupError`'s, a sandbox provider's `SandboxGone` = `sandbox_gone`), else `unexpected:<Type>`; the reason
    is cut at `REASON_LIMIT` characters."""
    named = getattr(exc, "failure_kind", None)
    kind = named if isinstance(named, str) and named else f"unexpected:{type(exc).__name__}"
    said = f"{type(exc).__name__}: {exc}" if what is None else f"{what} raised {type(exc).__name__}: {exc}"
    if len(said) > REASON_LIMIT:
        said = said[: REASON_LIMIT - 3] + "..."
    return Outcome.infra(kind, reason=said)


@dataclass
class ToolSpec:
    """An environment tool: `input_schema` is a JSON schema; `terminal` ends the episode; `read_only` changes nothing."""

    name: str
    description: str
    input_schema: Mapping[str, Any] | None
    terminal: bool = False
    read_only: bool = False
    meta: Mapping[str, Any] | None = None

    def as_openai_tool(self) -> dict[str, Any]:
        """The Chat Completions tool definition (`{"type": "function", "function": {...}}`) for `ctx.chat(tools=...)`."""
        parameters = dict(self.input_schema) if self.input_schema else {"type": "object", "properties": {}}
        return {
            "type": "function",
            "function": {"name": self.name, "description": self.description, "parameters": parameters},
        }


def _block_field(block: Any, key: str) -> Any:
    # Blocks are MCP-style mappings, or SDK objects (openreward's TextBlock/ImageBlock) with the same fields.
    if isinstance(block, Mapping):
        return block.get(key)
    return getattr(block, key, None)


@dataclass
class ToolResult:
    """A tool call's result: content blocks (`{"type": "text", "text": ...}`, images with `mimeType`, ...).

    `finished` ends the episode; `reward` is the environment's reward for this call, if any; metadata
    `{"invalid": true}` marks an invalid grade.
    """

    content: list[Any]
    is_error: bool = False
    finished: bool = False
    reward: float | None = None
    metadata: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def text(cls, text: str, *, is_error: bool = False) -> ToolResult:
        """A result holding one text block."""
        return cls([{"type": "text", "text": text}], is_error=is_error)

    def as_text(self) -> str:
        """Text blocks joined by newlines; any other block written as `[<mimeType or type>]`."""
        parts: list[str] = []
        for block in self.content:
            if isinstance(block, str):
                parts.append(block)
                continue
            kind = _block_field(block, "type")
            text = _block_field(block, "text")
            if kind == "text" or (kind is None and isinstance(text, str)):
                parts.append(str(text or ""))
            else:
                parts.append(f"[{_block_field(block, 'mimeType') or kind}]")
        return "\n".join(parts)


class ForkMode(enum.StrEnum):
    """How a session forks for a child: the same live state, a snapshot copy, or a new session of the task."""

    SHARED = "shared"
    COPY = "copy"
    FRESH = "fresh"


@dataclass
class SessionNeeds:
    """What a rollout prepared before the session opens, for the service to add to its sandbox.

    `apply(spec)` works on any sandbox spec with these attributes (platoon-sandbox's `SandboxSpec` has them):
    `upstreams` (a mapping name -> URL), `mounts` (a sequence of objects with a `.target`) and `memory_mb`
    (an int, or None for no limit).
    """

    upstreams: dict[str, str] = field(default_factory=dict)
    mounts: Sequence[Any] = ()
    extra_memory_mb: int = 0

    def apply[S](self, spec: S) -> S:
        """Add the upstreams and mounts to `spec` and grow its memory limit; returns the updated spec.

        A mount whose target the spec already binds is skipped (the spec's own mount wins); upstreams of the same
        name are replaced (the rollout's are what this session must reach). The memory limit grows only when the
        spec has one. A mutable spec is updated in place; a frozen dataclass is copied with `dataclasses.replace`.
        """
        s: Any = spec
        changes: dict[str, Any] = {}
        if self.upstreams:
            changes["upstreams"] = {**dict(s.upstreams or {}), **self.upstreams}
        existing = list(s.mounts or ())
        bound = {mount.target for mount in existing}
        added = []
        for mount in self.mounts:
            if mount.target not in bound:
                added.append(mount)
                bound.add(mount.target)
        if added:
            merged = existing + added
            changes["mounts"] = tuple(merged) if isinstance(s.mounts, tuple) else merged
        if self.extra_memory_mb and s.memory_mb:
            changes["memory_mb"] = s.memory_mb + self.extra_memory_mb
        if not changes:
            return spec
        try:
            for name, value in changes.items():
                setattr(s, name, value)
        except AttributeError:  # dataclasses.FrozenInstanceError is an AttributeError
            if not dataclasses.is_dataclass(s) or isinstance(s, type):
                raise TypeError(
                    f"cannot apply session needs to {type(s).__name__}: it is immutable"
                ) from None
            replaced: Any = dataclasses.replace(s, **changes)
            return replaced
        return spec


class EnvSetupError(Exception):
    """A session could not be opened; `failure_kind` names the infra outcome (`env_setup`, `env_connect`, ...)."""

    def __init__(self, failure_kind: str, message: str) -> None:
        super().__init__(message)
        self.failure_kind = failure_kind
        self.message = message


class EnvNotPrepared(EnvSetupError):
    """A prepared artifact the environment needs is missing on this site (failure kind `env_config`)."""

    def __init__(self, message: str) -> None:
        super().__init__("env_config", message)


async def unknown_split(service: Any, split: str) -> str | None:
    """Why `split` is not a split `service` has: "no split 'x'; known splits: a, b" from its optional
    `list_splits`; None when it has the split, or lists none (then its `list_tasks` alone decides).

    Training, evaluation and `platoon config validate` ask this before listing a split by name, whatever the
    service, so that a misspelt or missing split stops the start with one line instead of listing other tasks.
    """
    ask = getattr(service, "list_splits", None)
    if ask is None:
        return None
    try:
        known = [str(s) for s in await _maybe_await(ask())]
    except Exception:  # the listing that follows reports the service's failure in its own words
        return None
    if not known or split in known:
        return None
    return f"no split {split!r}; known splits: {', '.join(known)}"


async def _maybe_await(value: Any) -> Any:
    return await value if inspect.isawaitable(value) else value


async def task_check_refusals(service: Any, tasks: Iterable[tuple[str, str]]) -> list[str]:
    """Why `service` refuses `tasks` (`(split, task id)` pairs) before a run starts: its optional `check_tasks`,
    asked once per split with that split's ids, in order; [] when it accepts them all or has no such method.

    Training, evaluation and `platoon rollout` ask this of the tasks they would use, so that a task the environment
    would refuse at every open (a provider that cannot run it, an image not built) stops the start with one line
    and exit 78, instead of failing each rollout as it comes.
    """
    check = getattr(service, "check_tasks", None)
    if check is None:
        return []
    by_split: dict[str, list[str]] = {}
    for split, task_id in tasks:
        by_split.setdefault(split, []).append(task_id)
    refusals: list[str] = []
    for split, ids in by_split.items():
        try:
            await check(split, ids)
        except EnvSetupError as exc:
            refusals.append(exc.message)
        except Exception as exc:  # the environment's own code: one line, as a listing failure is
            refusals.append(f"checking the tasks of split {split!r} failed: {type(exc).__name__}: {exc}")
    return refusals


@runtime_checkable
class EnvSession(Protocol):
    """A live environment for one agent tree.

    Optional attributes a runtime reads with `getattr`: `manages_concurrency`, `network_isolated`,
    `host_loopback`, `agent_timeout_s`.
    """

    @property
    def task(self) -> Task:
        """The task this session runs."""
        ...

    @property
    def instruction(self) -> str | None:
        """The environment's instruction for the task (an ORS prompt, a Harbor instruction), if it has one."""
        ...

    @property
    def sandbox(self) -> Any:
        """The task sandbox, or None when the environment has none."""
        ...

    async def tools(self) -> list[ToolSpec]:
        """Every tool of the session, with terminal and read-only flags (access filtering is the agent's)."""
        ...

    async def call_tool(self, name: str, arguments: Mapping[str, Any]) -> ToolResult:
        """Run a tool; bad calls return error results."""
        ...

    async def grade(self) -> Outcome:
        """Grade the session; infrastructure failures return `error` or `invalid` outcomes, never raise."""
        ...

    async def fork(self, mode: ForkMode | str = ForkMode.SHARED, *, task: Task | None = None) -> EnvSession:
        """A session for a child agent: `shared` state, a `copy`, or a `fresh` session of the task."""
        ...

    async def close(self) -> None:
        """Release the session; idempotent."""
        ...


@runtime_checkable
class EnvironmentService(Protocol):
    """A source of tasks and sessions.

    Optional members a runtime looks up with `getattr`: `async list_splits()`, `async list_task_names(split) ->
    {task_id: name}`, `async check_tasks(split, ids)` (raises an `env_config` error for tasks it would refuse),
    `rollout_overhead_s(task_id)`, `agent_timeout_s(task_id)`, `task_columns(ids)`, `split_record()`, and the
    class attributes `path_options` and `DEPRECATED_KEYS`. `open` may also accept `needs: SessionNeeds` (it is
    passed only when the signature takes it; see `open_accepts_needs`).
    """

    @property
    def name(self) -> str:
        """The service's name, as configs and records show it."""
        ...

    async def list_tasks(self, split: str) -> list[str]:
        """The task ids of `split`."""
        ...

    async def get_task(self, task_id: str) -> Task:
        """The task with `task_id`."""
        ...

    async def open(self, task: Task, *, rollout_id: str) -> EnvSession:
        """Open a session on `task`; setup failures raise `EnvSetupError` (`EnvNotPrepared` for missing artifacts)."""
        ...


def open_accepts_needs(open_fn: Callable[..., Any]) -> bool:
    """Whether a service's `open` takes `needs` (a parameter of that name, or `**kwargs`)."""
    try:
        parameters = inspect.signature(open_fn).parameters.values()
    except (TypeError, ValueError):
        return False
    return any(p.name == "needs" or p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters)
