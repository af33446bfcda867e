"""`service: python://pkg.mod:EnvClass`: an OpenReward `Environment` subclass run in process.

One instance per session, driven as the SDK's server drives it: constructed with `task_spec` and `secrets`, `setup`,
`get_prompt`, tools through `Environment._call_tool`, `teardown`. Every call goes through the session's gate
(`platoon.envs.gate`); grading fails closed. The SDK is imported on first use, never at module
import: this module is what the `python` service entry point names.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import contextvars
import copy
import dataclasses
import functools
import inspect
import json
import logging
import os
import queue
import sys
import threading
from collections.abc import Awaitable, Callable, Iterable, Mapping, MutableMapping, Sequence
from typing import Any

from platoon.config.paths import PathOption
from platoon.envs.gate import DEFAULT_QUEUE_TIMEOUT_S, Gate, OpClass
from platoon.envs.ors import bridge
from platoon.envs.ors.lease import OrsLease, OrsSession, as_number, error_result
from platoon.envs.service import EnvSetupError, Outcome, SessionNeeds, ToolResult, ToolSpec
from platoon.harness.agent import FINAL_ANSWER_META_KEY
from platoon.registry import resolve_import_string
from platoon.task import Task

__all__ = ["InProcessOrsService", "InProcessOrsSession", "InvalidCall", "load_env_class"]

log = logging.getLogger(__name__)

SCHEME = "python://"
REFERENCE_PREFIX = "openreward:v1:"

# Keys of `service_kwargs` that only remote `ors+http(s)://` services understand.
_REMOTE_ONLY = (
    "environment",
    "env_name",
    "urls",
    "variant",
    "api_key",
    "api_url",
    "label",
    "session_urls_env_var",
    "legacy_global_pool",
    "env_class",
    "tool_routing_overrides",
)
_TASK_NAME_KEYS = ("task_name", "id", "task_id", "name")
#: the SDK `@terminal` tool's descriptor: the tool harnesses keep from the model and hand the final reply to
TERMINAL_META_KEY = FINAL_ANSWER_META_KEY
ROUTING_KEY = "x-openhands-tool-routing"

# The set of still-running sync environment calls of the lease whose code is running, so teardown can wait for them.
_SYNC_WORK: contextvars.ContextVar[set[asyncio.Future[None]] | None] = contextvars.ContextVar(
    "platoon_ors_sync_work", default=None
)


class InvalidCall(Exception):
    """Raised by environment code for a call the policy got wrong (unknown tool, bad arguments, episode over).

    The call is answered with an error result and the session lives on. Any other exception a tool raises is the
    environment failing: when the tool may end the episode (a declared terminal tool, or any tool of an environment
    that declares none) the episode is an infrastructure error unless it finishes later, never a zero; a tool that
    cannot end it (not declared terminal, beside declared ones) is the policy's `tool_raised`.
    """


# -- running environment code ------------------------------------------------------------------------------------


class _DaemonThreads:
    """Daemon threads that run sync environment code, reused from call to call.

    Daemon threads, not the loop's executor: a hung sync environment must not keep the process from exiting. A
    thread that finished a job waits for the next one (at most `_MAX_IDLE` wait); a job finding none idle starts a
    new thread, so a hung job never holds up another.
    """

    _MAX_IDLE = 64

    def __init__(self) -> None:
        self._jobs: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._idle = 0

    def run(self, job: Callable[[], None]) -> None:
        with self._lock:
            reuse = self._idle > 0
            if reuse:
                self._idle -= 1
        self._jobs.put(job)
        if not reuse:
            threading.Thread(target=self._serve, name="platoon-ors-sync", daemon=True).start()

    def _serve(self) -> None:
        while True:
            self._jobs.get()()
            with self._lock:
                if self._idle >= self._MAX_IDLE:
                    return
                self._idle += 1


_threads = _DaemonThreads()


async def _in_daemon_thread(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    loop = asyncio.get_running_loop()
    result: asyncio.Future[Any] = loop.create_future()
    ended: asyncio.Future[None] = loop.create_future()
    tracker = _SYNC_WORK.get()
    if tracker is not None:
        tracker.add(ended)
        ended.add_done_callback(tracker.discard)
    context = contextvars.copy_context()

    def deliver(ok: bool, value: Any) -> None:
        if not result.done():
            if ok:
                result.set_result(value)
            else:
                result.set_exception(value)
        if not ended.done():
            ended.set_result(None)

    def work() -> None:
        try:
            value, ok = context.run(fn, *args, **kwargs), True
        except BaseException as exc:
            value, ok = exc, False
        try:
            loop.call_soon_threadsafe(deliver, ok, value)
        except RuntimeError:  # the loop is gone; nobody is waiting any more
            pass

    _threads.run(work)
    return await result


async def _call(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Run environment code as the SDK's server does: async awaited, sync on a (daemon) thread."""
    if inspect.iscoroutinefunction(fn):
        return await fn(*args, **kwargs)
    if getattr(fn, "__func__", None) in _SDK_EMPTY_HOOKS:
        value = fn(*args, **kwargs)  # the SDK's own empty setup/teardown: a thread hop for a `pass` is waste
    else:
        value = await _in_daemon_thread(fn, *args, **kwargs)
    if inspect.isawaitable(value):
        value = await value
    return value


