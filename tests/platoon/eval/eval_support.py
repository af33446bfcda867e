"""Helpers of the `platoon eval` / `platoon rollout` tests: configs, the scripted policies, the hosted server's state."""

from __future__ import annotations

import json
import re
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from platoon.testing.number_search import react_binary_search

HOSTED_KEY = "sk-hosted-secret-0123456789abcdef"
HOSTED_KEY_ENV = "EVAL_TEST_HOSTED_KEY"


#: the tests' scripted policy: a binary search over what the (Qwen3-rendered) prompt shows
binary_search = react_binary_search


def number_search_eval(**inference: Any) -> dict[str, Any]:
    """An evaluation config: number search's val split cut to 2 tasks, platoon-react, the toy model."""
    settings: dict[str, Any] = {
        "model_name": "platoon/toy",
        "renderer_name": "qwen3_instruct",
        "workflow": {
            "num_rollouts_per_task": 2,
            "num_concurrent_workers": 4,
            "rollout_config": {"verbose": False, "max_steps": 12},
        },
    }
    settings.update(inference)
    return {
        "inference": settings,
        "environments": [
            {
                "env": "platoon-number-search",
                "harness": "platoon-react",
                "eval_dataset_kwargs": {"split_name": "val", "limit": 2},
            }
        ],
    }


# ---------------------------------------------------------------------------------------------------------------
# A scripted OpenAI-compatible server


def _chat_guess(messages: list[dict[str, Any]]) -> int:
    """Binary search over an OpenAI conversation: the range from the first user turn, feedback from tool turns."""
    text = next(m["content"] for m in messages if m.get("role") == "user")
    match = re.search(r"between (\d+) and (\d+)", str(text))
    assert match is not None, text
    low, high = int(match.group(1)), int(match.group(2))
    guesses = [
        int(json.loads(call["function"]["arguments"])["number"])
        for m in messages
        if m.get("role") == "assistant"
        for call in m.get("tool_calls") or ()
    ]
    feedback = [str(m.get("content")) for m in messages if m.get("role") == "tool"]
    for guess, reply in zip(guesses, feedback, strict=False):
        if "Too low" in reply:
            low = guess + 1
        elif "Too high" in reply:
            high = guess - 1
    return (low + high) // 2


@dataclass
class HostedServer:
    """The scripted server's state: its base URL, the requests it saw, and what it answers next."""

    base_url: str = ""
    seen: list[dict[str, Any]] = field(default_factory=list)
    #: statuses answered to the next non-probe calls, in order (then the binary search resumes)
    fail_with: list[int] = field(default_factory=list)
    #: answer the probe with this status instead of OK
    probe_status: int = 200
    model: str = "served-model-2025"
    lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def calls(self) -> list[dict[str, Any]]:
        """The non-probe chat requests."""
        return [s for s in self.seen if not s["probe"]]


def completion(server: HostedServer, body: dict[str, Any], *, probe: bool) -> dict[str, Any]:
    messages = body.get("messages") or []
    usage = {"prompt_tokens": 100, "completion_tokens": 10, "prompt_tokens_details": {"cached_tokens": 40}}
    if probe:
        message: dict[str, Any] = {"role": "assistant", "content": "OK"}
        finish = "stop"
    else:
        number = _chat_guess(messages)
        call = {
            "id": f"call_{len(server.seen)}",
            "type": "function",
            "function": {"name": "guess", "arguments": json.dumps({"number": number})},
        }
        message = {"role": "assistant", "content": None, "tool_calls": [call]}
        finish = "tool_calls"
    return {
        "id": f"chatcmpl-{len(server.seen)}",
        "object": "chat.completion",
        "model": server.model,
        "choices": [{"index": 0, "message": message, "finish_reason": finish}],
        "usage": usage,
    }


def files_containing(root: Path, text: str) -> list[Path]:
    """Every file under `root` whose bytes contain `text`."""
    needle = text.encode()
    return [p for p in root.rglob("*") if p.is_file() and needle in p.read_bytes()]


def only_dir(parent: Path) -> Path:
    children = [p for p in parent.iterdir() if p.is_dir()]
    assert len(children) == 1, children
    return children[0]
