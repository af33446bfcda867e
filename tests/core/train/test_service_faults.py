"""`platoon train` when its training service goes away or the user interrupts it, with real processes: the local
server child killed with SIGKILL, a "hosted" server (a separate `platoon tinker serve`-style process) killed, Ctrl-C
typed into a real pseudo-terminal, SIGTERM before the local server is up.

Each run is a `platoon train` subprocess on the bandit example cut down to seconds a step; its stderr is read line
by line so the faults land at a known point (after step 1 was logged). Timeouts are hang guards only.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from platoon.train.tinker.watchdog import ServiceMonitor

REPO = Path(__file__).resolve().parents[3]
EXAMPLE = REPO / "examples" / "bandit" / "train.yaml"
PLATOON = [sys.executable, "-c", "import sys; from platoon.cli import main; sys.exit(main())"]
#: generous bound on a whole `platoon train` start on a busy two-core machine (a hang guard, not a margin)
HANG_GUARD = 420.0


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    """A user's environment: the local server's state under the test's site cache, the SDK's telemetry on."""
    profile = tmp_path / "site.yaml"
    profile.write_text(f"cache: {tmp_path / 'cache'}\n")
    env = dict(os.environ, PLATOON_SITE=str(profile), **extra)
    for name in ("TINKER_API_KEY", "TINKER_TELEMETRY", "TINKER_BASE_URL"):
        env.pop(name, None)
    env.update(extra)
    return env


def _argv(log_path: Path, *overrides: str) -> list[str]:
    return [
        "train",
        str(EXAMPLE),
        f"log_path={log_path}",
        "train.batch_size=2",
        "train.workflow_config.group_size=4",
        "checkpoint.every=1",
        *overrides,
    ]


def _rows(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


class _Output:
    """Everything a child writes to one stream, read on a thread; `wait_for` blocks until a text shows up."""

    def __init__(self, read: Callable[[], bytes]) -> None:
        self._read = read
        self._chunks: list[bytes] = []
        self._changed = threading.Condition()
        self._done = False
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        while True:
            try:
                chunk = self._read()
            except OSError:  # a pty's master reads EIO once every slave end is closed
                chunk = b""
            with self._changed:
                if not chunk:
                    self._done = True
                    self._changed.notify_all()
                    return
                self._chunks.append(chunk)
                self._changed.notify_all()

    @property
    def text(self) -> str:
        with self._changed:
            return b"".join(self._chunks).decode(errors="replace")

    def wait_for(self, needle: str, timeout: float = HANG_GUARD) -> None:
        deadline = time.monotonic() + timeout
        with self._changed:
            while needle not in b"".join(self._chunks).decode(errors="replace"):
                left = deadline - time.monotonic()
                if self._done or left <= 0:
                    raise AssertionError(f"never saw {needle!r}; the output was:\n{self.text}")
                self._changed.wait(min(left, 1.0))

    def wait_closed(self, timeout: float = 30.0) -> None:
        with self._changed:
            self._changed.wait_for(lambda: self._done, timeout)


def _start(argv: list[str], env: dict[str, str]) -> tuple[subprocess.Popen[bytes], _Output]:
    child = subprocess.Popen(
        PLATOON + argv, stdin=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env, cwd=REPO
    )
    assert child.stderr is not None
    stream = child.stderr
    return child, _Output(lambda: os.read(stream.fileno(), 65536))


def _finish(child: subprocess.Popen[bytes], output: _Output) -> int:
    try:
        code = child.wait(timeout=HANG_GUARD)
    except subprocess.TimeoutExpired:
        child.kill()
        child.wait()
        raise AssertionError(f"platoon train hung; its output so far:\n{output.text}") from None
    output.wait_closed()
    return code


def _children(pid: int) -> list[int]:
    found: list[int] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        found += [int(p) for p in (task / "children").read_text().split()]
    return found


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _local_server_child(trainer: int) -> int:
    servers = [pid for pid in _children(trainer) if "platoon.local_server.process" in _cmdline(pid)]
    assert len(servers) == 1, f"the trainer's children: {[_cmdline(pid) for pid in _children(trainer)]}"
    return servers[0]


def _processes_naming(text: str) -> list[str]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and text in (line := _cmdline(int(entry.name))):
            found.append(line)
    return found


def _platoon_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("platoon: ")]


@pytest.mark.slow
@pytest.mark.guarantee(
    "The local Tinker server dies (SIGKILL)",
    "bandit, embedded local server",
    "noticed at once: one line naming it, exit 1; the same command resumes from the kept checkpoint",
)
def test_a_killed_local_server_stops_the_run_at_once_with_one_line_and_the_run_resumes(tmp_path):
    logs = tmp_path / "logs"
    env = _env(tmp_path)
    child, output = _start(_argv(logs, "train.max_training_steps=8"), env)
    output.wait_for("platoon: step 1/8")
    server = _local_server_child(child.pid)
    os.kill(server, signal.SIGKILL)
    code = _finish(child, output)
    err = output.text
    assert code == 1, err
    assert "Traceback" not in err
    # the trainer's own child: noticed by its death, not after the 300 s service_unreachable_seconds of a probe
    died = [
        line for line in _platoon_lines(err) if "the local Tinker server died (killed by SIGKILL)" in line
    ]
    assert len(died) == 1, err
    assert "is not answering" not in err and "has not answered" not in err
    assert err.index("platoon: step 1/8") < err.index(died[0])
    assert "done: steps" not in err
    run = logs / "bandit" / "run"
    kept = _rows(run / "checkpoints.jsonl")
    assert kept and kept[-1]["batch"] >= 1  # step 1's checkpoint is kept
    assert 1 in [row["step"] for row in _rows(run / "metrics.jsonl")]
    assert not (run / "process.json").exists()

    # The same command starts again where the kept checkpoint left off and finishes.
    child, output = _start(_argv(logs, "train.max_training_steps=3"), env)
    code = _finish(child, output)
    assert code == 0, output.text
    assert f"resuming at step {kept[-1]['batch'] + 1}" in output.text
    rows = _rows(run / "checkpoints.jsonl")
    assert rows[: len(kept)] == kept
    assert (rows[-1]["name"], rows[-1]["batch"]) == ("final", 3)


#: the key of the service below: the same across its restarts, as a hosted service's is
SERVICE_KEY = "tml-service-faults-0123456789abcdef"


def _serve(state_dir: Path, env: dict[str, str]) -> tuple[subprocess.Popen[str], str]:
    """A Tinker-compatible service of its own (as a hosted one is): the local server in a separate process, taking
    `SERVICE_KEY` (given on its stdin)."""
    server = subprocess.Popen(
        [sys.executable, "-m", "platoon.local_server.process", "--dir", str(state_dir), "--key-from-stdin"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    assert server.stdin is not None and server.stdout is not None
    server.stdin.write(SERVICE_KEY + "\n")
    server.stdin.close()
    url = server.stdout.readline().strip()
    assert url.startswith("http://"), url
    return server, url


@pytest.mark.slow
@pytest.mark.guarantee(
    "The training service stops answering",
    "bandit, a service in a process of its own",
    "probed for `train.service_unreachable_seconds`, then one line, exit 1; resumes once the service is back",
)
def test_a_service_that_stops_answering_stops_the_run_after_the_configured_time_and_it_resumes(tmp_path):
    logs = tmp_path / "logs"
    env = _env(tmp_path, TINKER_API_KEY=SERVICE_KEY)
    server, url = _serve(tmp_path / "service", env)
    try:
        overrides = (f"tinker_base_url={url}", "train.service_unreachable_seconds=5")
        child, output = _start(_argv(logs, "train.max_training_steps=8", *overrides), env)
        output.wait_for("platoon: step 1/8")
        server.kill()
        code = _finish(child, output)
    finally:
        server.kill()
        server.wait()
    err = output.text
    assert code == 1, err
    assert "Traceback" not in err
    stopped = [line for line in _platoon_lines(err) if "has not answered for" in line]
    assert len(stopped) == 1, err
    assert url in stopped[0] and "train.service_unreachable_seconds 5" in stopped[0]
    assert err.index("platoon: step 1/8") < err.index(stopped[0])
    run = logs / "bandit" / "run"
    kept = _rows(run / "checkpoints.jsonl")
    assert kept and kept[-1]["batch"] >= 1

    # The service is back (on another port, with the same state): the run resumes from what it kept.
    server, url = _serve(tmp_path / "service", env)
    try:
        child, output = _start(_argv(logs, "train.max_training_steps=3", f"tinker_base_url={url}"), env)
        code = _finish(child, output)
    finally:
        server.kill()
        server.wait()
    assert code == 0, output.text
    assert f"resuming at step {kept[-1]['batch'] + 1}" in output.text
    assert _rows(run / "checkpoints.jsonl")[-1]["name"] == "final"


# Makes the pty its controlling terminal (the child is a session leader: start_new_session) with Ctrl-C's SIGINT at
# its default (a suite run in the background inherits it ignored), then becomes `platoon train`.
_AT_A_TERMINAL = (
    "import fcntl, os, signal, sys, termios;"
    "fcntl.ioctl(0, termios.TIOCSCTTY, 0);"
    "signal.signal(signal.SIGINT, signal.SIG_DFL);"
    "os.execv(sys.argv[1], sys.argv[1:])"
)


@pytest.mark.slow
@pytest.mark.guarantee(
    "Ctrl-C at a terminal",
    "bandit, training",
    "stops at the step boundary: `_interrupted` checkpoint, exit 130, no traceback",
)
def test_ctrl_c_at_a_terminal_stops_at_the_step_boundary_with_an_interrupted_checkpoint(tmp_path):
    logs = tmp_path / "logs"
    master, slave = os.openpty()
    try:
        child = subprocess.Popen(
            [sys.executable, "-c", _AT_A_TERMINAL, *PLATOON, *_argv(logs, "train.max_training_steps=30")],
            stdin=slave,
            stdout=slave,
            stderr=slave,
            start_new_session=True,
            env=_env(tmp_path),
            cwd=REPO,
        )
    finally:
        os.close(slave)
    try:
        output = _Output(lambda: os.read(master, 65536))
        output.wait_for("platoon: step 1/30")
        os.write(master, b"\x03")  # the terminal driver sends SIGINT to its foreground process group
        code = _finish(child, output)
    finally:
        os.close(master)
    text = output.text
    assert code == 130, text
    assert "Traceback" not in text
    assert "SIGINT: stopping at the next step boundary" in text
    stopped = [line for line in text.splitlines() if "as asked; resume with the same command" in line]
    assert len(stopped) == 1, text
    assert text.index("SIGINT: stopping") < text.index(stopped[0])
    last = _rows(logs / "bandit" / "run" / "checkpoints.jsonl")[-1]
    assert last["kind"] == "interrupted" and last["name"] == f"{last['batch']:06d}_interrupted"
    assert f"stopped at step {last['batch']} as asked" in stopped[0]


@pytest.mark.slow
@pytest.mark.guarantee(
    "SIGTERM before the first step",
    "bandit, training",
    "nothing trains; one line, exit 130",
)
def test_sigterm_before_the_local_server_is_up_trains_no_step(tmp_path):
    logs = tmp_path / "logs"
    child, output = _start(_argv(logs, "train.max_training_steps=3"), _env(tmp_path))
    output.wait_for("platoon: starting the local Tinker-compatible server")
    child.send_signal(signal.SIGTERM)
    code = _finish(child, output)
    err = output.text
    assert code == 130, err
    assert "Traceback" not in err
    assert "SIGTERM: stopping at the next step boundary" in err
    assert "stopped at step 0 as asked" in err
    assert "training platoon/toy for steps" not in err  # no step began
    run = logs / "bandit" / "run"
    assert _rows(run / "metrics.jsonl") == []
    assert _rows(run / "checkpoints.jsonl") == []
    assert (run / "config.resolved.yaml").is_file()  # what the start wrote before the signal stays
    # the server it was starting is stopped, not left behind
    assert _processes_naming(str(tmp_path / "cache")) == []


# ----------------------------------------------------------------------------------------- the monitor and watchdog


def test_the_monitor_gives_up_on_a_service_silent_for_the_configured_time():
    calls = 0

    async def refused() -> None:
        nonlocal calls
        calls += 1
        raise ConnectionRefusedError("connection refused")

    monitor = ServiceMonitor("the test service", unreachable_seconds=0.3, probe_seconds=0.05)
    reason = asyncio.run(asyncio.wait_for(monitor.run(refused), 30))
    assert calls >= 2
    assert reason.startswith("the test service has not answered for")
    assert "train.service_unreachable_seconds 0.3" in reason and "ConnectionRefusedError" in reason
    assert monitor.lost == reason and not monitor.answering()


def test_the_monitor_wakes_at_once_when_told_from_another_thread():
    async def fine() -> None:
        return None

    async def scenario() -> str:
        monitor = ServiceMonitor("the test service", unreachable_seconds=3600)
        running = asyncio.ensure_future(monitor.run(fine))
        await asyncio.sleep(0)
        assert monitor.answering()
        died = "the local Tinker server died (killed by SIGKILL)"
        threading.Thread(target=monitor.lose, args=(died,)).start()
        # probes come every 10 s at most; the loss arrives long before the hour the probes would take
        return await asyncio.wait_for(running, 30)

    assert asyncio.run(scenario()) == "the local Tinker server died (killed by SIGKILL)"


_WATCHDOG_OVER_A_SILENT_SERVICE = """
import asyncio
from platoon.train.tinker.watchdog import Watchdog