_sdk_ready = False
#: `Environment.setup` and `Environment.teardown` of the SDK, filled in on import: environments that do not
#: override them have nothing to run
_SDK_EMPTY_HOOKS: set[Any] = set()
_sdk_lock = threading.Lock()


def _sdk() -> Any:
    """`openreward.environments`, imported on first use, with the update check off and its logs sent through
    `logging` (see `_sdk_logger`)."""
    global _sdk_ready
    # The SDK's update check would reach pypi.org from every process that serves environments.
    os.environ.setdefault("OPENREWARD_DISABLE_UPDATE_CHECK", "1")
    try:
        import openreward.environments as sdk
        from openreward.environments import environment as sdk_environment
    except ImportError as exc:
        raise ImportError(
            f"python:// services need the openreward SDK ({exc}); install it with: pip install 'platoon-core[ors]'"
        ) from exc
    with _sdk_lock:
        if not _sdk_ready:
            sdk_environment.logger = _sdk_logger()
            # Sync tool bodies then run on daemon threads that teardown can wait for, like the rest of the env code.
            sdk_environment.run_user_callable = _call
            _SDK_EMPTY_HOOKS.update({sdk.Environment.setup, sdk.Environment.teardown})
            introspect = getattr(sdk_environment, "_introspect_tool", None)
            if introspect is not None:
                sdk_environment._introspect_tool = _cached_introspection(introspect)
            _sdk_ready = True
    return sdk


def _sdk_logger() -> Any:
    """The SDK environment's logger, writing through `logging` (logger `openreward.environments`) instead of
    printing to stdout, which is a command's data channel (`platoon eval` prints its JSON summary there).

    Its level is `OPENREWARD_LOG_LEVEL` when set, else WARNING: the SDK logs every tool call at INFO. A tool's
    `InvalidCall` is dropped: that call is answered to the policy, not an environment failure worth a traceback.
    A tool that raised is one line naming the exception (training may log it once per rollout); its traceback is
    kept at `OPENREWARD_LOG_LEVEL=DEBUG`.
    """
    import structlog

    target = logging.getLogger("openreward.environments")
    level_name = os.environ.get("OPENREWARD_LOG_LEVEL") or "WARNING"
    level = logging.getLevelName(level_name.upper())
    if not isinstance(level, int):
        level = logging.WARNING

    def to_logging(_logger: Any, _method: str, event: MutableMapping[str, Any]) -> tuple[Any, ...]:
        exc_info = event.pop("exc_info", None)
        if exc_info is True:
            exc_info = sys.exc_info()
        if isinstance(exc_info, tuple) and isinstance(exc_info[1], InvalidCall):
            raise structlog.DropEvent
        event.pop("logger_name", None)
        if isinstance(exc_info, tuple) and exc_info[1] is not None and level > logging.DEBUG:
            error = exc_info[1]
            event["error"] = repr(f"{type(error).__name__}: {error}"[:300])
            exc_info = None
        message = " ".join([str(event.pop("event", "")), *(f"{k}={v}" for k, v in event.items())])
        return (message,), {"exc_info": exc_info} if exc_info else {}

    return structlog.wrap_logger(
        target,
        processors=[to_logging],
        wrapper_class=structlog.make_filtering_bound_logger(level),
        cache_logger_on_first_use=True,
    )


def _cached_introspection(
    introspect: Callable[[Any], tuple[Any, dict[str, Any], list[Any]]],
) -> Callable[..., Any]:
    """The SDK's `_introspect_tool`, remembered per tool function.

    The SDK reads a tool's type hints and signature on every call (twice: once to find the tool, once to run it),
    most of what an in-process tool call costs platoon. Both depend only on the function (and on whether it is
    bound, which drops the first parameter), so they are computed once; the unwrapped callable is the caller's own.
    """
    known: dict[tuple[Any, bool], tuple[dict[str, Any], list[Any]]] = {}

    @functools.wraps(introspect)  # `__wrapped__` is the SDK's own
    def cached(fn: Any) -> tuple[Any, dict[str, Any], list[Any]]:
        key = (getattr(fn, "__func__", fn), hasattr(fn, "__self__"))
        try:
            hints, params = known[key]
        except (KeyError, TypeError):  # TypeError: an unhashable callable, never remembered
            real, hints, params = introspect(fn)
            with contextlib.suppress(TypeError):
                known[key] = (hints, params)
            return real, hints, params
        return inspect.unwrap(fn), hints, params

    return cached


