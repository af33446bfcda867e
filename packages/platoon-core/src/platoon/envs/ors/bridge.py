"""The ORS bridge's event log and its read-only bridge tools, shared by in-process and remote leases.

`log_dir`: every session of a rollout appends to `<log_dir>/<rollout slug>/bridge_events.jsonl` (a `fresh` fork
opens a new session in the same file) records `{"type", "time", "session", "turn", "payload"}`, the types the
trajectory viewer reads (`platoon.viz.model.BRIDGE_TYPES`); `bridge_state.json` beside it holds the turn, finished
flag and last reward, rewritten atomically after each change. `bridge_tools: true` adds `get_task` and `get_status`,
answered from platoon's own state without touching the environment.
"""

from __future__ import annotations

import json
import logging
import os
import re
import threading
import time
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from platoon.envs.service import ToolResult, ToolSpec

__all__ = [
    "BRIDGE_TOOLS",
    "BridgeLog",
    "bridge_tool_specs",
    "completion_policy",
    "open_bridge_log",
    "rollout_slug",
    "session_id",
]

log = logging.getLogger(__name__)

EVENTS_FILE = "bridge_events.jsonl"
STATE_FILE = "bridge_state.json"
BRIDGE_TOOLS = ("get_task", "get_status")
_SLUG_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")
_SLUG_LIMIT = 120
#: a tool result's text in the log is cut here: the log is for following an episode, not for replaying outputs
_TEXT_LIMIT = 4000


def rollout_slug(rollout_id: str) -> str:
    """The rollout's directory name: unsafe characters as `_`, at most 120 characters."""
    return _SLUG_UNSAFE.sub("_", rollout_id)[:_SLUG_LIMIT].strip(".") or "rollout"


def session_id() -> str:
    """An id for an in-process session (remote sessions use the server's session id)."""
    return uuid.uuid4().hex[:16]


class BridgeLog:
    """One rollout's event log and state file, shared by its sessions (refcounted; the last release closes it)."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        directory.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._file = (directory / EVENTS_FILE).open("a", encoding="utf-8")
        self._refs = 0
        #: each session's state, in opening order: the first is the rollout's own session, the others its forks
        self._states: dict[str, dict[str, Any]] = {}

    def event(self, kind: str, session: str, turn: int, payload: Mapping[str, Any]) -> None:
        record = {
            "type": kind,
            "time": time.time(),
            "session": session,
            "turn": turn,
            "payload": dict(payload),
        }
        line = json.dumps(record, default=repr)
        with self._lock:
            if not self._file.closed:
                self._file.write(line + "\n")
                self._file.flush()

    def state(self, session: str, state: Mapping[str, Any]) -> None:
        """Record `session`'s state and rewrite `bridge_state.json` (write to a hidden temp file, then rename)."""
        with self._lock:
            self._states[session] = dict(state)
            main_session, main = next(iter(self._states.items()))
            body = {**main, "session": main_session, "updated": time.time(), "sessions": self._states}
            target = self.directory / STATE_FILE
            temp = self.directory / f".{STATE_FILE}.{os.getpid()}.{threading.get_ident()}.tmp"
            try:
                temp.write_text(json.dumps(body, default=repr, indent=1) + "\n", encoding="utf-8")
                os.replace(temp, target)
            except OSError as exc:  # a full disk must not fail the episode: the log is an aid
                log.warning("could not write %s: %s", target, exc)

    def acquire(self) -> BridgeLog:
        with self._lock:
            self._refs += 1
        return self

    def release(self) -> None:
        # The registry's lock first, as in `open_bridge_log`: no session may acquire a log being closed.
        with _LOGS_LOCK:
            with self._lock:
                self._refs -= 1
                if self._refs > 0:
                    return
                self._file.close()
            if _LOGS.get(self.directory) is self:
                del _LOGS[self.directory]


_LOGS: dict[Path, BridgeLog] = {}
_LOGS_LOCK = threading.Lock()


