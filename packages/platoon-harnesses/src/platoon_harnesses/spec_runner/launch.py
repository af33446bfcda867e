"""What both placements share: the values a launch renders, the argv/env/files it becomes, the final message and
the mapping of an exit status to an `AgentResult`.

Rendering is core's one-pass `render`: argv stays a list and no value is ever read as shell or as a placeholder.
"""

from __future__ import annotations

import json
import logging
import os
import posixpath
import re
import secrets
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from platoon.harness.agent import AgentResult, AgentStatus
from platoon.harness.spec import HarnessSpec, SpecError, option_values, render

#: the environment marker every process of a sandboxed launch carries (the kill finds them by it)
MARKER_VAR = "PLATOON_HARNESS_AGENT"
#: how long TERM gets before KILL
DEFAULT_GRACE_S = 5.0
LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")
#: what a local launch keeps of the host's environment besides the allowlist every agent command gets
#: (`platoon.host_env`): it runs on the host, so its temp dir and its proxies are the host's too
LOCAL_ENV_EXTRA = ("TMPDIR", "HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy")
_TAIL_CHARS = 2000
log = logging.getLogger("platoon.harness")
#: specs already warned about running their built-in tools on the host (once per process, not per episode)
_WARNED_BUILTINS: set[str] = set()


def node_scratch() -> Path:
    """`$PLATOON_NODE_SCRATCH`, `$PBS_LOCALDIR`, `$SLURM_TMPDIR`, `$TMPDIR`, else `/tmp`."""
    for name in ("PLATOON_NODE_SCRATCH", "PBS_LOCALDIR", "SLURM_TMPDIR", "TMPDIR"):
        value = os.environ.get(name)
        if value:
            return Path(value)
    return Path("/tmp")


def agent_slug(spec: HarnessSpec, agent_id: str) -> str:
    """A file-name-safe name for one agent's launch: the spec's name and the start of the agent id."""
    return f"{spec.name}-{agent_id.replace('-', '')[:12]}"


def new_marker(slug: str) -> str:
    """`<agent slug>.<12 hex>`: unique per launch, so a kill never reaches another launch's processes."""
    return f"{slug}.{secrets.token_hex(6)}"


def with_loopback(no_proxy: str | None) -> str:
    """`NO_PROXY` with the loopback hosts appended (the agent must reach the gateway past any proxy)."""
    present = [part.strip() for part in (no_proxy or "").split(",") if part.strip()]
    return ",".join(present + [host for host in LOOPBACK_HOSTS if host not in present])


def effective_timeout(spec: HarnessSpec, timeout: float | None) -> float | None:
    """min(spec `timeout_s`, the run's timeout); None when neither is set."""
    limits = [t for t in (spec.timeout_s, timeout) if t is not None]
    return min(limits) if limits else None


def builtins_disabled(spec: HarnessSpec, mode: str, placement: str) -> bool:
    """Whether the built-in tools are switched off: `keep`, `disable` (a spec error without a knob), or `default`
    (kept in a task sandbox; disabled locally when the spec has a knob, else kept with a warning)."""
    can = spec.builtins is not None and spec.builtins.can_disable
    if mode == "keep":
        return False
    if mode == "disable":
        if not can:
            raise SpecError(
                f"builtins: disable: harness {spec.ref} ({spec.path}) has no [builtins.disable] knob to switch its "
                "built-in tools off; use builtins: keep"
            )
        return True
    if placement == "task_sandbox":
        return False
    if not can and spec.builtins is not None and spec.builtins.tools and spec.ref not in _WARNED_BUILTINS:
        _WARNED_BUILTINS.add(spec.ref)
        log.warning(
            "harness %s runs locally with its built-in tools (%s) on the host: the spec has no knob to disable them",
            spec.ref,
            ", ".join(spec.builtins.tools),
        )
    return can


@dataclass
class Plan:
    """One rendered launch: argv, the rendered environment, the files to write (absolute path -> content) and the
    assets to copy (absolute path -> shipped file), and where the final message file is."""

    argv: list[str]
    env: dict[str, str]
    files: dict[str, str] = field(default_factory=dict)
    assets: dict[str, Path] = field(default_factory=dict)
    final_file: str | None = None


def launch_values(
    spec: HarnessSpec,
    *,
    options: Mapping[str, Any],
    instruction: str,
    base_url: str,
    api_key: str,
    model: str,
    workdir: str,
    state_dir: str,
    max_steps: int | None,
    toolchain: str | None,
) -> dict[str, Any]:
    """Every placeholder's value for one launch; `{mcp_url}` is `<gateway origin>/mcp`. A missing `{max_steps}`
    stays None, so only a spec that renders it fails (a spec error)."""
    values: dict[str, Any] = {
        "instruction": instruction,
        "base_url": base_url.rstrip("/"),
        "api_key": api_key,
        "model": model,
        "workdir": workdir,
        "state_dir": state_dir,
        "max_steps": max_steps,
        "toolchain": toolchain or "",
        "mcp_url": base_url.rstrip("/") + "/mcp",
        **option_values(spec, options),
    }
    if spec.mcp is not None and spec.mcp.config_template is not None:
        values["mcp_config_path"] = _under(state_dir, render(spec.mcp.config_file, values))
    return values