def load_env_class(service: str | type) -> type:
    """The `Environment` subclass a `python://pkg.mod:Class` reference names (or the class itself)."""
    sdk = _sdk()
    if isinstance(service, type):
        cls = service
        ref = f"{cls.__module__}:{cls.__qualname__}"
    else:
        if not isinstance(service, str):
            raise ValueError(f"a python:// service needs python://pkg.module:Class; got {service!r}")
        ref = service.removeprefix(SCHEME)
        module_name, sep, attr = ref.partition(":")
        if not sep or not module_name or not attr:
            raise ValueError(f"service {service!r}: write python://pkg.module:Class (a module, ':', a class)")
        import importlib

        try:
            module = importlib.import_module(module_name)
        except ImportError as exc:
            raise ValueError(f"service {service!r}: cannot import {module_name!r}: {exc}") from exc
        target: Any = module
        for part in attr.split("."):
            try:
                target = getattr(target, part)
            except AttributeError:
                raise ValueError(f"service {service!r}: {module_name!r} has no attribute {attr!r}") from None
        cls = target
    if not isinstance(cls, type) or not issubclass(cls, sdk.Environment):
        raise ValueError(f"service python://{ref}: {cls!r} is not an openreward Environment subclass")
    return cls


# -- small helpers -----------------------------------------------------------------------------------------------


def name_set(value: Any, what: str) -> set[str]:
    if value is None:
        return set()
    if callable(value):
        value = value()
    if isinstance(value, str):
        return {value}
    if not isinstance(value, Iterable):
        raise ValueError(f"{what} must be a list of tool names; got {value!r}")
    return {str(v) for v in value}


def _class_hook(cls: type, attr: str) -> Any:
    value = getattr(cls, attr, None)
    return value() if callable(value) else value


def strip_titles(schema: Any) -> Any:
    # Pydantic's generated titles are noise to a model; a property *named* "title" maps to a schema, not a string.
    if isinstance(schema, Mapping):
        return {k: strip_titles(v) for k, v in schema.items() if not (k == "title" and isinstance(v, str))}
    if isinstance(schema, list):
        return [strip_titles(v) for v in schema]
    return schema


def _block_dict(block: Any) -> dict[str, Any]:
    if isinstance(block, Mapping):
        return dict(block)
    dumped: dict[str, Any] = block.model_dump(exclude_none=True)
    return dumped


def join_prompt_text(blocks: Iterable[dict[str, Any]]) -> str:
    parts = []
    for block in blocks:
        if block.get("type", "text") == "text":
            parts.append(str(block.get("text", "")))
        else:
            parts.append(f"[image: {block.get('mimeType') or block.get('type')}]")
    return "\n".join(parts)


def resolve_callable(value: Any, what: str) -> Callable[[str], str] | None:
    if value is None or callable(value):
        return value
    if isinstance(value, str):
        target = resolve_import_string(value)
        if callable(target):
            return target
    raise ValueError(f"{what} must be a callable or a module:attr naming one; got {value!r}")


def _options(
    service: str | type,
    /,
    *,
    split: str = "train",
    task_names: list[str] | None = None,
    task_indices: list[int] | None = None,
    max_tool_calls: int = 0,
    terminal_tools: list[str] | None = None,
    read_only_tools: list[str] | None = None,
    concurrent_tools: list[str] | None = None,
    queue_timeout_s: float | None = DEFAULT_QUEUE_TIMEOUT_S,
    tool_meta: Mapping[str, Mapping[str, Any]] | None = None,
    result_format: str = "blocks",
    bridge_tools: bool = False,
    log_dir: str | None = None,
    close_timeout_s: float = 30.0,
    secrets: Mapping[str, str] | None = None,
    prompt_filter: Callable[[str], str] | str | None = None,
    name: str | None = None,
) -> None:
    """The options of a python:// service (its signature is the service's, for binding checks)."""


_SIGNATURE = inspect.signature(_options)
_KNOWN = tuple(p for p in _SIGNATURE.parameters if p != "service")


# -- the service -------------------------------------------------------------------------------------------------