def open_bridge_log(log_dir: Path, rollout_id: str) -> BridgeLog:
    """The rollout's log (the one its other open sessions write, or a new one), acquired for one session."""
    directory = log_dir / rollout_slug(rollout_id)
    with _LOGS_LOCK:
        found = _LOGS.get(directory)
        if found is None:
            found = _LOGS[directory] = BridgeLog(directory)
        return found.acquire()


# -- the bridge tools ---------------------------------------------------------------------------------------------

_NO_ARGS = {"type": "object", "properties": {}, "additionalProperties": False}
_BRIDGE_META = {"platoon.dev/read-only": True, "platoon.dev/bridge-tool": True}


def bridge_tool_specs(taken: Sequence[str]) -> list[ToolSpec]:
    """The bridge tools whose names the environment does not use itself (its own tool of that name wins)."""
    specs = [
        ToolSpec(
            "get_task",
            "Read the task again: its prompt, the tools in OpenAI format, and how the episode is completed.",
            _NO_ARGS,
            read_only=True,
            meta=dict(_BRIDGE_META),
        ),
        ToolSpec(
            "get_status",
            "Read the episode's status: the turn, whether it finished, the last reward, tool calls left.",
            _NO_ARGS,
            read_only=True,
            meta=dict(_BRIDGE_META),
        ),
    ]
    return [spec for spec in specs if spec.name not in taken]


def completion_policy(tools: Sequence[ToolSpec]) -> dict[str, Any]:
    """How an episode ends: `submit_answer` when the environment declares terminal tools (call one with the
    answer), else `claim_done` (a tool result that says finished ends it; then stop calling tools)."""
    terminal = [t.name for t in tools if t.terminal]
    if terminal:
        return {
            "mode": "submit_answer",
            "terminal_tools": terminal,
            "text": f"Submit your final answer by calling {' or '.join(terminal)}; its result ends the episode "
            "and is graded. Later tool calls are refused.",
        }
    return {
        "mode": "claim_done",
        "terminal_tools": [],
        "text": "No tool is declared to end the episode: it ends when a tool result says finished (get_status "
        "shows it). Then stop calling tools and claim you are done.",
    }


def answer(payload: Mapping[str, Any]) -> ToolResult:
    result = ToolResult.text(json.dumps(payload, default=repr))
    result.metadata = {"platoon.dev/bridge-tool": True}
    return result


def result_payload(name: str, result: ToolResult) -> dict[str, Any]:
    """What the log keeps of a result: the tool, the flags, the reward, the text (cut), the metadata."""
    text = result.as_text()
    payload: dict[str, Any] = {
        "name": name,
        "finished": result.finished,
        "reward": result.reward,
        "is_error": result.is_error,
        "text": text[:_TEXT_LIMIT] + (" …" if len(text) > _TEXT_LIMIT else ""),
        "metadata": dict(result.metadata or {}),
    }
    if result.is_error and isinstance(result.metadata, Mapping) and "error" in result.metadata:
        payload["code"] = result.metadata["error"]
    return payload


def bridge_options(log_dir: Any, bridge_tools: Any, where: str) -> tuple[Path | None, bool]:
    """Check `log_dir` and `bridge_tools`; a relative `log_dir` is made absolute against the working directory
    now (one a config file writes was already made relative to that file's directory: it is a path option)."""
    if not isinstance(bridge_tools, bool):
        raise ValueError(f"{where}: bridge_tools must be true or false; got {bridge_tools!r}")
    if log_dir is None:
        return None, bridge_tools
    if not isinstance(log_dir, str | os.PathLike) or not str(log_dir):
        raise ValueError(f"{where}: log_dir must be a directory path; got {log_dir!r}")
    path = Path(log_dir).expanduser()
    if path.exists() and not path.is_dir():
        raise ValueError(f"{where}: log_dir {str(path)!r} is not a directory")
    return path.absolute(), bridge_tools
