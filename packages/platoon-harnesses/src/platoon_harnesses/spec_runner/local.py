"""Local placement: the agent runs on the host, in a private state dir, with an allowlisted environment, in a
process group of its own; at its end (exit, deadline or cancellation) the group and anything carrying its marker
get TERM, then KILL after the grace, and the state dir is deleted.
"""

from __future__ import annotations

import asyncio
import functools
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from platoon.harness.spec import HarnessSetupError
from platoon.host_env import allowed_host_env
from platoon_harnesses.spec_runner import host_process
from platoon_harnesses.spec_runner.kill import end_local, uncancellable
from platoon_harnesses.spec_runner.launch import (
    LOCAL_ENV_EXTRA,
    MARKER_VAR,
    Plan,
    final_from_file,
    final_from_output,
    install_command_label,
    node_scratch,
    tail,
    with_loopback,
)

if TYPE_CHECKING:
    from platoon.harness.spec import HarnessSpec


def state_root() -> Path:
    return node_scratch() / f"platoon-harness-{os.getuid()}"


def make_state_dir(slug: str) -> Path:
    """`<node scratch>/platoon-harness-<uid>/<slug>` (0700) with its `work/` subdir, fresh."""
    root = state_root()
    root.mkdir(mode=0o700, parents=True, exist_ok=True)
    state = root / slug
    if state.exists():
        shutil.rmtree(state, ignore_errors=True)
    state.mkdir(mode=0o700)
    (state / "work").mkdir()
    return state


def base_env() -> dict[str, str]:
    """The host variables a local agent keeps, with loopback in NO_PROXY."""
    env = allowed_host_env(extra=LOCAL_ENV_EXTRA)
    env["NO_PROXY"] = env["no_proxy"] = with_loopback(
        os.environ.get("NO_PROXY") or os.environ.get("no_proxy")
    )
    return env


def write_files(launch: Plan) -> None:
    for path, content in launch.files.items():
        target = Path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(content, encoding="utf-8")
    for path, source in launch.assets.items():
        target = Path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source, target)


async def install(commands: tuple[str, ...], *, cwd: Path, env: dict[str, str], timeout_s: float) -> None:
    """Run each install command with `sh -c`; a failure or a timeout is a setup failure with the output's tail."""
    for command in commands:
        process = await asyncio.create_subprocess_exec(
            "sh",
            "-c",
            command,
            cwd=cwd,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            output, _ = await asyncio.wait_for(process.communicate(), timeout_s)
        except TimeoutError:
            await uncancellable(end_local(process, "-", 1.0))
            raise HarnessSetupError(
                f"install command {install_command_label(command)} timed out after {timeout_s:g}s"
            ) from None
        except BaseException:
            await uncancellable(end_local(process, "-", 1.0))
            raise
        if process.returncode != 0:
            text = tail(output.decode("utf-8", errors="replace"))
            raise HarnessSetupError(
                f"install command {install_command_label(command)} exited with {process.returncode}: {text}"
            )


@dataclass
class Ran:
    exit_code: int | None
    timed_out: bool
    final_message: str | None
    output_tail: str


async def launch(
    spec: HarnessSpec,
    launch_plan: Plan,
    *,
    state: Path,
    log_path: Path,
    marker: str,
    timeout: float | None,
    grace_s: float,
) -> Ran:
    """Start the agent, wait for it up to `timeout`, end its processes (always), read its final message."""
    env = {**base_env(), **launch_plan.env, MARKER_VAR: marker}
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as log:
        offset = log.tell()
        try:
            # Off the loop: on a loaded machine a start waits tens of ms for the child to reach exec.
            process = await host_process.start(
                list(launch_plan.argv),
                on_cancel=functools.partial(end_local, marker=marker, grace_s=grace_s),
                cwd=state / "work",
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        except OSError as exc:
            raise HarnessSetupError(f"cannot launch {launch_plan.argv[0]!r}: {exc}") from exc
        timed_out = False
        try:
            try:
                await asyncio.wait_for(process.wait(), timeout)
            except TimeoutError:
                timed_out = True
        finally:
            # On exit too: children the agent left behind in its group (or that carry its marker) go with it.
            await uncancellable(end_local(process, marker, grace_s))
    exit_code = process.returncode if process.returncode is not None and process.returncode >= 0 else None
    output = _read_from(log_path, offset)
    final = None
    if spec.final_message is not None:
        if spec.final_message.stdout_regex is not None:
            final = final_from_output(output, spec.final_message.stdout_regex)
        elif launch_plan.final_file is not None:
            final = final_from_file(_read_bytes(Path(launch_plan.final_file)), spec.final_message.json_key)
    return Ran(exit_code, timed_out, final, tail(output))


def _read_from(path: Path, offset: int) -> str:
    with open(path, "rb") as handle:
        handle.seek(offset)
        return handle.read().decode("utf-8", errors="replace")


def _read_bytes(path: Path) -> bytes | None:
    try:
        return path.read_bytes()
    except OSError:
        return None


def remove_state(state: Any) -> None:
    shutil.rmtree(state, ignore_errors=True)