class InProcessOrsService:
    """The `python://` service: `InProcessOrsService("python://pkg.mod:Class", split="train", ...)`.

    Task ids are `<split>:<index>`; `get_task` also takes a task name (in the default split) or an
    `openreward:v1:` reference. The options are `_options`'s keyword arguments (those of a remote ORS service that
    apply in process); any other is refused naming them.
    """

    #: a relative `log_dir` a config file writes is relative to that file's directory
    path_options: tuple[PathOption, ...] = (PathOption("log_dir", written=True),)

    def __init__(self, service: str | type, /, **options: Any) -> None:
        for key in options:
            if key in _REMOTE_ONLY:
                raise ValueError(
                    f"service_kwargs.{key} applies to remote ors+http(s):// services, not to python:// (in process)"
                )
            if key not in _KNOWN:
                raise ValueError(
                    f"service_kwargs.{key} is not an option of python:// services (options: {', '.join(_KNOWN)})"
                )
        bound = _SIGNATURE.bind(service, **options)
        bound.apply_defaults()
        o = bound.arguments
        self.env_class: Any = load_env_class(service)
        self.uri = (
            service if isinstance(service, str) else f"{SCHEME}{service.__module__}:{service.__qualname__}"
        )
        self.name: str = o["name"] or self.env_class.__name__
        where = f"service {self.name!r}"
        self._task_options(o, where)
        if o["result_format"] != "blocks":
            raise ValueError(
                f"{where}: result_format {o['result_format']!r} is not served in process; use 'blocks'"
            )
        close_timeout = as_number(o["close_timeout_s"])
        if close_timeout is None or close_timeout <= 0:
            raise ValueError(
                f"{where}: close_timeout_s must be a positive number; got {o['close_timeout_s']!r}"
            )
        self.close_timeout_s = close_timeout
        self.log_dir, self.bridge_tools = bridge.bridge_options(o["log_dir"], o["bridge_tools"], where)
        tool_meta = self._session_options(o, where)
        self._learned_terminal: set[str] = set()
        self._splits: list[str] | None = None
        self._tools = ToolTable(
            self.env_class,
            terminal=name_set(o["terminal_tools"], "terminal_tools"),
            terminal_given=o["terminal_tools"] is not None,
            read_only=name_set(o["read_only_tools"], "read_only_tools"),
            concurrent=name_set(o["concurrent_tools"], "concurrent_tools"),
            meta=tool_meta,
            where=where,
        )

    def _task_options(self, o: Mapping[str, Any], where: str) -> None:
        """The split, its tasks, the tool-call cap and the queue timeout: options remote services check alike."""
        if not isinstance(o["split"], str) or not o["split"]:
            raise ValueError(f"{where}: split must be a split name; got {o['split']!r}")
        self.split: str = o["split"]
        if o["task_names"] is not None and o["task_indices"] is not None:
            raise ValueError(f"{where}: give task_names or task_indices, not both")
        self.task_names = None if o["task_names"] is None else [str(n) for n in o["task_names"]]
        indices = o["task_indices"]
        if indices is not None and any(isinstance(i, bool) or not isinstance(i, int) for i in indices):
            raise ValueError(f"{where}: task_indices must be integers; got {indices!r}")
        self.task_indices = None if indices is None else list(indices)
        cap = o["max_tool_calls"]
        if isinstance(cap, bool) or not isinstance(cap, int) or cap < 0:
            raise ValueError(
                f"{where}: max_tool_calls must be a non-negative integer (0 = no cap); got {cap!r}"
            )
        self.max_tool_calls: int = cap
        self.queue_timeout_s: float | None = o["queue_timeout_s"]
        Gate(queue_timeout_s=self.queue_timeout_s)  # checks the value now, where the config wrote it

    def _session_options(self, o: Mapping[str, Any], where: str) -> Mapping[str, Mapping[str, Any]]:
        """The secrets and the prompt filter, checked and kept; the tool meta, checked and returned (remote
        services check these alike)."""
        secrets = o["secrets"] or {}
        if not isinstance(secrets, Mapping):
            raise ValueError(f"{where}: secrets must be a mapping of names to strings")
        self._secrets = {str(k): str(v) for k, v in secrets.items()}
        self.prompt_filter = resolve_callable(o["prompt_filter"], f"{where}: prompt_filter")
        tool_meta = o["tool_meta"] or {}
        if not isinstance(tool_meta, Mapping) or not all(isinstance(v, Mapping) for v in tool_meta.values()):
            raise ValueError(f"{where}: tool_meta must map tool names to mappings")
        return tool_meta

    # -- tasks -----------------------------------------------------------------------------------------------

    async def list_splits(self) -> list[str]:
        if self._splits is None:
            splits = await _call(self.env_class._list_splits_cached)
            self._splits = [s if isinstance(s, str) else str(s.name) for s in splits]
        return list(self._splits)

    async def _specs(self, split: str) -> Sequence[Mapping[str, Any]]:
        """The SDK's cached task list of `split` itself (not a copy: a session opens on one spec of thousands);
        read only."""
        splits = await self.list_splits()
        if split not in splits:
            raise ValueError(f"{self.name} has no split {split!r} (splits: {', '.join(splits)})")
        return await self.env_class._list_tasks_cached(split)

    async def _spec(self, split: str, index: int) -> Mapping[str, Any]:
        return (await self._specs(split))[index]

    async def list_tasks(self, split: str) -> list[str]:
        """The task ids of `split`; the default split is narrowed by `task_names` or `task_indices`."""
        specs = await self._specs(split)
        indices = list(range(len(specs)))
        if split == self.split and self.task_indices is not None:
            bad = [i for i in self.task_indices if not 0 <= i < len(specs)]
            if bad:
                raise ValueError(
                    f"{self.name}: task_indices {bad} are out of range for split {split!r} ({len(specs)} tasks)"
                )
            indices = list(self.task_indices)
        elif split == self.split and self.task_names is not None:
            by_name = {spec_task_name(spec, i): i for i, spec in enumerate(specs)}
            missing = [n for n in self.task_names if n not in by_name]
            if missing:
                raise ValueError(
                    f"{self.name}: task_names not in split {split!r}: {', '.join(map(repr, missing[:5]))}"
                )
            wanted = set(self.task_names)
            indices = [i for i in indices if spec_task_name(specs[i], i) in wanted]
        return [f"{split}:{i}" for i in indices]

    async def list_task_names(self, split: str) -> dict[str, str]:
        """Every task of `split` (not narrowed): id -> name."""
        return {f"{split}:{i}": spec_task_name(spec, i) for i, spec in enumerate(await self._specs(split))}

    async def get_task(self, task_id: str) -> Task:
        split, index = await self._locate(task_id)
        spec = await self._spec(split, index)
        goal = spec.get("goal")
        misc_spec = spec.get("misc")
        misc = dict(misc_spec) if isinstance(misc_spec, Mapping) else {}
        misc["ors"] = {"split": split, "index": index, "name": spec_task_name(spec, index)}
        # The spec's max_steps is the environment's business: budgets come from the config.
        return Task(goal=goal if isinstance(goal, str) else None, id=f"{split}:{index}", misc=misc)

    async def _locate(self, task_id: str) -> tuple[str, int]:
        if not isinstance(task_id, str) or not task_id:
            raise ValueError(f"{self.name}: a task id is a non-empty string; got {task_id!r}")
        if task_id.startswith(REFERENCE_PREFIX):
            return await self._reference(task_id)
        split, sep, index_text = task_id.rpartition(":")
        if sep and index_text.isdigit() and split in await self.list_splits():
            index = int(index_text)
            count = len(await self._specs(split))
            if index >= count:
                raise ValueError(f"{self.name} has no task {task_id!r}: split {split!r} has {count} tasks")
            return split, index
        for i, spec in enumerate(await self._specs(self.split)):
            if spec_task_name(spec, i) == task_id:
                return self.split, i
        raise ValueError(
            f"{self.name} has no task {task_id!r}: give <split>:<index> or a task name of split {self.split!r}"
        )

    async def _reference(self, task_id: str) -> tuple[str, int]:
        payload = task_id[len(REFERENCE_PREFIX) :]
        try:
            data = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
        except (ValueError, binascii.Error):
            raise ValueError(
                f"{self.name}: {task_id[:40]!r} is not a valid openreward:v1: task reference"
            ) from None
        if not isinstance(data, Mapping) or not isinstance(data.get("split"), str):
            raise ValueError(f"{self.name}: an openreward:v1: reference needs split and index")
        environment = data.get("environment")
        known = self._reference_names()
        if environment is not None and str(environment).lower() not in known:
            raise ValueError(f"{self.name}: task reference is for environment {environment!r}, not this one")
        index = data.get("index")
        if isinstance(index, bool) or not isinstance(index, int):
            raise ValueError(
                f"{self.name}: an openreward:v1: reference needs an integer index; got {index!r}"
            )
        return await self._locate(f"{data['split']}:{index}")

    def _reference_names(self) -> set[str]:
        """The environment names an `openreward:v1:` reference may carry for this service (lower case)."""
        return {self.name.lower(), self.env_class.__name__.lower()}

    # -- sessions --------------------------------------------------------------------------------------------

    async def open(
        self,
        task: Task,
        *,
        rollout_id: str,
        needs: SessionNeeds | None = None,
        forked_from: str | None = None,
    ) -> OrsSession:
        """Construct the environment for `task`, run `setup`, fetch the prompt (failures: `EnvSetupError`).

        `forked_from`: the session a `fresh` fork is taken from (named in the event log)."""
        try:
            split, index = self._task_position(task)
            spec = copy.deepcopy(dict((await self._specs(split))[index]))
        except (ValueError, IndexError) as exc:
            raise EnvSetupError("env_config", f"{self.name}: {exc}") from None
        label = f"{self.name} {split}:{index}"
        tracker: set[asyncio.Future[None]] = set()
        token = _SYNC_WORK.set(tracker)
        try:
            try:
                env = await _call(self.env_class, task_spec=spec, secrets=dict(self._secrets))
            except Exception as exc:
                raise EnvSetupError(
                    "env_setup", f"{label}: constructing the environment raised {type(exc).__name__}: {exc}"
                ) from exc
            try:
                await _call(env.setup)
            except Exception as exc:
                await _teardown(env, self.close_timeout_s, label)
                raise EnvSetupError(
                    "env_setup", f"{label}: setup raised {type(exc).__name__}: {exc}"
                ) from exc
            try:
                blocks = [_block_dict(b) for b in await _call(env.get_prompt)]
                text = join_prompt_text(blocks)
                if self.prompt_filter is not None:
                    text = str(self.prompt_filter(text))
            except Exception as exc:
                await _teardown(env, self.close_timeout_s, label)
                raise EnvSetupError(
                    "env_setup", f"{label}: getting the prompt raised {type(exc).__name__}: {exc}"
                ) from exc
        finally:
            _SYNC_WORK.reset(token)
        lease = Lease(self, env, spec, Gate(queue_timeout_s=self.queue_timeout_s, name=label), label)
        lease.sync_work = tracker
        log.debug("ors session opened: %s (rollout %s)", label, rollout_id)
        return self._first_view(InProcessOrsSession, lease, task, text, blocks, rollout_id, forked_from)

    def _first_view[View: OrsSession](
        self,
        view: type[View],
        lease: OrsLease,
        task: Task,
        prompt: str,
        blocks: list[dict[str, Any]],
        rollout_id: str,
        forked_from: str | None,
        *,
        sid: str | None = None,
        **about: Any,
    ) -> View:
        """The first view of a session just opened, its event log started: the prompt is its instruction (else
        the task's goal), and a task without a goal takes the prompt as one."""
        instruction = prompt or task.goal
        if task.goal is None and instruction:
            task = dataclasses.replace(task, goal=instruction)
        fork = {"fork": "fresh", "parent": forked_from} if forked_from else {}
        lease.start_bridge(rollout_id, task, instruction, sid=sid, **about, **fork)
        return view(lease, task, instruction, blocks, rollout_id)

    def _task_position(self, task: Task) -> tuple[str, int]:
        ors = task.misc.get("ors") if isinstance(task.misc, Mapping) else None
        if (
            isinstance(ors, Mapping)
            and isinstance(ors.get("split"), str)
            and isinstance(ors.get("index"), int)
        ):
            return ors["split"], ors["index"]
        split, sep, index_text = (task.id or "").rpartition(":")
        if sep and index_text.isdigit():
            return split, int(index_text)
        raise ValueError(f"task {task.id!r} is not a task of this service (get it with get_task)")

    def learn_terminal(self, name: str) -> None:
        """Remember a tool seen ending an episode, for environments that declare no terminal tool."""
        self._learned_terminal.add(name)

    def __repr__(self) -> str:
        return f"InProcessOrsService({self.uri!r})"


