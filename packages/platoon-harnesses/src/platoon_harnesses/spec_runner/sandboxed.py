"""Task-sandbox placement: the agent runs inside the session's sandbox, reaching the gateway through the
sandbox's route (or the host's loopback when it shares the host network). The runner's own commands run with
cwd `/` (the agent may delete its workdir); every process of the launch carries the marker, and a script inside
ends them by it at the deadline, on cancellation and after every exit. The state dir dies with the sandbox.
"""

from __future__ import annotations

import asyncio
import posixpath
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from platoon.harness.spec import HarnessSetupError
from platoon_harnesses.spec_runner.kill import SANDBOX_KILL_SCRIPT, uncancellable
from platoon_harnesses.spec_runner.launch import (
    MARKER_VAR,
    Plan,
    final_from_file,
    final_from_output,
    install_command_label,
    tail,
    with_loopback,
)

if TYPE_CHECKING:
    from platoon.harness.spec import HarnessSpec

STATE_ROOT = "/tmp/platoon-harness"
#: the upstream name the session needs give the rollout's Unix-socket gateway
GATEWAY_UPSTREAM = "gateway"
_SHORT_S = 60.0


def state_dir(slug: str) -> str:
    return f"{STATE_ROOT}/{slug}"


def _isolated(session: Any, sandbox: Any) -> bool:
    flag = getattr(session, "network_isolated", None)
    if flag is not None:
        return bool(flag)
    return getattr(getattr(sandbox, "spec", None), "network", "host") == "none"


def _host_loopback(session: Any, sandbox: Any) -> bool:
    flag = getattr(session, "host_loopback", None)
    if flag is not None:
        return bool(flag)
    return getattr(getattr(sandbox, "spec", None), "network", "host") == "host"


async def gateway_route(session: Any, sandbox: Any) -> str | None:
    """The sandbox's route to this rollout's gateway (forwarders re-ensured first), or None when the sandbox shares
    the host network and reaches the gateway on loopback. Refusals are setup errors."""
    ensure = getattr(sandbox, "ensure_routes", None)
    if ensure is not None:
        try:
            await ensure()
        except Exception as exc:
            raise HarnessSetupError(
                f"the task sandbox's gateway route cannot be (re)started: {type(exc).__name__}: {exc}"
            ) from exc
    route = dict(getattr(sandbox, "routes", None) or {}).get(GATEWAY_UPSTREAM)
    if route:
        return str(route).rstrip("/")
    if _isolated(session, sandbox):
        raise HarnessSetupError(
            "the task sandbox has no network and no gateway route: the harness could not reach the model (the "
            "environment's service must accept session needs to get the rollout's gateway socket)"
        )
    if not _host_loopback(session, sandbox):
        raise HarnessSetupError(
            "the task sandbox does not share the host network and has no gateway route: the harness could not "
            "reach the model"
        )
    return None


async def _run(sandbox: Any, argv: list[str], *, cwd: str = "/", timeout_s: float = _SHORT_S) -> Any:
    return await sandbox.exec(argv, cwd=cwd, timeout_s=timeout_s)


async def workdir(sandbox: Any) -> str:
    """What `pwd` reports in the sandbox (its working directory)."""
    try:
        result = await sandbox.exec(["pwd"], timeout_s=_SHORT_S)
    except OSError as exc:  # the process provider raises when the working directory cannot be entered
        raise HarnessSetupError(f"cannot enter the task sandbox's working directory: {exc}") from exc
    if result.exit_code != 0 or not result.stdout.strip():
        raise HarnessSetupError(
            f"cannot find the task sandbox's working directory (pwd exited {result.exit_code}: "
            f"{tail(result.stderr or result.stdout, 300)})"
        )
    return str(result.stdout.strip().splitlines()[-1])


async def prepare(sandbox: Any, state: str, launch_plan: Plan) -> None:
    """Make the state dir and put the launch's files and assets in place: those under the state dir in one upload,
    any others one by one."""
    made = await _run(sandbox, ["mkdir", "-p", state])
    if made.exit_code != 0:
        raise HarnessSetupError(f"cannot create {state} in the task sandbox: {tail(made.stderr, 300)}")
    with tempfile.TemporaryDirectory(prefix="platoon-harness-") as scratch:
        staged = Path(scratch)
        loose: list[tuple[Path, str]] = []
        for index, (path, content) in enumerate(launch_plan.files.items()):
            host = _staged_path(staged, state, path, index, loose)
            host.parent.mkdir(parents=True, exist_ok=True)
            host.write_text(content, encoding="utf-8")
        for index, (path, source) in enumerate(launch_plan.assets.items(), start=len(launch_plan.files)):
            host = _staged_path(staged, state, path, index, loose)
            host.parent.mkdir(parents=True, exist_ok=True)
            host.write_bytes(source.read_bytes())
            host.chmod(source.stat().st_mode & 0o777)
        tree = staged / "tree"
        if tree.exists():
            await sandbox.upload(tree, state)
        for host, target in loose:
            await sandbox.upload(host, target)


