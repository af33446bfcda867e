"""The `harbor` environment service: Harbor task directories run in their sandboxes and
graded by their own tests.

`HarborService(**service_kwargs)` checks its options when built (an unknown key or a bad value is one line, exit
78), lists the tasks of a dataset directory, and opens sessions: the sandbox spec comes from the task
(image, workdir, host-resolved env, network, resources) and the entry (mounts, env, provider), the rollout's
`SessionNeeds` are applied to it, the sandbox starts, `/logs/{agent,verifier,artifacts}` and the workdir are made,
and the task's healthcheck must pass. Each start failure maps to an infra kind: a route problem `harness_setup`,
another provider failure `sandbox_start`, preparation `env_setup`, an unhealthy task `env_healthcheck`.

Fetched datasets (`dataset`, `lock`) are read from their lock (`platoon_harbor.datasets.resolve_dataset`: a
rollout never fetches), split by `holdout` (`platoon_harbor.holdout`); the images of their Dockerfile tasks come
from the site's image map (`platoon_harbor.images.image_for`), never built here.
"""

from __future__ import annotations

import asyncio
import difflib
import logging
import math
import os
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Literal

from platoon import Task, sandbox_runs
from platoon.config import DeprecatedKey, PathOption
from platoon.envs.gate import DEFAULT_QUEUE_TIMEOUT_S, Gate
from platoon.envs.service import EnvNotPrepared, EnvSetupError, SessionNeeds
from platoon.errors import ConfigError
from platoon.sandbox import Mount, SandboxError, SandboxProvider, SandboxSpec
from platoon_harbor import check_file, images
from platoon_harbor.cache import harbor_cache
from platoon_harbor.datasets import resolve_dataset
from platoon_harbor.grading import DEFAULT_CLASSIFIERS, Classifier, RewardContract, parse_classifiers
from platoon_harbor.holdout import HoldoutRule, eval_problem, holdout_split
from platoon_harbor.session import TOOL_NAMES, HarborSession, LiveSandbox, OpenedSandbox
from platoon_harbor.tasks import (
    EnvironmentSettings,
    HarborTask,
    TaskRefused,
    UnsetVariable,
    VariableNotPassed,
    dataset_splits,
    discover_tasks,
    load_splits,
    read_task,
    resolve_env,
    runnable_splits,
    task_dirs_ids,
    task_refusal,
    unpassed_variables,
)
from platoon_harbor.users import as_user, give

__all__ = ["DEFAULT_PROVIDER", "HarborOptions", "HarborService"]

log = logging.getLogger(__name__)

DEFAULT_PROVIDER = "docker"
#: the grading allowance of the rollout overhead
GRADING_ALLOWANCE_S = 120.0
#: `service_kwargs.verifier_mode`, the first the default
VERIFIER_MODES = ("separate", "shared")

#: every `service_kwargs` key of `service: harbor`
KNOWN_KEYS = (
    "dataset_dir",
    "task_dirs",
    "splits",
    "dataset",
    "lock",
    "cache",
    "tasks",
    "select",
    "overlays",
    "refuse",
    "index",
    "workers",
    "holdout",
    "provider",
    "provider_options",
    "default_image",
    "workdir",
    "env",
    "pass_env",
    "mounts",
    "tool_timeout_s",
    "verifier_timeout_multiplier",
    "agent_timeout_multiplier",
    "concurrent_tools",
    "queue_timeout_s",
    "close_timeout_s",
    "reward",
    "verifier_classifiers",
    "verifier_mode",
    "agent_user",
    "limits",
    "max_artifact_bytes",
    "sandbox_start_budget_s",
    "image_map",
    "toolchain_root",
    "name",
    "harbor_check",
)
_FETCHED_KEYS = ("dataset", "lock")
_WHERE = "service_kwargs"


def _positive(
    kwargs: Mapping[str, Any], key: str, default: float | None, *, allow_none: bool = False
) -> float | None:
    if key not in kwargs:
        return default
    value = kwargs[key]
    if value is None and allow_none:
        return None
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not math.isfinite(value)
        or value <= 0
    ):
        raise ConfigError(
            f"{_WHERE}.{key}: a positive number{' or null' if allow_none else ''}; got {value!r}"
        )
    return float(value)


def _string_map(kwargs: Mapping[str, Any], key: str) -> dict[str, str]:
    value = kwargs.get(key) or {}
    if not isinstance(value, Mapping) or not all(isinstance(k, str) for k in value):
        raise ConfigError(f"{_WHERE}.{key}: a mapping of names to strings")
    out: dict[str, str] = {}
    for name, item in value.items():
        if isinstance(item, bool) or not isinstance(item, (str, int, float)):
            raise ConfigError(f"{_WHERE}.{key}.{name}: a string; got {item!r}")
        out[name] = str(item)
    return out