async def main():
    dog = Watchdog(timeout_seconds=1.0, exit_code=7, answering=lambda: False)
    dog.start()
    async with dog.keep_alive():  # awaiting a service that does not answer
        await asyncio.sleep(60)

asyncio.run(main())
"""


def test_the_watchdog_counts_time_spent_waiting_on_a_service_that_does_not_answer():
    done = subprocess.run(
        [sys.executable, "-c", _WATCHDOG_OVER_A_SILENT_SERVICE],
        capture_output=True,
        text=True,
        timeout=HANG_GUARD,
    )
    assert done.returncode == 7, done.stderr
    assert "platoon: watchdog: no progress for" in done.stderr


def test_the_sdk_reports_of_a_silent_service_are_not_shown(caplog):
    import logging

    from platoon.train.tinker.watchdog import quiet_sdk_connection_noise

    quiet_sdk_connection_noise()
    with caplog.at_level(logging.WARNING):
        logging.getLogger("tinker.lib.internal_client_holder").warning(
            "Session heartbeat failed for 130.1 seconds for session s-1. Last exception: APIConnectionError"
        )
        logging.getLogger("tinker.lib.telemetry").warning(
            "Failed to send telemetry batch", exc_info=ConnectionError("refused")
        )
        logging.getLogger("tinker.lib.internal_client_holder").warning("something else the SDK says")
    assert [record.getMessage() for record in caplog.records] == ["something else the SDK says"]


def test_an_sdk_connection_error_that_gave_up_names_the_service():
    import httpx
    import tinker

    from platoon.train.tinker.loop import _unreachable

    request = httpx.Request("POST", "http://127.0.0.1:9/api/v1/save_weights")
    try:
        try:
            raise tinker.APIConnectionError(request=request)
        except tinker.APIConnectionError as exc:
            raise RuntimeError("while saving") from exc
    except RuntimeError as wrapped:
        reason = _unreachable(wrapped, "the Tinker service at http://127.0.0.1:9")
    assert (
        reason
        == "the Tinker service at http://127.0.0.1:9 could not be reached (APIConnectionError: Connection error.)"
    )
    assert _unreachable(ValueError("a bug"), "the Tinker service") is None