def _under(state_dir: str, path: str) -> str:
    """A rendered path: relative ones are under the agent's state dir."""
    return path if posixpath.isabs(path) else posixpath.join(state_dir, path)


def plan(spec: HarnessSpec, values: Mapping[str, Any], *, mcp: bool, disable_builtins: bool) -> Plan:
    """The launch as `spec` describes it, rendered with `values`: argv, then the built-ins knob, then the MCP args."""
    state_dir = str(values["state_dir"])
    argv = [render(arg, values) for arg in spec.launch.argv]
    env = {name: render(value, values) for name, value in spec.launch.env.items()}
    if disable_builtins and spec.builtins is not None:
        argv += [render(arg, values) for arg in spec.builtins.disable_args or ()]
        env.update({k: render(v, values) for k, v in (spec.builtins.disable_env or {}).items()})
    launch = Plan(argv=argv, env=env)
    if mcp and spec.mcp is not None:
        argv += [render(arg, values) for arg in spec.mcp.args]
        env.update({k: render(v, values) for k, v in spec.mcp.env.items()})
        if spec.mcp.config_template is not None:
            launch.files[str(values["mcp_config_path"])] = render(spec.mcp.config_template, values)
    for target, content in spec.launch.files.items():
        launch.files[_under(state_dir, render(target, values))] = render(content, values)
    for target, source in spec.launch.assets.items():
        launch.assets[_under(state_dir, render(target, values))] = source
    if spec.final_message is not None and spec.final_message.file is not None:
        launch.final_file = _under(state_dir, render(spec.final_message.file, values))
    return launch


def install_commands(spec: HarnessSpec, values: Mapping[str, Any]) -> tuple[str, ...]:
    """The install commands rendered with the public values only: never options (one toolchain serves every
    option setting) and never the key."""
    public = {
        k: v for k, v in values.items() if k != "api_key" and k != "options" and not k.startswith("options.")
    }
    return tuple(render(command, public) for command in (spec.install.commands if spec.install else ()))


def final_from_output(text: str, regex: str) -> str | None:
    """The last match of `regex` in the captured output: its group 1 if the regex has groups, else the match."""
    matches = list(re.finditer(regex, text))
    if not matches:
        return None
    last = matches[-1]
    return last.group(1) if last.re.groups else last.group(0)


def final_from_file(content: bytes | None, json_key: str | None) -> str | None:
    """The final message file's text, or the value at a dotted JSON key (None if missing or unparsable); strings
    come back raw, other values JSON-encoded."""
    if content is None:
        return None
    text = content.decode("utf-8", errors="replace")
    if json_key is None:
        return text
    try:
        value: Any = json.loads(text)
    except ValueError:
        return None
    for part in json_key.split("."):
        if isinstance(value, dict) and part in value:
            value = value[part]
        elif isinstance(value, list) and part.isdigit() and int(part) < len(value):
            value = value[int(part)]
        else:
            return None
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def install_command_label(command: str, limit: int = 60) -> str:
    """An install command as a failure names it: its first line, cut short. The reason a rollout records is bounded,
    and a whole install script before the exit code and output would push them out of it."""
    first = command.strip().splitlines()[0] if command.strip() else ""
    more = len(first) > limit or "\n" in command.strip()
    return repr(first[:limit] + (" ..." if more else ""))


def tail(text: str, limit: int = _TAIL_CHARS) -> str:
    text = text.strip()
    return text if len(text) <= limit else "..." + text[-limit:]


def result_of(
    spec: HarnessSpec,
    *,
    exit_code: int | None,
    timed_out: bool,
    timeout: float | None,
    final_message: str | None,
    output_tail: str,
) -> AgentResult:
    """The agent's result: killed at its deadline -> `timeout`; else `[exit_codes]` (exit 0 `completed` unless
    remapped; any other unmapped code, or none, `error`)."""
    if timed_out:
        return AgentResult(
            AgentStatus.TIMEOUT,
            final_message=final_message,
            error=f"Agent timed out after {timeout:g}s: harness {spec.ref} was killed at its deadline",
        )
    if spec.exit_meaning(exit_code) == "completed":
        return AgentResult(AgentStatus.COMPLETED, final_message=final_message)
    how = f"exited with code {exit_code}" if exit_code is not None else "was killed (no exit code)"
    detail = f": {output_tail}" if output_tail else ""
    return AgentResult(
        AgentStatus.ERROR, final_message=final_message, error=f"harness {spec.ref} {how}{detail}"
    )