@dataclass(frozen=True)
class HarborOptions:
    """The checked `service_kwargs`."""

    name: str = "harbor"
    dataset_dir: Path | None = None
    task_dirs: tuple[Path, ...] = ()
    splits: Any = None
    provider: str = DEFAULT_PROVIDER
    provider_options: Mapping[str, Any] = field(default_factory=dict)
    default_image: str | None = None
    workdir: str = "/app"
    env: Mapping[str, str] = field(default_factory=dict)
    #: the host variables a task's `${VAR}` may read; no other reaches a task (an untrusted dataset is data)
    pass_env: frozenset[str] = frozenset()
    mounts: tuple[Any, ...] = ()
    tool_timeout_s: float = 300.0
    verifier_timeout_multiplier: float = 1.0
    agent_timeout_multiplier: float = 1.0
    concurrent_tools: frozenset[str] = frozenset()
    queue_timeout_s: float | None = DEFAULT_QUEUE_TIMEOUT_S
    close_timeout_s: float = 30.0
    reward: RewardContract = field(default_factory=RewardContract)
    verifier_classifiers: tuple[Classifier, ...] = DEFAULT_CLASSIFIERS
    #: `separate` grades every task in a fresh verifier sandbox; `shared` only the tasks that ask for one; None
    #: (not given) is `separate`, except on the process provider (see `grades_separately`)
    verifier_mode: str | None = None
    #: `run`: commands run as the users a task names; `ignore`: as the image's; `refuse`: such tasks are refused
    agent_user: str = "run"
    #: `enforce`: a task whose cpus, memory or storage the provider cannot enforce is refused; `ignore`: dropped
    limits: str = "enforce"
    max_artifact_bytes: int = 1 << 30
    sandbox_start_budget_s: float = 600.0
    fetched: bool = False
    #: the dataset check's use (`platoon_harbor.check`); None: the default of the run's kind
    harbor_check: str | None = None
    raw: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def parse(cls, kwargs: Mapping[str, Any]) -> HarborOptions:
        unknown = [k for k in kwargs if k not in KNOWN_KEYS]
        if unknown:
            key = unknown[0]
            close = difflib.get_close_matches(key, KNOWN_KEYS, n=1)
            hint = f" (did you mean {close[0]}?)" if close else ""
            raise ConfigError(f"{_WHERE}.{key}: not an option of service harbor{hint}")
        direct = [k for k in ("dataset_dir", "task_dirs") if kwargs.get(k) is not None]
        fetched = [k for k in _FETCHED_KEYS if kwargs.get(k) is not None]
        if len(direct) > 1:
            raise ConfigError(f"{_WHERE}: dataset_dir and task_dirs exclude each other")
        if direct and fetched:
            raise ConfigError(f"{_WHERE}: {direct[0]} and {fetched[0]} exclude each other")
        if not direct and not fetched:
            raise ConfigError(f"{_WHERE}: name the tasks: dataset_dir, task_dirs, dataset or lock")
        if kwargs.get("holdout") is not None:
            if kwargs.get("splits") is not None:
                raise ConfigError(f"{_WHERE}: holdout and splits exclude each other")
            if not fetched:
                raise ConfigError(
                    f"{_WHERE}.holdout: needs a fetched dataset (dataset or lock), whose lock records the input files"
                )
            HoldoutRule.parse(kwargs["holdout"])
        name = kwargs.get("name", "harbor")
        if not isinstance(name, str) or not name:
            raise ConfigError(f"{_WHERE}.name: a non-empty string")
        dataset_dir = None
        if kwargs.get("dataset_dir") is not None:
            if not isinstance(kwargs["dataset_dir"], (str, os.PathLike)):
                raise ConfigError(f"{_WHERE}.dataset_dir: a directory path")
            dataset_dir = Path(kwargs["dataset_dir"]).expanduser().absolute()
        task_dirs: tuple[Path, ...] = ()
        if kwargs.get("task_dirs") is not None:
            raw_dirs = kwargs["task_dirs"]
            if (
                not isinstance(raw_dirs, list)
                or not raw_dirs
                or not all(isinstance(d, (str, os.PathLike)) for d in raw_dirs)
            ):
                raise ConfigError(f"{_WHERE}.task_dirs: a non-empty list of task directories")
            task_dirs = tuple(Path(d).expanduser().absolute() for d in raw_dirs)
        provider = kwargs.get("provider") or DEFAULT_PROVIDER
        if not isinstance(provider, str):
            raise ConfigError(f"{_WHERE}.provider: a provider name or module:Class")
        provider_options = kwargs.get("provider_options") or {}
        if not isinstance(provider_options, Mapping):
            raise ConfigError(f"{_WHERE}.provider_options: a mapping")
        default_image = kwargs.get("default_image")
        if default_image is not None and (not isinstance(default_image, str) or not default_image):
            raise ConfigError(f"{_WHERE}.default_image: an image reference")
        workdir = kwargs.get("workdir", "/app")
        if not isinstance(workdir, str) or not workdir.startswith("/"):
            raise ConfigError(f"{_WHERE}.workdir: an absolute path; got {workdir!r}")
        concurrent = kwargs.get("concurrent_tools") or []
        if not isinstance(concurrent, list) or not all(t in TOOL_NAMES for t in concurrent):
            raise ConfigError(
                f"{_WHERE}.concurrent_tools: a subset of {', '.join(TOOL_NAMES)}; got {concurrent!r}"
            )
        agent_user = kwargs.get("agent_user", "run")
        if agent_user not in ("run", "ignore", "refuse"):
            raise ConfigError(
                f"{_WHERE}.agent_user: run (as the task's user), ignore (as the image's) or refuse; got {agent_user!r}"
            )
        limits = kwargs.get("limits", "enforce")
        if limits not in ("enforce", "ignore"):
            raise ConfigError(
                f"{_WHERE}.limits: enforce (refuse a task whose limits the provider cannot enforce) or ignore "
                f"(drop them); got {limits!r}"
            )
        max_artifact = kwargs.get("max_artifact_bytes", 1 << 30)
        if isinstance(max_artifact, bool) or not isinstance(max_artifact, int) or max_artifact <= 0:
            raise ConfigError(f"{_WHERE}.max_artifact_bytes: a positive integer")
        verifier_mode = kwargs.get("verifier_mode")
        if verifier_mode is not None and verifier_mode not in VERIFIER_MODES:
            raise ConfigError(
                f"{_WHERE}.verifier_mode: separate (a fresh sandbox grades the agent's artifacts) or shared (the "
                f"agent's own sandbox grades it; see docs/harbor.md for what it trusts); got {verifier_mode!r}"
            )
        queue_timeout = _positive(kwargs, "queue_timeout_s", DEFAULT_QUEUE_TIMEOUT_S, allow_none=True)
        Gate(queue_timeout_s=queue_timeout)  # the gate's own check, where the config wrote it

        harbor_check = check_file.parse_mode(kwargs.get("harbor_check"), f"{_WHERE}.harbor_check")
        pass_env = kwargs.get("pass_env") or []
        if not isinstance(pass_env, list) or not all(
            isinstance(name, str) and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name) for name in pass_env
        ):
            raise ConfigError(
                f"{_WHERE}.pass_env: a list of variable names a task's ${{VAR}} may read; got {pass_env!r}"
            )
        return cls(
            name=name,
            dataset_dir=dataset_dir,
            task_dirs=task_dirs,
            splits=kwargs.get("splits"),
            provider=provider,
            provider_options=dict(provider_options),
            default_image=default_image,
            workdir=workdir,
            env=_string_map(kwargs, "env"),
            pass_env=frozenset(pass_env),
            mounts=_mounts(kwargs.get("mounts")),
            tool_timeout_s=_positive(kwargs, "tool_timeout_s", 300.0) or 300.0,
            verifier_timeout_multiplier=_positive(kwargs, "verifier_timeout_multiplier", 1.0) or 1.0,
            agent_timeout_multiplier=_positive(kwargs, "agent_timeout_multiplier", 1.0) or 1.0,
            concurrent_tools=frozenset(concurrent),
            queue_timeout_s=queue_timeout,
            close_timeout_s=_positive(kwargs, "close_timeout_s", 30.0) or 30.0,
            reward=RewardContract.parse(kwargs.get("reward"), f"{_WHERE}.reward"),
            verifier_classifiers=parse_classifiers(kwargs.get("verifier_classifiers")),
            verifier_mode=verifier_mode,
            agent_user=agent_user,
            limits=limits,
            max_artifact_bytes=max_artifact,
            sandbox_start_budget_s=_positive(kwargs, "sandbox_start_budget_s", 600.0) or 600.0,
            fetched=bool(fetched),
            harbor_check=harbor_check,
            raw=dict(kwargs),
        )