# Config checks bind `service_kwargs` against the factory's signature without building it: show them the options.
setattr(  # noqa: B010
    InProcessOrsService.__init__,
    "__signature__",
    _SIGNATURE.replace(
        parameters=[
            inspect.Parameter("self", inspect.Parameter.POSITIONAL_ONLY),
            *_SIGNATURE.parameters.values(),
        ]
    ),
)


def spec_task_name(spec: Mapping[str, Any], index: int) -> str:
    for key in _TASK_NAME_KEYS:
        value = spec.get(key)
        if isinstance(value, (str, int)) and not isinstance(value, bool) and str(value):
            return str(value)
    return f"task-{index}"


async def _teardown(env: Any, timeout_s: float, label: str) -> None:
    try:
        await asyncio.wait_for(_call(env.teardown), timeout_s)
    except TimeoutError:
        log.warning("%s: teardown did not finish within %g s", label, timeout_s)
    except Exception as exc:
        log.warning("%s: teardown raised %s: %s", label, type(exc).__name__, exc)


# -- tools -------------------------------------------------------------------------------------------------------


def tool_meta(name: str, schema: Any, terminal: Any, *layers: Mapping[str, Any] | None) -> dict[str, Any]:
    """A tool's meta: the layers merged in order (a later one wins), then the `@terminal` tool's argument and the
    routing its schema carries."""
    merged: dict[str, Any] = {}
    for layer in layers:
        merged.update(layer or {})
    if terminal is not None and name == terminal.name:
        merged[TERMINAL_META_KEY] = {"arg": terminal.arg}
    if isinstance(schema, Mapping) and ROUTING_KEY in schema:
        merged[ROUTING_KEY] = schema[ROUTING_KEY]
    return merged