def _staged_path(staged: Path, state: str, path: str, index: int, loose: list[tuple[Path, str]]) -> Path:
    relative = posixpath.relpath(path, state)
    if not relative.startswith(".."):
        return staged / "tree" / relative
    host = staged / "loose" / str(index) / posixpath.basename(path)
    loose.append((host, path))
    return host


async def install(sandbox: Any, commands: tuple[str, ...], *, timeout_s: float) -> None:
    """Run each install command with `sh -c` in the working directory; a failure is a setup failure."""
    for command in commands:
        # No cwd: the sandbox's own working directory (what `pwd` reported; a provider may report a host path
        # there that it would not take back as a cwd).
        result = await sandbox.exec(["sh", "-c", command], timeout_s=timeout_s)
        if result.timed_out:
            raise HarnessSetupError(
                f"install command {install_command_label(command)} timed out after {timeout_s:g}s in the task sandbox"
            )
        if result.exit_code != 0:
            text = tail((result.stdout or "") + (result.stderr or ""))
            raise HarnessSetupError(
                f"install command {install_command_label(command)} exited with {result.exit_code}: {text}"
            )


async def check_dir(sandbox: Any, path: str, what: str) -> None:
    result = await _run(sandbox, ["test", "-d", path])
    if result.exit_code != 0:
        raise HarnessSetupError(f"{what} {path} does not exist in the task sandbox")


async def kill_marked(sandbox: Any, marker: str, grace_s: float) -> str | None:
    """TERM, grace, KILL every process in the sandbox carrying the marker (cwd `/`); the script's complaint, if any."""
    result = await sandbox.exec(
        ["sh", "-c", SANDBOX_KILL_SCRIPT, "platoon-kill", marker, str(max(1, round(grace_s * 10)))],
        cwd="/",
        timeout_s=grace_s + _SHORT_S,
    )
    if result.exit_code != 0:
        return tail(result.stderr or result.stdout or f"exit {result.exit_code}", 300)
    return None


@dataclass
class Ran:
    exit_code: int | None
    timed_out: bool
    final_message: str | None
    output_tail: str


async def launch(
    spec: HarnessSpec,
    sandbox: Any,
    launch_plan: Plan,
    *,
    log_path: Path,
    marker: str,
    timeout: float | None,
    grace_s: float,
) -> Ran:
    """Run the agent in the sandbox up to `timeout`, end its processes by marker (always), collect its output into
    the log and read its final message."""
    env = {
        **launch_plan.env,
        "NO_PROXY": with_loopback(None),
        "no_proxy": with_loopback(None),
        MARKER_VAR: marker,
    }
    backstop = None if timeout is None else timeout + 2 * grace_s + 60
    running = asyncio.ensure_future(sandbox.exec(launch_plan.argv, env=env, timeout_s=backstop))
    timed_out = False
    try:
        done, _ = await asyncio.wait({running}, timeout=timeout)
        timed_out = not done
    finally:
        # The marker kill runs on every way out: at the deadline, on cancellation (however often it comes), and
        # after a normal exit for what the agent left running in the background.
        await uncancellable(_finish(sandbox, running, marker, grace_s))
    result = running.result() if not running.cancelled() and running.exception() is None else None
    if result is None:
        error = None if running.cancelled() else running.exception()
        if error is not None and not timed_out:
            raise error
        exit_code, output = None, ""
    else:
        exit_code = None if result.timed_out else result.exit_code
        timed_out = timed_out or bool(result.timed_out)
        output = (
            (result.stdout or "") + ("\n" if result.stdout and result.stderr else "") + (result.stderr or "")
        )
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "a", encoding="utf-8") as log:
        log.write(output)
    final = None
    if spec.final_message is not None:
        if spec.final_message.stdout_regex is not None:
            final = final_from_output(output, spec.final_message.stdout_regex)
        elif launch_plan.final_file is not None:
            final = final_from_file(
                await _download(sandbox, launch_plan.final_file), spec.final_message.json_key
            )
    return Ran(exit_code, timed_out, final, tail(output))


async def _finish(sandbox: Any, running: asyncio.Future[Any], marker: str, grace_s: float) -> None:
    complaint = await kill_marked(sandbox, marker, grace_s)
    if not running.done():
        # The command is dead; its exec returns once the provider notices. Bounded, in case it never does.
        await asyncio.wait({running}, timeout=grace_s + 30)
        if not running.done():
            running.cancel()
            await asyncio.wait({running})
    if complaint is not None:
        raise HarnessSetupError(
            f"the harness's processes could not all be ended in the task sandbox: {complaint}"
        )


async def _download(sandbox: Any, path: str) -> bytes | None:
    with tempfile.TemporaryDirectory(prefix="platoon-final-") as scratch:
        target = Path(scratch) / "final"
        try:
            await sandbox.download(path, target)
        except (FileNotFoundError, OSError):
            return None
        except Exception:  # a provider error reading an absent file: no final message
            return None
        if target.is_dir():
            return None
        try:
            return target.read_bytes()
        except OSError:
            return None