def _mounts(value: Any) -> tuple[Any, ...]:
    if value is None:
        return ()
    if not isinstance(value, list):
        raise ConfigError(f"{_WHERE}.mounts: a list of {{source, target, read_only}}")
    out = []
    for i, item in enumerate(value):
        if (
            not isinstance(item, Mapping)
            or not {"source", "target"} <= set(item)
            or set(item) - {"source", "target", "read_only"}
        ):
            raise ConfigError(f"{_WHERE}.mounts.{i}: a mapping {{source, target, read_only}}")
        source, target, read_only = item["source"], item["target"], item.get("read_only", True)
        if not isinstance(source, str) or not isinstance(target, str) or not target.startswith("/"):
            raise ConfigError(f"{_WHERE}.mounts.{i}: source a path, target an absolute path")
        if not isinstance(read_only, bool):
            raise ConfigError(f"{_WHERE}.mounts.{i}.read_only: true or false")
        out.append(Mount(str(Path(source).expanduser().absolute()), target, read_only))
    return tuple(out)


class HarborService:
    """Harbor task directories as an environment service (see the module docstring)."""

    path_options: ClassVar[tuple[PathOption, ...]] = (
        PathOption("dataset_dir"),
        PathOption("task_dirs"),
        PathOption("splits", relative_to="dataset_dir"),
        PathOption("dataset"),
        PathOption("lock", written=True),
        PathOption("cache", written=True),
        PathOption("tasks"),
        PathOption("overlays"),
        PathOption("image_map", written=True),
        PathOption("toolchain_root", written=True),
        PathOption("mounts[].source"),
    )
    DEPRECATED_KEYS: ClassVar[dict[str, DeprecatedKey]] = {
        "cache": DeprecatedKey("0.3.0", instead="the site profile's cache"),
        "image_map": DeprecatedKey("0.3.0", instead="the default image map of the site cache"),
        "toolchain_root": DeprecatedKey("0.3.0", instead="the site profile's cache"),
    }

    def __init__(self, **service_kwargs: Any) -> None:
        self.options = HarborOptions.parse(service_kwargs)
        self._task_dirs: dict[str, Path] | None = None
        self._splits: dict[str, list[str]] | None = None
        self._loaded: dict[str, HarborTask] = {}
        self._refused: dict[str, TaskRefused] = {}
        self._provider: Any = None
        self._split: Any = None

    @property
    def name(self) -> str:
        return self.options.name

    # -- tasks -----------------------------------------------------------------------------------------------------

    def _discover(self) -> dict[str, Path]:
        if self._task_dirs is not None:
            return self._task_dirs
        opts = self.options
        splits: dict[str, list[str]] | None = None
        own_splits: dict[str, list[str]] | None = None  # the dataset's splits.json
        if opts.fetched:
            found, splits, own_splits = self._fetched()
        elif opts.task_dirs:
            found = task_dirs_ids(opts.task_dirs)
        else:
            assert opts.dataset_dir is not None
            found = discover_tasks(opts.dataset_dir)
            own_splits = dataset_splits(opts.dataset_dir)
        runnable: dict[str, Path] = {}
        for task_id, path in found.items():
            try:
                task = read_task(path, task_id=task_id)
            except TaskRefused as exc:
                self._refused[task_id] = exc
                continue
            refusal = task_refusal(task, agent_user=opts.agent_user)
            if refusal is not None:
                self._refused[task_id] = refusal
                continue
            self._loaded[task_id] = task
            runnable[task_id] = path
        if self._refused:
            log.warning(
                "%s: %d task(s) refused, not listed: %s",
                opts.name,
                len(self._refused),
                "; ".join(f"{k}: {v.reason}" for k, v in list(self._refused.items())[:5]),
            )
        if opts.splits is not None and splits is None:
            splits = load_splits(opts.splits, opts.dataset_dir, runnable)
        elif splits is None and own_splits is not None:
            splits = runnable_splits(own_splits, runnable)
        checked = self._skip_quarantined(runnable)
        if splits is not None and len(checked) < len(runnable):
            splits = {name: [t for t in ids if t in checked] for name, ids in splits.items()}
        runnable = checked
        self._splits = splits
        self._task_dirs = runnable
        return runnable

    def _skip_quarantined(self, runnable: dict[str, Path]) -> dict[str, Path]:
        """The tasks the dataset check did not quarantine (`platoon_harbor.check`), one line per skipped task; one
        line when some have no verdict (a `required` run was refused before listing). `harbor_check: off`: all."""
        if self.options.harbor_check == "off" or not runnable:
            return runnable

        path = check_file.check_path(self.options.raw, harbor_cache(self.options.raw, None))
        if not path.is_file():
            check_file.say_once(f"{self.name}: the dataset is not checked: run `platoon harbor check CONFIG`")
            return runnable
        state = check_file.check_state(path, check_file.task_digests(runnable, fetched=self.options.fetched))
        for task_id, reason in state.quarantined.items():
            check_file.say_once(
                f"{self.name}: task {task_id} skipped, quarantined by the dataset check: {reason}"
            )
        if state.unchecked:
            check_file.say_once(
                f"{self.name}: {len(state.unchecked)} task(s) have no dataset check for their current content "
                f"(e.g. {state.unchecked[0]}): run `platoon harbor check CONFIG`"
            )
        return {k: v for k, v in runnable.items() if k not in state.quarantined}

    def _fetched(
        self,
    ) -> tuple[dict[str, Path], dict[str, list[str]] | None, dict[str, list[str]] | None]:
        """A fetched dataset's tasks from its lock (`datasets.resolve_dataset`; rollouts never fetch: a missing or
        stale lock raises `EnvNotPrepared` naming `platoon prepare`), with `holdout` the splits train/eval, and the
        dataset's own splits as the lock recorded them."""
        raw = self.options.raw
        resolved = resolve_dataset(raw, harbor_cache(raw, None))
        if raw.get("holdout") is None:
            return dict(resolved.tasks), None, resolved.splits()
        lock = resolved.lock or {}
        identity = {
            "dataset": lock.get("dataset"),
            "resolved": lock.get("resolved"),
            "inputs": lock.get("inputs"),
        }
        split = holdout_split(resolved.rows(), raw["holdout"], dataset=identity)
        self._split = split
        for line in split.report_lines():
            log.info("%s: %s", self.name, line)
        return dict(resolved.tasks), {"train": list(split.train), "eval": list(split.eval)}, None

    def split_record(self) -> dict[str, Any] | None:
        """The hold-out record a run writes into identity.json (None without `holdout`)."""
        self._discover()
        return self._split.record() if self._split is not None else None

    def harbor_task(self, task_id: str) -> HarborTask:
        """The parsed task of `task_id` (refused or unknown: ValueError naming the service)."""
        tasks = self._discover()
        if task_id in self._refused:
            raise ValueError(f"{self.name}: task {task_id!r} is refused: {self._refused[task_id].reason}")
        if task_id not in tasks:
            raise ValueError(f"{self.name}: no task {task_id!r}")
        return self._loaded[task_id]

    async def list_splits(self) -> list[str]:
        await asyncio.to_thread(self._discover)
        return list(self._splits) if self._splits is not None else ["train"]

    async def list_tasks(self, split: str) -> list[str]:
        tasks = await asyncio.to_thread(self._discover)
        known = list(self._splits) if self._splits is not None else ["train"]
        if split not in known:
            # Listing every task under a name the dataset does not have would train or evaluate on the wrong ones.
            raise ConfigError(f"{self.name}: no split {split!r}; known splits: {', '.join(known) or 'none'}")
        if self._splits is None:
            return list(tasks)
        if split == "eval" and self._split is not None and not self._splits[split]:
            raise ConfigError(eval_problem(self._split) or f"{self.name}: the eval split is empty")
        return list(self._splits[split])

    async def list_task_names(self, split: str) -> dict[str, str]:
        ids = await self.list_tasks(split)
        return {task_id: self._loaded[task_id].name for task_id in ids}

    async def get_task(self, task_id: str) -> Task:
        task = await asyncio.to_thread(self.harbor_task, task_id)
        return _as_task(task)

    def task_columns(self, ids: list[str]) -> dict[str, dict[str, Any]]:
        return {i: {"name": self._loaded[i].name} for i in ids if i in self._loaded}

    # -- deadlines -------------------------------------------------------------------------------------------

    def agent_timeout_for(self, task: HarborTask) -> float | None:
        if task.agent.timeout_sec is None:
            return None
        return task.agent.timeout_sec * self.options.agent_timeout_multiplier

    def agent_timeout_s(self, task_id: str) -> float | None:
        return self.agent_timeout_for(self.harbor_task(task_id))

    def grades_separately(self, task: HarborTask) -> bool:
        """Whether `task` is graded in a fresh verifier sandbox: always under `verifier_mode: separate` (the
        default), and under `shared` when the task itself asks for a separate verifier. Left unset on the process
        provider it is `shared`: that provider isolates nothing (the agent's commands run on the host), so a second
        sandbox would guard nothing."""
        mode = self.options.verifier_mode
        if mode is None:
            mode = "shared" if self.options.provider == "process" else "separate"
        return mode == "separate" or task.separate_verifier

    def verifier_timeout_s(self, task: HarborTask) -> float:
        return task.verifier.timeout_sec * self.options.verifier_timeout_multiplier

    def rollout_overhead_s(self, task_id: str) -> float:
        """Sandbox start budget (twice with a separate verifier) + healthcheck budget + verifier timeout + 120 s
        for grading + the close drain, so worker alarms never kill grading."""
        task = self.harbor_task(task_id)
        opts = self.options
        starts = opts.sandbox_start_budget_s * (2 if self.grades_separately(task) else 1)
        health = task.environment.healthcheck.budget_s if task.environment.healthcheck else 0.0
        return starts + health + self.verifier_timeout_s(task) + GRADING_ALLOWANCE_S + opts.close_timeout_s

    # -- provider --------------------------------------------------------------------------------------------------

    def provider_class(self) -> type[SandboxProvider]:
        return sandbox_runs.provider_class(self.options.provider)

    def provider(self) -> Any:
        if self._provider is None:
            cls = self.provider_class()
            try:
                self._provider = cls(**dict(self.options.provider_options))
            except TypeError as exc:
                raise ConfigError(f"{_WHERE}.provider_options: {cls.__name__} refuses them: {exc}") from None
            except SandboxError as exc:  # an option's value (egress_allow's entries, say)
                raise ConfigError(f"{_WHERE}.provider_options: {exc}") from None
        return self._provider

    def _capabilities(self) -> frozenset[str]:
        return frozenset(self.provider().capabilities or ())

    def image_for(self, task: HarborTask) -> str:
        """The sandbox image of `task`: its `docker_image`, else the entry's `default_image` (`local` for the
        process provider). A bare reference becomes `docker://<ref>`."""
        provider = self.provider()
        if getattr(provider, "name", None) == "process":
            return "local"
        raw = self.options.raw
        if task.dockerfile is not None and (self.options.fetched or raw.get("image_map")):
            # A Dockerfile task of a fetched dataset (or an entry with an image map): its image was built once per
            # site by `platoon prepare`; a missing one is EnvNotPrepared, never the default image.
            return _scheme(
                images.image_for(
                    task,
                    str(getattr(provider, "name", self.options.provider)),
                    harbor_cache(raw, None),
                    image_map=raw.get("image_map"),
                    default=self.options.default_image,
                )
            )
        ref = task.environment.docker_image or self.options.default_image
        if not ref:
            hint = (
                " (its environment/Dockerfile is built by `platoon harbor images build`, which a dataset_dir entry "
                "does not run)"
                if task.dockerfile
                else ""
            )
            raise EnvNotPrepared(
                f"Harbor task {task.id} names no [environment] docker_image and the entry sets no default_image{hint}"
            )
        return _scheme(ref)

    def _refusal(self, task: HarborTask) -> str | None:
        """Why this entry cannot run `task`, or None: a `${VAR}` it is not given, GPUs or no network the provider
        lacks."""
        venv = task.verifier.environment
        unpassed = [
            *unpassed_variables(
                task.environment.env, self.options.pass_env, what=f"Harbor task {task.id} [environment].env"
            ),
            *unpassed_variables(
                venv.env if venv else {},
                self.options.pass_env,
                what=f"Harbor task {task.id} [verifier.environment].env",
            ),
            *unpassed_variables(
                task.verifier.env, self.options.pass_env, what=f"Harbor task {task.id} [verifier].env"
            ),
        ]
        if unpassed:
            return unpassed[0]
        caps = self._capabilities()
        if task.environment.gpus and "gpu" not in caps:
            return f"Harbor task {task.id} needs {task.environment.gpus} GPU(s); provider {self.options.provider} has none"
        phases = [("agent", agent_network(task))]
        if self.grades_separately(task):
            phases.append(("verifier", verifier_network(task)))
        for phase, (network, _hosts) in phases:
            reason = self.provider_class().network_refusal(network, dict(self.options.provider_options))
            if not reason:
                continue
            if network == "none" and phase == "agent":
                return f"Harbor task {task.id} runs without network, which provider {self.options.provider} refuses: {reason}"
            return (
                f"Harbor task {task.id} runs its {phase} with network_mode {_HARBOR_MODES[network]}, which provider "
                f"{self.options.provider} refuses: {reason}"
            )
        return self._limits_refusal(task)

    # -- limits and users ---------------------------------------------------------------------------

    def _provider_unavailable(self) -> str | None:
        """Why the provider cannot run here with its options (the docker provider: a `runtime` the engine lacks)."""
        answer = self.provider_class().unavailable(dict(self.options.provider_options))
        return str(answer) if answer else None

    def _spec_refusal(self, fields: Mapping[str, Any]) -> str | None:
        """The provider's answer to a spec setting `fields` (its `refusal(spec, options)`, by default what its
        capabilities do not enforce), or None when it would start one."""
        answer = self.provider_class().refusal(SandboxSpec(**fields), dict(self.options.provider_options))
        return str(answer) if answer else None

    def _task_limits(self, task: HarborTask) -> list[tuple[str, str, Any]]:
        """(where in task.toml, SandboxSpec field, value) of every limit and user the task sets, for the agent's
        sandbox and for the verifier's."""
        venv = task.verifier.environment or task.environment
        found: list[tuple[str, str, Any]] = []
        for table, settings in (("[environment]", task.environment), ("[verifier.environment]", venv)):
            for name in ("cpus", "memory_mb", "storage_mb"):
                if (value := getattr(settings, name)) is not None:
                    found.append((f"{table}.{name}", name, value))
        if self.options.agent_user == "run":
            for table, user in (("[agent]", task.agent.user), ("[verifier]", task.verifier.user)):
                if user is not None:
                    found.append((f"{table}.user", "user", user))
        return found

    def _limits_refusal(self, task: HarborTask) -> str | None:
        """Why the provider cannot honour the task's user or limits, in one line naming the key and the way out."""
        for where, name, value in self._task_limits(task):
            if name != "user" and self.options.limits == "ignore":
                continue
            reason = self._spec_refusal({name: value})
            if reason:
                knob = "agent_user: ignore" if name == "user" else "limits: ignore"
                return f"Harbor task {task.id} {where} = {value!r}: {reason} (or set service_kwargs.{knob})"
        return None

    def _sandbox_limits(self, settings: EnvironmentSettings, user: str | None) -> dict[str, Any]:
        """The SandboxSpec fields of a task's limits and user; under `limits: ignore`, without the limits the
        provider cannot enforce."""
        fields: dict[str, Any] = {
            "cpus": settings.cpus,
            "memory_mb": settings.memory_mb,
            "storage_mb": settings.storage_mb,
            "user": user if self.options.agent_user == "run" else None,
        }
        if self.options.limits == "ignore":
            for name in ("cpus", "memory_mb", "storage_mb"):
                if fields[name] is not None and self._spec_refusal({name: fields[name]}):
                    fields[name] = None
        return fields

    def _network_isolated(self, spec: Any) -> bool:
        """Whether the provider really gave `spec` a network namespace of its own (else the sandbox shares the
        host's network, as a provider allowed onto it does)."""
        return spec.network != "host" and f"network_{spec.network}" in self._capabilities()

    def _unconfined(self) -> str | None:
        """Why the provider would run this entry's commands unconfined, or None (the process
        provider without bubblewrap is refused unless the run config's `provider_options.confine: none` accepts
        it; a site profile cannot set that option)."""
        reason = self.provider_class().unconfined_refusal(dict(self.options.provider_options))
        return f"provider {self.options.provider}: {reason}" if reason else None

    async def check_tasks(self, split: str, ids: list[str]) -> None:
        """Run-start checks: the provider's rootfs-layout refusal, no-network or GPU tasks it refuses, and
        tasks without an image. Raises an `env_config` error."""
        problems: list[str] = []
        reason = self.provider_class().rootfs_layout_refusal(dict(self.options.provider_options))
        if reason:
            problems.append(f"provider {self.options.provider}: {reason}")
        if (reason := self._provider_unavailable()) is not None:
            problems.append(f"provider {self.options.provider}: {reason}")
        unconfined = await asyncio.to_thread(self._unconfined)  # probes bubblewrap once per process
        if unconfined:
            problems.append(unconfined)
        not_prepared: list[str] = []
        for task_id in ids:
            task = await asyncio.to_thread(self.harbor_task, task_id)
            refusal = self._refusal(task)
            if refusal:
                problems.append(refusal)
            try:
                self.image_for(task)
            except EnvNotPrepared as exc:
                not_prepared.append(exc.message)
        if not_prepared and not problems:
            raise EnvNotPrepared("; ".join(not_prepared[:5]))
        if problems or not_prepared:
            raise EnvSetupError("env_config", "; ".join([*problems, *not_prepared][:5]))

    # -- sessions --------------------------------------------------------------------------------------------------

    def _resolve(self, task: Task) -> HarborTask:
        misc = task.misc.get("harbor") if isinstance(task.misc, Mapping) else None
        task_dir = misc.get("task_dir") if isinstance(misc, Mapping) else None
        if task_dir:
            try:
                parsed = read_task(task_dir, task_id=task.id or None)
            except TaskRefused as exc:
                raise EnvSetupError("env_config", str(exc)) from None
            refusal = task_refusal(parsed, agent_user=self.options.agent_user)
            if refusal is not None:
                raise EnvSetupError("env_config", str(refusal))
            return parsed
        if not task.id:
            raise EnvSetupError("env_config", f"{self.name}: the task has no id and no misc.harbor.task_dir")
        try:
            return self.harbor_task(task.id)
        except ValueError as exc:
            raise EnvSetupError("env_config", str(exc)) from None

    def _spec(
        self, task: HarborTask, rollout_id: str, needs: SessionNeeds | None
    ) -> tuple[Any, dict[str, str]]:
        opts = self.options
        try:
            task_env = resolve_env(
                task.environment.env, passed=opts.pass_env, what=f"Harbor task {task.id} [environment].env"
            )
        except (UnsetVariable, VariableNotPassed) as exc:
            raise EnvSetupError("env_config", str(exc)) from None
        env = {**opts.env, **task_env}
        labels = {"platoon.env": opts.name, "platoon.rollout_id": rollout_id or "-", "platoon.task": task.id}
        network, allowed_hosts = agent_network(task)
        spec = SandboxSpec(
            image=self.image_for(task),
            workdir=task.environment.workdir or opts.workdir,
            env=env,
            mounts=tuple(opts.mounts),
            network=network,
            allowed_hosts=allowed_hosts,
            labels=labels,
            **self._sandbox_limits(task.environment, task.agent.user),
        )
        if needs is not None:
            try:
                spec = needs.apply(spec)
            except ValueError as exc:  # a TCP upstream a sandbox off the host network cannot reach
                raise EnvSetupError(
                    "harness_setup", f"the rollout's routes do not fit the sandbox: {exc}"
                ) from None
        return spec, env

    async def open(
        self,
        task: Task,
        *,
        rollout_id: str,
        needs: SessionNeeds | None = None,
        view_task: Task | None = None,
    ) -> HarborSession:
        """Start the task's sandbox and return its session; failures raise `EnvSetupError`."""
        try:
            htask = await asyncio.to_thread(self._resolve, task)
            refusal = await asyncio.to_thread(self._unconfined) or self._refusal(htask)
            if refusal:
                raise EnvSetupError("env_config", refusal)
            spec, env = self._spec(htask, rollout_id, needs)
            verifier_spec, bundled = (
                self._verifier_spec(htask, spec, rollout_id)
                if self.grades_separately(htask)
                else (None, False)
            )
            provider = self.provider()
        except ConfigError as exc:
            raise EnvSetupError("env_config", str(exc)) from None
        sandbox = await self._start(provider, spec)
        try:
            await self._prepare(sandbox, htask, spec.workdir, spec.user)
        except BaseException:
            await _stop_quietly(sandbox)
            raise
        caps = self._capabilities()
        isolated = self._network_isolated(spec)
        opened = OpenedSandbox(
            sandbox=sandbox,
            spec=spec,
            task=htask,
            env=env,
            workdir=spec.workdir,
            label=f"{self.name}:{htask.id}",
            network_isolated=isolated,
            host_loopback=not isolated and "host_loopback" in caps,
            needs=needs,
            rollout_id=rollout_id,
            verifier_spec=verifier_spec,
            bundled_tests=bundled,
        )
        return HarborSession(LiveSandbox(self, opened), view_task or task)

    def _verifier_spec(self, task: HarborTask, main: Any, rollout_id: str) -> tuple[Any, bool]:
        """A separate verifier's sandbox spec, checked when the session opens (its env is resolved at grading), and
        whether its image bundles the tests. Image: `[verifier.environment].docker_image`, else the image the site built
        from `tests/Dockerfile`, else the task's own. Only read-only service mounts reach it; no needs."""
        venv = task.verifier.environment
        provider = self.provider()
        if getattr(provider, "name", None) == "process":
            image = "local"
        elif not task.separate_verifier:  # separate only by the service's choice: the task's own image
            image = main.image
        elif venv is not None and venv.docker_image:
            image = _scheme(venv.docker_image)
        elif task.verifier_dockerfile is not None:
            # Built once per site with the task's own image (`platoon prepare`); runs never build.
            raw = self.options.raw
            if not (self.options.fetched or raw.get("image_map")):
                raise EnvNotPrepared(
                    f"Harbor task {task.id}: its verifier image (tests/Dockerfile) needs an image map: a fetched "
                    "dataset, or image_map"
                )
            image = _scheme(
                images.image_for(
                    task,
                    str(getattr(provider, "name", self.options.provider)),
                    harbor_cache(raw, None),
                    image_map=raw.get("image_map"),
                    role="verifier",
                )
            )
        else:
            image = main.image
        network, allowed_hosts = verifier_network(task)
        labels = {**dict(main.labels), "platoon.role": "verifier"}
        spec = SandboxSpec(
            image=image,
            workdir=(venv.workdir if venv else None) or task.environment.workdir or self.options.workdir,
            env={},
            mounts=tuple(m for m in self.options.mounts if m.read_only),
            network=network,
            allowed_hosts=allowed_hosts,
            labels=labels,
            **self._sandbox_limits(venv or task.environment, task.verifier.user),
        )
        return spec, image != main.image

    async def start_verifier(self, spec: Any) -> Any:
        """Start a separate verifier's sandbox (no healthcheck runs there)."""
        return await self.provider().start(spec)

    async def _start(self, provider: Any, spec: Any, snapshot: Any = None) -> Any:
        try:
            if snapshot is not None:
                return await provider.restore(snapshot, spec)
            return await provider.start(spec)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            text = f"{type(exc).__name__}: {exc}"
            kind = (
                "harness_setup"
                if spec.upstreams and ("route" in text or "forwarder" in text)
                else "sandbox_start"
            )
            raise EnvSetupError(kind, f"the sandbox did not start: {text}") from exc

    async def _prepare(self, sandbox: Any, task: HarborTask, workdir: str, user: str | None = None) -> None:
        """Make the log directories and the workdir; with a task user, as root, then theirs (the agent's logs and
        artifacts, and a workdir the image did not have)."""
        dirs = ["/logs/agent", "/logs/verifier", "/logs/artifacts", workdir]
        setup = as_user(sandbox, "0" if user is not None else None)
        try:
            result = await setup.exec(["mkdir", "-p", *dirs], timeout_s=120, cwd="/")
            if result.exit_code == 0:
                await give(setup, user, ["/logs/agent", "/logs/artifacts"], if_empty=[workdir])
        except Exception as exc:
            raise EnvSetupError(
                "env_setup", f"preparing the sandbox failed: {type(exc).__name__}: {exc}"
            ) from exc
        if result.exit_code != 0:
            raise EnvSetupError(
                "env_setup",
                f"mkdir of the log dirs failed (exit {result.exit_code}): {result.stderr.strip()[:300]}",
            )
        if task.environment.healthcheck is not None:
            await _healthcheck(sandbox, task, workdir)

    async def open_copy(self, session: HarborSession, child_task: Task) -> HarborSession:
        """A `copy` fork: a snapshot taken under an exclusive turn, restored as a new sandbox."""
        live = session._lease
        if "snapshot" not in self._capabilities():
            raise EnvSetupError(
                "env_config",
                f"provider {self.options.provider} cannot snapshot: fork with mode shared or fresh",
            )
        snapshot = await live.gate.run(live.sandbox.snapshot, "exclusive", caller=session, what="copy")
        opened = live.opened
        sandbox = await self._start(self.provider(), opened.spec, snapshot)
        copy = OpenedSandbox(**{**opened.__dict__, "sandbox": sandbox, "label": f"{opened.label} (copy)"})
        return HarborSession(LiveSandbox(self, copy), child_task)