def says_read_only(meta: Mapping[str, Any]) -> bool:
    """Whether a tool's meta marks it read-only (platoon's key, or an MCP `readOnlyHint`)."""
    annotations = meta.get("annotations")
    return bool(
        meta.get("platoon.dev/read-only")
        or meta.get("readOnlyHint")
        or (isinstance(annotations, Mapping) and annotations.get("readOnlyHint"))
    )


class ToolTable:
    """The class's tools with platoon's hints: terminal, read-only, call class, meta."""

    def __init__(
        self,
        cls: type,
        *,
        terminal: set[str],
        terminal_given: bool = False,
        read_only: set[str],
        concurrent: set[str],
        meta: Mapping[str, Mapping[str, Any]],
        where: str,
    ) -> None:
        from openreward.environments.environment import _introspect_tool

        try:
            listing = cls.list_tools()  # type: ignore[attr-defined]
        except ValueError as exc:  # the SDK's own checks (two terminal tools, a missing @tool, ...)
            raise ValueError(f"{where}: {exc}") from None
        term = listing.terminal_tool
        specs: list[tuple[str, str, Any]] = [(t.name, t.description, t.input_schema) for t in listing.tools]
        if term is not None:
            fn = getattr(cls, term.name)
            _, hints, params = _introspect_tool(fn)
            schema = hints[params[0].name].model_json_schema() if params else None
            specs.append((term.name, term.description or (fn.__doc__ or "").strip(), schema))
        names = {name for name, _, _ in specs}
        class_terminal = _class_hook(cls, "platoon_terminal_tools")
        declared_terminal = set(terminal) | name_set(class_terminal, "platoon_terminal_tools")
        if term is not None:
            declared_terminal.add(term.name)
        for name in names:
            if getattr(getattr(cls, name), "_env_tool_exclusive", False):
                declared_terminal.add(name)
        concurrent_names = set(concurrent) | name_set(
            _class_hook(cls, "platoon_concurrent_tools"), "platoon_concurrent_tools"
        )
        for name in names:
            if getattr(getattr(cls, name), "_env_tool_concurrent", False):
                concurrent_names.add(name)
        read_only_names = set(read_only) | name_set(
            _class_hook(cls, "platoon_read_only_tools"), "platoon_read_only_tools"
        )
        for option, given in (
            ("terminal_tools", terminal),
            ("read_only_tools", read_only),
            ("concurrent_tools", concurrent),
        ):
            unknown = sorted(given - names)
            if unknown:
                raise ValueError(
                    f"{where}: {option} names unknown tools {unknown} (tools: {', '.join(sorted(names))})"
                )
        class_meta = _class_hook(cls, "platoon_tool_meta") or {}
        self.declared_terminal = declared_terminal
        #: the class or the options say which tools are terminal; an explicitly empty list says "none": a tool
        #: seen ending an episode is then not learned as terminal (its calls stay serial, and a raise in another
        #: tool stays the policy's error)
        self.declares_terminal = bool(declared_terminal) or class_terminal is not None or terminal_given
        self.specs: dict[str, tuple[str, Any, dict[str, Any]]] = {}
        self.read_only: set[str] = set()
        for name, description, schema in specs:
            merged = tool_meta(name, schema, term, class_meta.get(name), meta.get(name))
            if name not in declared_terminal and (name in read_only_names or says_read_only(merged)):
                self.read_only.add(name)
            self.specs[name] = (description, strip_titles(schema), merged)
        self.concurrent = concurrent_names - declared_terminal

    def listing(self, learned: set[str]) -> list[ToolSpec]:
        # Learned terminal tools count only for environments that declare nothing.
        terminal = self.declared_terminal if self.declares_terminal else learned
        return [
            ToolSpec(
                name,
                description,
                schema,
                terminal=name in terminal,
                read_only=name in self.read_only,
                meta=dict(meta) or None,
            )
            for name, (description, schema, meta) in self.specs.items()
        ]

    def op_class(self, name: str) -> OpClass:
        if name in self.declared_terminal:
            return "exclusive"
        if name in self.concurrent:
            return "concurrent"
        return "serial"


