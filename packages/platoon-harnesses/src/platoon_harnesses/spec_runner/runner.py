"""`SpecRunner`: runs the root agent of a rollout on a TOML spec, on the host or in the task sandbox.

One runner per process (core keeps it); installs are cached on it per (install spec, host, toolchain). Per
rollout, `open_rollout` gives a `SpecRollout`: `needs()` serves the rollout's gateway on a private Unix socket for
the task sandbox (before the session opens), `run()` launches the agent, `aclose()` stops the servers.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import secrets
import shutil
import socket
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from platoon.envs.service import SessionNeeds
from platoon.gateway import GatewayServer, mount_mcp
from platoon.harness.spec import HarnessSetupError, SpecError, check_options
from platoon_harnesses import toolchains
from platoon_harnesses.spec_runner import local, sandboxed
from platoon_harnesses.spec_runner.launch import (
    DEFAULT_GRACE_S,
    agent_slug,
    builtins_disabled,
    effective_timeout,
    install_commands,
    launch_values,
    new_marker,
    node_scratch,
    plan,
    result_of,
)

if TYPE_CHECKING:
    from collections.abc import Mapping

    from platoon.gateway import AgentRecord
    from platoon.harness.agent import AgentContext, AgentResult
    from platoon.harness.spec import HarnessSpec

    class Agent(AgentContext, Protocol):
        """The running agent core hands a spec runner: its context, and the gateway record its calls are keyed by."""

        @property
        def record(self) -> AgentRecord: ...


__all__ = ["SpecRollout", "SpecRunner"]

#: AF_UNIX paths longer than this do not bind (108 bytes with the terminating NUL on Linux)
_UNIX_PATH_MAX = 107


@dataclass(frozen=True)
class ToolchainMount:
    """A staged toolchain bound read-only at its build path in the task sandbox (a sandbox `Mount` by shape)."""

    source: str
    target: str
    read_only: bool = True


class SpecRunner:
    """The spec runner of platoon-harnesses (core instantiates it once per process)."""

    def __init__(self) -> None:
        self.grace_s = DEFAULT_GRACE_S
        #: install keys done on the host
        self._host_installs: set[tuple[str, ...]] = set()
        #: install keys done per live sandbox (a new sandbox is a new host)
        self._sandbox_installs: weakref.WeakKeyDictionary[Any, set[tuple[str, ...]]] = (
            weakref.WeakKeyDictionary()
        )
        self._sandbox_installs_by_id: dict[int, tuple[weakref.ref[Any] | None, set[tuple[str, ...]]]] = {}
        #: (install key, host, loop id) -> the lock one install holds while others wait for it
        self._locks: dict[tuple[Any, ...], asyncio.Lock] = {}

    def open_rollout(
        self,
        spec: HarnessSpec,
        *,
        gateway: Any,
        rollout: Any,
        placement: str = "auto",
        builtins: str = "default",
        logs_dir: Path | None = None,
    ) -> SpecRollout:
        return SpecRollout(
            self,
            spec,
            gateway=gateway,
            rollout=rollout,
            placement=placement,
            builtins=builtins,
            logs_dir=logs_dir,
        )

    # ---- installs, once per (install spec, host, toolchain)

    def _done_set(self, sandbox: Any) -> set[tuple[str, ...]]:
        if sandbox is None:
            return self._host_installs
        try:
            return self._sandbox_installs.setdefault(sandbox, set())
        except TypeError:  # an unhashable or un-weakref-able sandbox: keyed by id, checked for reuse
            ref, done = self._sandbox_installs_by_id.get(id(sandbox), (None, set()))
            if ref is None or ref() is not sandbox:
                done = set()
                try:
                    ref = weakref.ref(sandbox)
                except TypeError:
                    ref = None
                self._sandbox_installs_by_id[id(sandbox)] = (ref, done)
            return done

    async def ensure_installed(
        self, spec: HarnessSpec, toolchain: str | None, sandbox: Any, run: Any
    ) -> None:
        """Run `run()` (the spec's install commands) unless this (install spec, host, toolchain) was installed by
        this runner; concurrent rollouts of one key wait for the first."""
        if spec.install is None or not spec.install.commands:
            return
        digest = hashlib.sha256("\0".join(spec.install.commands).encode()).hexdigest()[:16]
        key = (str(spec.path), digest, toolchain or "")
        done = self._done_set(sandbox)
        if key in done:
            return
        host = "local" if sandbox is None else id(sandbox)
        lock = self._locks.setdefault((key, host, id(asyncio.get_running_loop())), asyncio.Lock())
        async with lock:
            if key in done:
                return
            await run()
            done.add(key)


class SpecRollout:
    """One rollout's use of a spec (the `platoon.episode.spec_runs.SpecRollout` core drives)."""

    def __init__(
        self,
        runner: SpecRunner,
        spec: HarnessSpec,
        *,
        gateway: Any,
        rollout: Any,
        placement: str,
        builtins: str,
        logs_dir: Path | None,
    ) -> None:
        self.runner = runner
        self.spec = spec
        self.gateway = gateway
        self.rollout = rollout
        self.placement = placement
        self.builtins = builtins
        self.logs_dir = logs_dir or node_scratch() / f"platoon-harness-{os.getuid()}" / "logs"
        self.misc: dict[str, Any] = {}
        self._tcp: Any = None
        self._unix: Any = None
        self._socket_dir: Path | None = None
        #: (host path, build path) of the staged toolchain, when one was prepared for the sandbox
        self._toolchain: tuple[str, str] | None = None

    # ---- servers

    def _server(self, **kwargs: Any) -> Any:
        server = GatewayServer(self.gateway, rollouts=[self.rollout.rollout_id], **kwargs)
        mount_mcp(server)
        return server

    async def _tcp_base_url(self) -> str:
        """This rollout's gateway on loopback TCP (its keys only, the MCP plane mounted), started once."""
        if self._tcp is None:
            server = self._server()
            await server.astart()
            self._tcp = server
        return str(self._tcp.base_url)

    def _socket_path(self) -> Path:
        name = secrets.token_hex(6)
        for base in (node_scratch(), Path("/tmp")):
            path = base / f"pgw-{os.getuid()}" / name / "gw.sock"
            if len(os.fsencode(path)) <= _UNIX_PATH_MAX:
                return path
        raise HarnessSetupError(
            "no directory short enough for the gateway's Unix socket (AF_UNIX path limit)"
        )

    # ---- session needs

    async def needs(self) -> SessionNeeds | None:
        """The gateway on a private 0700 socket dir for this rollout only, passed as the upstream `gateway`; the
        toolchain mount; the extra memory."""
        if self.placement == "local":
            return None
        upstreams: dict[str, str] = {}
        if hasattr(socket, "AF_UNIX") and self._unix is None:
            path = self._socket_path()
            path.parent.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            path.parent.mkdir(mode=0o700)
            self._socket_dir = path.parent
            server = self._server(unix_socket=path)
            await server.astart()
            self._unix = server
        if self._unix is not None:
            upstreams[sandboxed.GATEWAY_UPSTREAM] = str(self._unix.upstream)
        mounts: list[ToolchainMount] = []
        if self.spec.toolchain is not None:
            source, target = await self._stage_toolchain()
            self._toolchain = (source, target)
            mounts.append(ToolchainMount(source, target))
        return SessionNeeds(
            upstreams=upstreams, mounts=tuple(mounts), extra_memory_mb=self.spec.resources_memory_mb or 0
        )

    async def aclose(self) -> None:
        for server in (self._unix, self._tcp):
            if server is not None:
                try:
                    await server.astop()
                except Exception:  # a server that failed to stop cleanly: its socket dir still goes
                    pass
        self._unix = self._tcp = None
        if self._socket_dir is not None:
            shutil.rmtree(self._socket_dir, ignore_errors=True)
            self._socket_dir = None

    # ---- toolchains

    def _toolchains(self) -> Any:
        return toolchains

    async def _toolchain_path(self) -> Path:
        """The toolchain's directory on this site, checked ready (a refusal names the build command)."""
        toolchains = self._toolchains()
        try:
            root = toolchains.toolchain_root()
            problem = toolchains.check(self.spec, root)
        except toolchains.ToolchainError as exc:
            raise HarnessSetupError(str(exc)) from exc
        if problem is not None:
            raise HarnessSetupError(problem)
        return Path(toolchains.toolchain_path(self.spec, root))

    async def _stage_toolchain(self) -> tuple[str, str]:
        """(the node-local staged copy, the build path it is bound at in the sandbox)."""
        toolchains = self._toolchains()
        path = await self._toolchain_path()
        if not path.is_dir():
            raise HarnessSetupError(
                f"toolchain {self.spec.toolchain} of {self.spec.ref} is not built ({path})"
            )
        manifest = toolchains.read_manifest(path) or {}
        build_path = str(manifest.get("build_path") or path)
        try:
            staged = await asyncio.to_thread(toolchains.stage, path)
        except (OSError, toolchains.ToolchainError) as exc:
            raise HarnessSetupError(f"toolchain {self.spec.toolchain} could not be staged: {exc}") from exc
        return str(staged), build_path

    # ---- the run

    def _placement(self, sandbox: Any) -> str:
        if self.placement == "local":
            return "local"
        if self.placement == "task_sandbox" and sandbox is None:
            raise SpecError(
                f"placement: task_sandbox: the environment's session has no task sandbox to run harness "
                f"{self.spec.ref} in; use placement: auto or local"
            )
        return "task_sandbox" if sandbox is not None else "local"

    def _max_steps(self, agent: Agent) -> int | None:
        return agent.max_steps or self.spec.max_steps

    def _enforce_budget(self, agent: Agent) -> None:
        if self.spec.budget_enforce != "gateway":
            return
        steps = self._max_steps(agent)
        if steps is None:
            raise SpecError(
                f"harness {self.spec.ref} ({self.spec.path}) enforces its step budget at the gateway, but neither "
                "the run nor the spec sets max_steps"
            )
        self.gateway.set_call_cap(agent.record, int(steps))

    async def run(self, agent: Agent, *, options: Mapping[str, Any], timeout: float | None) -> AgentResult:
        spec = self.spec
        checked = check_options(spec, options)
        sandbox = getattr(agent.session, "sandbox", None)
        placement = self._placement(sandbox)
        slug = agent_slug(spec, agent.agent_id)
        log_path = self.logs_dir / f"{slug}.log"
        limit = effective_timeout(spec, timeout)
        self.misc.update(placement=placement, exit_code=None, timed_out=False, logs_path=str(log_path))
        disable = builtins_disabled(spec, self.builtins, placement)
        self._enforce_budget(agent)
        common = {
            "options": checked,
            "instruction": agent.instruction,
            "api_key": agent.record.secret,
            "model": self.gateway.model_name,
            "max_steps": self._max_steps(agent),
        }
        if placement == "local":
            ran: Any = await self._run_local(agent, slug, common, disable, log_path, limit)
        else:
            ran = await self._run_sandboxed(agent, sandbox, slug, common, disable, log_path, limit)
        self.misc.update(exit_code=ran.exit_code, timed_out=ran.timed_out)
        return result_of(
            spec,
            exit_code=ran.exit_code,
            timed_out=ran.timed_out,
            timeout=limit,
            final_message=ran.final_message,
            output_tail=ran.output_tail,
        )

    async def _run_local(
        self,
        agent: Agent,
        slug: str,
        common: dict[str, Any],
        disable: bool,
        log_path: Path,
        limit: float | None,
    ) -> local.Ran:
        spec = self.spec
        toolchain = None
        if spec.toolchain is not None:
            path = await self._toolchain_path()
            toolchain = str(path)
        base_url = await self._tcp_base_url()
        state = local.make_state_dir(slug)
        try:
            values = launch_values(
                spec,
                base_url=base_url,
                workdir=str(state / "work"),
                state_dir=str(state),
                toolchain=toolchain,
                **common,
            )
            launch_plan = plan(spec, values, mcp=spec.mcp_enabled, disable_builtins=disable)
            await asyncio.to_thread(local.write_files, launch_plan)
            if spec.install is not None:
                install = spec.install
                commands = install_commands(spec, values)

                async def run_install() -> None:
                    await local.install(
                        commands, cwd=state, env=local.base_env(), timeout_s=install.timeout_s
                    )

                await self.runner.ensure_installed(spec, toolchain, None, run_install)
                if toolchain is not None and not Path(toolchain).is_dir():
                    raise HarnessSetupError(
                        f"toolchain {spec.toolchain} of {spec.ref}: {toolchain} does not exist"
                    )
            return await local.launch(
                spec,
                launch_plan,
                state=state,
                log_path=log_path,
                marker=new_marker(slug),
                timeout=limit,
                grace_s=self.runner.grace_s,
            )
        finally:
            await asyncio.to_thread(local.remove_state, state)

    async def _run_sandboxed(
        self,
        agent: Agent,
        sandbox: Any,
        slug: str,
        common: dict[str, Any],
        disable: bool,
        log_path: Path,
        limit: float | None,
    ) -> sandboxed.Ran:
        spec = self.spec
        route = await sandboxed.gateway_route(agent.session, sandbox)
        base_url = route if route is not None else await self._tcp_base_url()
        # Model-written code in the sandbox can read the key: the root may make policy calls only.
        self.gateway.restrict_to_policy(agent.record)
        toolchain = None
        if spec.toolchain is not None:
            if self._toolchain is None:
                raise HarnessSetupError(
                    f"toolchain {spec.toolchain} of {spec.ref} is not mounted in the task sandbox: the environment's "
                    "service did not take the rollout's session needs"
                )
            toolchain = self._toolchain[1]
        cwd = await sandboxed.workdir(sandbox)
        state = sandboxed.state_dir(slug)
        values = launch_values(
            spec, base_url=base_url, workdir=cwd, state_dir=state, toolchain=toolchain, **common
        )
        launch_plan = plan(spec, values, mcp=spec.mcp_enabled, disable_builtins=disable)
        await sandboxed.prepare(sandbox, state, launch_plan)
        if spec.install is not None:
            install = spec.install

            commands = install_commands(spec, values)

            async def run_install() -> None:
                await sandboxed.install(sandbox, commands, timeout_s=install.timeout_s)

            await self.runner.ensure_installed(spec, toolchain, sandbox, run_install)
        if toolchain is not None:
            await sandboxed.check_dir(sandbox, toolchain, f"toolchain {spec.toolchain}")
        return await sandboxed.launch(
            spec,
            sandbox,
            launch_plan,
            log_path=log_path,
            marker=new_marker(slug),
            timeout=limit,
            grace_s=self.runner.grace_s,
        )
