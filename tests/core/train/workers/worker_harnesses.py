"""Harnesses the worker tests run inside real worker processes (imported there as `worker_harnesses:<name>`).

Each takes its working directory from the harness option `dir`, where it leaves markers the test reads.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

from platoon.harness.agent import AgentResult
from platoon.harness.function import harness


def _dir(ctx: Any) -> Path:
    return Path(ctx.options["dir"])


def _spawn_sleepers(where: Path) -> None:
    """One `sleep` in the worker's own process group and one in a session of its own; their pids to `pids`."""
    same_group = subprocess.Popen(["sleep", "600"])
    own_session = subprocess.Popen(["sleep", "600"], start_new_session=True)
    (where / "pids").write_text(f"{same_group.pid} {own_session.pid}\n")


@harness("test-workers-chat")
async def chat(ctx: Any) -> AgentResult:
    """One model call of a few tokens."""
    reply = await ctx.chat([{"role": "user", "content": ctx.instruction}], max_tokens=3)
    return AgentResult(final_message=reply.text)


@harness("test-workers-follow")
async def follow(ctx: Any) -> AgentResult:
    """A call, then `first` written; wait for `go`; a second call."""
    where = _dir(ctx)
    await ctx.chat([{"role": "user", "content": "one"}], max_tokens=2)
    (where / "first").write_text("done")
    while not (where / "go").exists():
        await asyncio.sleep(0.02)
    reply = await ctx.chat([{"role": "user", "content": "two"}], max_tokens=2)
    return AgentResult(final_message=reply.text)


@harness("test-workers-hang")
async def hang(ctx: Any) -> AgentResult:
    """Start two sleepers, then block the event loop: only the worker's alarm can end this."""
    _spawn_sleepers(_dir(ctx))
    time.sleep(3600)
    return AgentResult()


@harness("test-workers-wait")
async def wait(ctx: Any) -> AgentResult:
    """Start two sleepers, then wait (cancellably) for an hour."""
    _spawn_sleepers(_dir(ctx))
    await asyncio.sleep(3600)
    return AgentResult()


@harness("test-workers-crash")
async def crash(ctx: Any) -> AgentResult:
    """The worker process dies at once, as on a segfault."""
    os.kill(os.getpid(), signal.SIGSEGV)
    return AgentResult()


@harness("test-workers-hog")
async def hog(ctx: Any) -> AgentResult:
    """Hold `mebibytes` of touched memory and wait."""
    held = b"x" * (int(ctx.options["mebibytes"]) << 20)
    await asyncio.sleep(60)
    return AgentResult(final_message=str(len(held)))


@harness("test-workers-fork-holding")
async def fork_holding(ctx: Any) -> AgentResult:
    """Touch `mebibytes`, then fork a child that holds them copy-on-write for `seconds` without exec."""
    held = b"x" * (int(ctx.options["mebibytes"]) << 20)
    child = os.fork()
    if child == 0:
        time.sleep(float(ctx.options["seconds"]))
        os._exit(0)
    while os.waitpid(child, os.WNOHANG) == (0, 0):
        await asyncio.sleep(0.05)
    return AgentResult(final_message=str(len(held)))


@harness("test-workers-killed-after-response")
async def killed_after_response(ctx: Any) -> AgentResult:
    """Finish normally, but SIGKILL the worker once its response file exists.

    A child in its own session that ignores SIGTERM holds the worker's teardown for its 0.5 s grace, the window in
    which the watcher thread sees the response and kills the worker.
    """
    subprocess.Popen(
        [
            "python3",
            "-c",
            "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)",
        ],
        start_new_session=True,
    )
    response = Path(os.environ["PLATOON_ROLLOUT_WORKER_DIAG"].removesuffix(".diag"))

    def watch() -> None:
        while not response.exists():
            time.sleep(0.001)
        os.kill(os.getpid(), signal.SIGKILL)

    threading.Thread(target=watch, daemon=True).start()
    await ctx.chat([{"role": "user", "content": "hi"}], max_tokens=2)
    return AgentResult(final_message="finished")


@harness("test-workers-inspect")
async def inspect(ctx: Any) -> AgentResult:
    """Write what the worker process looks like from inside to `facts-<n>.json` (`n` from the option)."""
    facts = {
        "env": dict(os.environ),
        "pid": os.getpid(),
        "sid": os.getsid(0),
        "pgid": os.getpgrp(),
        "cwd": os.getcwd(),
        "stdin": os.readlink("/proc/self/fd/0"),
        "stdout": os.readlink("/proc/self/fd/1"),
        "random": random.random(),
    }
    (_dir(ctx) / f"facts-{ctx.options['n']}.json").write_text(json.dumps(facts))
    await ctx.chat([{"role": "user", "content": "hi"}], max_tokens=2)
    return AgentResult()


class StubSampler:
    """A picklable stand-in for a sampling client, for workers whose harness never samples."""

    async def sample_async(self, **kwargs: Any) -> Any:
        raise RuntimeError("the stub sampler does not sample")


@harness("test-workers-stop")
async def stop(ctx: Any) -> AgentResult:
    """Stop the whole worker process (SIGSTOP): no alarm or monitor can run, only the trainer's deadline ends it."""
    os.kill(os.getpid(), signal.SIGSTOP)
    return AgentResult()