# -- leases and sessions -----------------------------------------------------------------------------------------


class Lease(OrsLease):
    """One live environment instance and its accounting, shared by every session view forked `shared`."""

    service: InProcessOrsService

    def __init__(
        self,
        service: InProcessOrsService,
        env: Any,
        spec: dict[str, Any],
        gate: Gate,
        label: str,
        *,
        parent: Lease | None = None,
    ) -> None:
        super().__init__(service, env, gate, label)
        self.spec = spec
        self.parent = parent
        # A fork-hook child shares its parent's gate and backend; only the owner closes them.
        self.owns_backend = parent is None
        self.sync_work: set[asyncio.Future[None]] = set()

    @property
    def table(self) -> ToolTable:
        return self.service._tools

    async def _run_call(self, name: str, arguments: dict[str, Any], ending: bool) -> ToolResult:
        token = _SYNC_WORK.set(self.sync_work)
        log.debug("%s: tool call %d: %s", self.label, self.turns, name)
        try:
            out = await self.env._call_tool(name, arguments)
        except InvalidCall as exc:
            return error_result(str(exc) or f"Invalid call to {name!r}.", "invalid_call")
        except Exception as exc:
            what = f"{type(exc).__name__}: {exc}"
            return self.tool_raised(
                name, what, ending, infra=f"{self.tool_kind(name)} {name!r} raised {what}"
            )
        finally:
            _SYNC_WORK.reset(token)
        root = out.root
        if not root.ok:
            return error_result(root.error, root.reason or "invalid_call")
        output = root.output
        metadata = dict(output.metadata or {})
        blocks = [_block_dict(b) for b in output.blocks]
        return self.landed(name, blocks, metadata, output.finished, output.reward)

    def _grader(self) -> Callable[[], Awaitable[Outcome]] | None:
        # Only an environment in process can define `platoon_grade()`.
        hook = getattr(self.env, "platoon_grade", None)
        return None if hook is None else functools.partial(self._run_hook, hook)

    async def _run_hook(self, hook: Callable[[], Any]) -> Outcome:
        decided = self._decided()  # a submit may have landed while the grade waited for its turn
        if decided is not None:
            return decided
        token = _SYNC_WORK.set(self.sync_work)
        try:
            value = await _call(hook)
        except Exception as exc:
            return Outcome.infra("env_error", reason=f"platoon_grade raised {type(exc).__name__}: {exc}")
        finally:
            _SYNC_WORK.reset(token)
        return _outcome_of(value)

    async def _end_session(self) -> None:
        timeout = self.service.close_timeout_s
        # A fork-hook child drains the gate it shares but leaves closing it to its parent.
        await self._drain_gate(timeout, log, then="cancelling them", close_gate=self.owns_backend)
        if self.owns_backend:
            running: set[asyncio.Future[None]] = set()
            if self.sync_work:
                # Sync environment code cannot be interrupted: teardown must not run beside it, and a call that
                # never returns (a hung grader past its step deadline) must not hold the close forever either.
                _, running = await asyncio.wait(list(self.sync_work), timeout=timeout)
                if running:
                    log.warning(
                        "%s: %d sync environment call(s) still running after %g s; skipping the teardown",
                        self.label,
                        len(running),
                        timeout,
                    )
            if not running:
                await _teardown(self.env, timeout, self.label)
        log.debug("%s: closed after %d tool call(s)", self.label, self.turns)
        if self.parent is not None:
            await self.parent.release()