#: Harbor's network modes and the sandbox networks they run under: no policy shares the host's.
SandboxNetwork = Literal["none", "public", "allowlist"]
_NETWORKS: dict[str, SandboxNetwork] = {"no-network": "none", "public": "public", "allowlist": "allowlist"}
_HARBOR_MODES = {network: mode for mode, network in _NETWORKS.items()}


def agent_network(task: HarborTask) -> tuple[SandboxNetwork, tuple[str, ...]]:
    """The agent's sandbox network and allowed hosts: `[agent]`'s `network_mode` and `allowed_hosts` where it sets
    them, else `[environment]`'s."""
    mode = task.agent.network_mode or task.environment.network_mode
    hosts = (
        task.agent.allowed_hosts if task.agent.allowed_hosts is not None else task.environment.allowed_hosts
    )
    network = _NETWORKS[mode]
    return network, (tuple(hosts or ()) if network == "allowlist" else ())


def verifier_network(task: HarborTask) -> tuple[SandboxNetwork, tuple[str, ...]]:
    """A separate verifier's network and allowed hosts: `[verifier]`'s, else `[verifier.environment]`'s, else
    `[environment]`'s (a shared verifier runs in the agent's sandbox, under the agent's)."""
    venv = task.verifier.environment
    mode = (
        task.verifier.network_mode or (venv.network_mode if venv else None) or task.environment.network_mode
    )
    hosts = next(
        (
            h
            for h in (
                task.verifier.allowed_hosts,
                venv.allowed_hosts if venv else None,
                task.environment.allowed_hosts,
            )
            if h is not None
        ),
        (),
    )
    network = _NETWORKS[mode]
    return network, (tuple(hosts) if network == "allowlist" else ())