def _outcome_of(value: Any) -> Outcome:
    """A `platoon_grade()` return: an Outcome, a number, or a mapping / ToolOutput with `reward` / `invalid`."""
    if isinstance(value, Outcome):
        return value
    number = as_number(value)
    if number is not None:
        return Outcome("scored", {"reward": number})
    if isinstance(value, Mapping):
        reward, invalid, metadata = value.get("reward"), value.get("invalid"), value.get("metadata")
        invalid = invalid or (isinstance(metadata, Mapping) and metadata.get("invalid"))
    elif hasattr(value, "reward") and hasattr(value, "metadata"):
        reward, invalid = value.reward, (value.metadata or {}).get("invalid")
    else:
        return Outcome.infra(
            "no_reward", status="invalid", reason=f"platoon_grade returned {type(value).__name__}"
        )
    if invalid:
        return Outcome.infra("env_invalid", status="invalid", reason="platoon_grade marked the grade invalid")
    number = as_number(reward)
    if number is None:
        return Outcome.infra("no_reward", status="invalid", reason="platoon_grade gave no numeric reward")
    return Outcome("scored", {"reward": number})


def _has_own_teardown(cls: type) -> bool:
    from openreward.environments import Environment

    return getattr(cls, "teardown", None) is not Environment.teardown


def _deepcopy_env(env: Any) -> Any:
    # The SDK's per-instance locks belong to this instance's calls; the copy makes its own on first use.
    memo: dict[int, Any] = {}
    for attr in ("_exclusive_gate", "_tool_locks"):
        value = env.__dict__.get(attr)
        if value is not None:
            memo[id(value)] = None
    return copy.deepcopy(env, memo)


class InProcessOrsSession(OrsSession):
    """A view of a live in-process environment: tools, calls through the gate, grading, forks."""

    _lease: Lease

    async def _env_tools(self) -> list[ToolSpec]:
        lease = self._lease
        if lease.tools is None:
            service = lease.service

            async def listing() -> list[ToolSpec]:
                return service._tools.listing(service._learned_terminal)

            # The first listing is an exclusive turn, as on a server where listing may touch live state.
            lease.tools = await lease.gate.run(listing, "exclusive", caller=self, what="tool listing")
        return list(lease.tools)

    async def _fork_fresh(self, task: Task) -> OrsSession:
        lease = self._lease
        return await lease.service.open(task, rollout_id=self._rollout_id, forked_from=lease.session_id)

    async def _fork_shared(self, task: Task | None) -> OrsSession:
        lease = self._lease
        hook = getattr(lease.env, "platoon_fork", None)
        if task is None or hook is None:
            return await super()._fork_shared(task)
        child_spec = {**lease.spec, "goal": task.goal}
        child_env = await lease.gate.run(
            lambda: _call(hook, child_spec), "exclusive", caller=self, what="fork"
        )
        child = Lease(lease.service, child_env, child_spec, lease.gate, lease.label, parent=lease)
        lease.refs += 1  # the child keeps its parent alive until it closes
        child.start_bridge(
            self._rollout_id, task, task.goal, fork="shared (platoon_fork)", parent=lease.session_id
        )
        return InProcessOrsSession(child, task, task.goal, self.prompt_blocks, self._rollout_id)

    async def _copy(self, task: Task | None) -> OrsSession:
        lease = self._lease
        env_class = type(lease.env)
        snapshot = getattr(lease.env, "platoon_copy", None)
        if snapshot is None and _has_own_teardown(env_class):
            raise EnvSetupError(
                "env_config",
                f"{env_class.__name__} defines teardown but not platoon_copy(), so a copy fork cannot be made "
                "safely: define platoon_copy() or fork with mode shared or fresh",
            )

        async def take() -> Any:
            return await _call(snapshot) if snapshot is not None else _deepcopy_env(lease.env)

        twin = await lease.gate.run(take, "exclusive", caller=self, what="copy")
        service = lease.service
        gate = Gate(queue_timeout_s=service.queue_timeout_s, name=f"{lease.label} (copy)")
        copied = Lease(service, twin, copy.deepcopy(lease.spec), gate, f"{lease.label} (copy)")
        copied.copy_accounting(lease)
        copied.start_bridge(
            self._rollout_id, task or self._task, self._instruction, fork="copy", parent=lease.session_id
        )
        return InProcessOrsSession(
            copied, task or self._task, self._instruction, self.prompt_blocks, self._rollout_id
        )