def _scheme(ref: str) -> str:
    """A bare image reference as `docker://<ref>`; schemes, image files and `local` as they are."""
    if "://" in ref or ref.endswith((".sif", ".sqsh")) or ref.startswith("/") or ref == "local":
        return ref
    return f"docker://{ref}"


def _as_task(task: HarborTask) -> Task:
    return Task(
        goal=task.instruction, id=task.id, misc={"harbor": {"task_dir": str(task.path), "name": task.name}}
    )


async def _stop_quietly(sandbox: Any) -> None:
    try:
        await asyncio.shield(sandbox.stop())
    except Exception as exc:
        log.warning("stopping a sandbox that failed to prepare: %s: %s", type(exc).__name__, exc)


async def _healthcheck(sandbox: Any, task: HarborTask, workdir: str) -> None:
    """Docker's rules: failures in the start period do not count; `retries` consecutive failures after it do."""
    check = task.environment.healthcheck
    assert check is not None
    started = time.monotonic()
    failures = 0
    last = ""
    while True:
        try:
            result = await sandbox.exec(check.command, timeout_s=check.timeout_sec, cwd=workdir)
            ok = result.exit_code == 0 and not result.timed_out
            last = (
                "timed out"
                if result.timed_out
                else f"exit {result.exit_code}: {(result.stdout + result.stderr).strip()[-300:]}"
            )
        except Exception as exc:
            ok, last = False, f"{type(exc).__name__}: {exc}"
        if ok:
            return
        in_start = time.monotonic() - started < check.start_period_sec
        if not in_start:
            failures += 1
            if failures >= max(1, check.retries):
                raise EnvSetupError(
                    "env_healthcheck",
                    f"Harbor task {task.id}: the healthcheck failed {failures} time(s); last: {last}",
                )
        await asyncio.sleep(check.start_interval_sec if in_start else check.interval_sec)
