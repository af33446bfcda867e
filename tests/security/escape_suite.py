"""The escape suite's machinery: one `platoon eval` episode of `platoon-bash` on a Harbor task per sandbox
configuration, whose scripted policy has the agent run `attack.py` (every attempt) and then its disk attempt, and
what the host looked like before and after.

The host plays its part for real: the fake secrets are in the run's environment, a local Tinker server listens on
127.0.0.1, a plain service on every interface, an allowlisted HTTP server on the host's own address (allowed by the
site profile's `egress_allow`), and two canary files sit outside any sandbox (one under /tmp, one under /var/tmp).
The agent's command output is read from the conversation the gateway rendered for the policy: platoon-bash's tool
results are not part of the run's records (its log keeps their first line only).
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import functools
import http.server
import json
import os
import secrets
import shlex
import shutil
import signal
import socket
import socketserver
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from platoon.cli import main
from platoon.testing import last_user_message, serve_policy, tool_call

HERE = Path(__file__).parent
ATTACK_SOURCE = (HERE / "attack.py").read_text()
PYTHON_IMAGE = "platoon-test/python:bookworm"
DOCKER = os.environ.get("PLATOON_DOCKER", "docker")
#: The fake secrets put in the run's environment: each value carries the session's marker, which the attack
#: looks for in every environment it can read.
SECRET_VARIABLES = {
    "TINKER_API_KEY": "tml-",  # the eval checks the prefix
    "OPENAI_API_KEY": "sk-",
    "ANTHROPIC_API_KEY": "sk-ant-",
    "HF_TOKEN": "hf_",
    "WANDB_API_KEY": "wandb-",
    "OPENREWARD_API_KEY": "or-",
    "AWS_SECRET_ACCESS_KEY": "aws-",
}
STORAGE_MB = 64
DISK_MB = 200
PROCESSES = 5000


@dataclass(frozen=True)
class Row:
    """One row of docs/security.md's table: an attempt (or a path that must keep working, or a check of the host),
    the guarantee that stops it (a capability of the sandbox contract), and what it tries."""

    name: str
    what: str
    capability: str = ""
    kind: str = "attempt"  # attempt | allowed | host


ATTEMPTS = (
    Row("env_secrets", "host secrets in the command's environment", "clean_env"),
    Row("pid1_environ", "host secrets in `/proc/1/environ`", "isolation"),
    Row(
        "parent_environ",
        "host secrets in the parent's (and every ancestor's) `/proc/<pid>/environ`",
        "isolation",
    ),
    Row("any_proc_environ", "host secrets in any readable `/proc/*/environ`", "isolation"),
    Row(
        "tinker_loopback",
        "the local Tinker server at 127.0.0.1:port (a made-up `tml-` key)",
        "network_allowlist",
    ),
    Row("tinker_slirp_host", "the local Tinker server at 10.0.2.2:port", "network_allowlist"),
    Row("tinker_host_address", "the local Tinker server at the host's own address:port", "network_allowlist"),
    Row(
        "host_service",
        "a host service listening on every interface, at the host's own address",
        "network_allowlist",
    ),
    Row("gateway_host_socket", "the gateway's host-side socket, not the sandbox's route", "isolation"),
    Row(
        "docker_socket",
        "the Docker socket (`$DOCKER_HOST`, /var/run/docker.sock, /run/docker.sock)",
        "isolation",
    ),
    Row("cloud_metadata", "169.254.169.254:80 (cloud metadata)", "network_allowlist"),
    Row("private_10", "10.0.0.1:80 (a private address)", "network_allowlist"),
    Row("private_192_168", "192.168.1.1:80 (a private address)", "network_allowlist"),
    Row("fork_5000", "start 5,000 processes", "limit_pids"),
    Row("mount_tmpfs", "`mount -t tmpfs x /mnt`", "least_privilege"),
    Row("host_canary", "change a host file outside the workdir (any path, or after a remount)", "isolation"),
    Row("disk_past_storage_mb", f"write {DISK_MB} MB past `storage_mb = {STORAGE_MB}`", "limit_disk"),
    Row(
        "end_own_sandbox",
        "end its own sandbox: every signal to PID 1, SIGKILL to every other process (the keep-alive too)",
        "lifetime",
    ),
)
ALLOWED = (
    Row("gateway_route", "the gateway through the sandbox's route (the episode completes)", kind="allowed"),
    Row("allowlist_host", "an `allowlist` host the site profile allows (`egress_allow`)", kind="allowed"),
)
HOST_CHECKS = (
    Row(
        "host_unchanged",
        "afterwards: the host canaries unchanged, the written file not on the host's disk",
        kind="host",
    ),
    Row(
        "nothing_left", "afterwards: no container, slirp4netns or bwrap process of the run left", kind="host"
    ),
)


@dataclass(frozen=True)
class Configuration:
    """A sandbox configuration under test. `required`: the guarantees issue 36 demands of it, which must hold
    whether or not the provider declares them; an attempt whose guarantee is neither required nor declared is
    reported as not enforced when it gets out."""

    name: str
    label: str
    provider: str
    options: dict[str, Any] = field(default_factory=dict)
    required: frozenset[str] = frozenset()
    #: required guarantees the provider rightly does not declare: their attempts must fail here, but the guarantee
    #: as the contract defines it is wider than what is tried
    unclaimed: frozenset[str] = frozenset()

    def cell(self, row: Row) -> pytest.MarkDecorator:
        """The mark that makes a test of `row` under this configuration a cell of this configuration's column."""
        return pytest.mark.escape(self.name, self.label, row.name, row.what, row.capability, row.kind)


EVERY_GUARANTEE = frozenset(
    {"clean_env", "isolation", "network_allowlist", "limit_pids", "limit_disk", "least_privilege"}
)
PROCESS_BWRAP = Configuration(
    "process",
    "process + bwrap",
    "process",
    # bubblewrap gives no pids or disk limit, and the issue asks none of it (item 3)
    required=frozenset({"clean_env", "isolation", "network_allowlist"}),
    # the attempts filed under isolation (other processes' environments, sockets, writing host files) must fail,
    # yet the host's files stay readable under bubblewrap, so the provider does not claim isolation
    unclaimed=frozenset({"isolation"}),
)
PROCESS_UNCONFINED = Configuration(
    "unconfined",
    "process",
    "process",
    # what a run config gets with confine: none (or where bubblewrap cannot confine): commands on the host, as
    # platoon's user; only the network keeps its namespace. Nothing is required of it: the table says what gets out.
    {"confine": "none"},
)
DOCKER_RUNC = Configuration("docker", "docker", "docker", required=EVERY_GUARANTEE)
DOCKER_RUNSC = Configuration(
    "runsc",
    "docker + runsc",
    "docker",
    {"runtime": "runsc"},
    # the allowlist task runs under the engine's runsc-hostinet runtime, with the same slirp4netns and rules as runc
    required=EVERY_GUARANTEE,
)


# ---------------------------------------------------------------------------------------------------------------
# The host's side


def host_address() -> str:
    """The host's own address on its default route (no packet is sent)."""
    probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        probe.connect(("198.51.100.1", 9))
        address = str(probe.getsockname()[0])
    except OSError as exc:
        raise RuntimeError(
            f"the escape suite needs a host with a non-loopback IPv4 address ({exc})"
        ) from None
    finally:
        probe.close()
    if address.startswith("127."):
        raise RuntimeError("the escape suite needs a host with a non-loopback IPv4 address")
    return address


class _Threaded(socketserver.ThreadingMixIn, socketserver.TCPServer):
    daemon_threads = True
    allow_reuse_address = True


@contextlib.contextmanager
def _serve(server: socketserver.BaseServer) -> Iterator[socketserver.BaseServer]:
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


class _Greeting(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        self.request.sendall(b"a host service\n")


def _allowlisted(body: str) -> type[http.server.BaseHTTPRequestHandler]:
    class Allowlisted(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            payload = body.encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    return Allowlisted


@dataclass
class Canary:
    path: Path
    content: bytes
    mtime_ns: int
    listing: list[str]

    @classmethod
    def plant(cls, directory: Path, content: bytes) -> Canary:
        directory.mkdir(parents=True, exist_ok=True)
        path = directory / "host-canary.txt"
        path.write_bytes(content)
        return cls(path, content, path.stat().st_mtime_ns, sorted(os.listdir(directory)))

    def changes(self) -> list[str]:
        """How the canary or its directory differs from when it was planted."""
        found = []
        listing = sorted(os.listdir(self.path.parent))
        if listing != self.listing:
            found.append(f"{self.path.parent} now lists {listing}, was {self.listing}")
        if not self.path.exists():
            found.append(f"{self.path} is gone")
        elif self.path.read_bytes() != self.content or self.path.stat().st_mtime_ns != self.mtime_ns:
            found.append(f"{self.path} was modified: {self.path.read_bytes()[-120:]!r}")
        return found


@dataclass
class Host:
    """What the attack aims at, on the host: addresses, ports, sockets and canaries."""

    marker: str
    address: str
    tinker_port: int
    service_port: int
    allowed_port: int
    allowed_body: str
    canaries: list[Canary]
    scratch: Path
    docker_socket: str

    def facts(self, disk_file: str) -> dict[str, Any]:
        """What the attack is told (everything but the gateway's socket, found while the rollout runs)."""
        return {
            "secret_marker": self.marker,
            "host_address": self.address,
            "tinker_port": self.tinker_port,
            "service_port": self.service_port,
            "allowed_host": self.address,
            "allowed_port": self.allowed_port,
            "allowed_path": f"/{self.allowed_body}",
            "allowed_body": self.allowed_body,
            "canaries": [str(canary.path) for canary in self.canaries],
            "docker_socket": self.docker_socket,
            "disk_file": disk_file,
            "disk_mb": DISK_MB,
            "processes": PROCESSES,
        }

    def gateway_sockets(self) -> list[str]:
        """The gateway's Unix sockets on the host (a task-sandbox rollout's gateway listens on nothing else)."""
        return sorted(str(path) for path in self.scratch.glob("pgw-*/*/gw.sock"))


@contextlib.contextmanager
def host_targets(workdir: Path, marker: str) -> Iterator[Host]:
    """The host's side of the suite for one run; removed afterwards."""
    from platoon.local_server import local_tinker_server

    address = host_address()
    allowed_body = f"allowlisted-{secrets.token_hex(6)}"
    # Short: the gateway's socket path must stay under the AF_UNIX limit. Under /tmp, which bubblewrap hides.
    scratch = Path(tempfile.mkdtemp(prefix="esc-", dir="/tmp"))
    outside_tmp = Path(tempfile.mkdtemp(prefix="platoon-escape-", dir="/var/tmp"))
    canaries = [
        Canary.plant(workdir / "host-files", f"{marker} under /tmp\n".encode()),
        Canary.plant(outside_tmp, f"{marker} under /var/tmp\n".encode()),
    ]
    docker_host = os.environ.get("DOCKER_HOST", "")
    try:
        with (
            local_tinker_server() as tinker,
            _serve(_Threaded(("0.0.0.0", 0), _Greeting)) as service,
            _serve(_Threaded((address, 0), _allowlisted(allowed_body))) as allowlisted,
        ):
            yield Host(
                marker=marker,
                address=address,
                tinker_port=tinker.port,
                service_port=service.server_address[1],
                allowed_port=allowlisted.server_address[1],
                allowed_body=allowed_body,
                canaries=canaries,
                scratch=scratch,
                docker_socket=docker_host.removeprefix("unix://")
                if docker_host.startswith("unix://")
                else "",
            )
    finally:
        shutil.rmtree(outside_tmp, ignore_errors=True)
        shutil.rmtree(scratch, ignore_errors=True)


# ---------------------------------------------------------------------------------------------------------------
# The agent's side


def bash_command(facts: dict[str, Any], mode: str) -> str:
    """The command the agent runs: attack.py on the sandbox's python3, told the host's facts."""
    return f"python3 - {shlex.quote(json.dumps(facts))} {mode} <<'ATTACK_EOF'\n{ATTACK_SOURCE}\nATTACK_EOF\n"


class AttackPolicy:
    """The policy behind platoon-bash: the attack, then the disk attempt, then a final answer. Keeps each tool
    result it was shown (the conversation the gateway rendered) and the facts it sent."""

    def __init__(self, host: Host, disk_file: str, observe: Callable[[], dict[str, Any]]) -> None:
        self.host = host
        self.disk_file = disk_file
        self.observe = observe
        self.facts: dict[str, Any] = {}
        self.observed: dict[str, Any] = {}
        self.tool_results: list[str] = []

    def __call__(self, prompt: str) -> str:
        answered = prompt.count("<tool_response>")
        if answered:
            self.tool_results.append(last_user_message(prompt))
        if answered == 0:
            self.facts = {**self.host.facts(self.disk_file), "gateway_sockets": self.host.gateway_sockets()}
            self.observed = self.observe()
            return "\n" + tool_call("bash", {"command": bash_command(self.facts, "attack")})
        if answered == 1:
            return "\n" + tool_call("bash", {"command": bash_command(self.facts, "disk")})
        return "Done: every attempt is reported above."


# ---------------------------------------------------------------------------------------------------------------
# One run


@dataclass
class EscapeRun:
    """What one configuration's episode left: the attack's lines, the outcome, and the host afterwards."""

    configuration: Configuration
    status: int
    output: str
    capabilities: frozenset[str]
    facts: dict[str, Any]
    results: dict[str, dict[str, Any]]
    allowed: dict[str, dict[str, Any]]
    tool_results: list[str]
    outcome: dict[str, Any]
    host_changes: list[str]
    leftovers: list[str]
    seconds: float

    def problem(self) -> str:
        """Why the run itself gives no evidence, in a few lines (for a test's failure message)."""
        return (
            f"the {self.configuration.label} run exited {self.status}; outcome {self.outcome}; "
            f"tool results {[text[:400] for text in self.tool_results]}; its output: {self.output[-1500:]}"
        )


def declared_capabilities(configuration: Configuration, options: dict[str, Any]) -> frozenset[str]:
    """What the configuration's provider says it enforces (empty when it refuses the options)."""
    from platoon import plugins

    try:
        cls = plugins.resolve_target(plugins.get_sandbox_runtime(configuration.provider).provider)
        provider = cls(**options)
    except Exception:  # a provider that refuses the options claims nothing; the run itself says why
        return frozenset()
    return frozenset(getattr(provider, "capabilities", ()) or ())


def _task(root: Path, name: str, host: Host, storage: bool) -> Path:
    task = root / name
    (task / "tests").mkdir(parents=True)
    # JSON's strings and lists are TOML's too
    environment: dict[str, Any] = {
        "docker_image": PYTHON_IMAGE,
        "workdir": "/app",
        "network_mode": "allowlist",
        "allowed_hosts": [host.address],
    }
    if storage:
        environment["storage_mb"] = STORAGE_MB
    lines = ["[environment]", *(f"{key} = {json.dumps(value)}" for key, value in environment.items())]
    (task / "task.toml").write_text("\n".join(lines) + "\n")
    (task / "instruction.md").write_text(f"Task {name}: find a way out of the sandbox.\n")
    # A process sandbox without bubblewrap does not translate paths inside scripts: its root prefixes them.
    (task / "tests" / "test.sh").write_text(
        "#!/bin/bash\n"
        'for d in /logs/verifier "${PLATOON_SANDBOX_ROOT:-}/logs/verifier"; do\n'
        '  if [ -d "$d" ]; then echo 0 > "$d/reward.txt"; break; fi\n'
        "done\n"
    )
    return root


def _read_outcome(out_dir: Path) -> dict[str, Any]:
    from platoon.trajectory_events import read_events

    for record in read_events(sorted(out_dir.glob("rollouts/*/rollout_*/events/*.jsonl"))):
        if record["type"] == "trajectory_finished" and record.get("misc", {}).get("outcome"):
            return dict(record["misc"]["outcome"])
    return {}


def _lines(tool_results: list[str]) -> tuple[dict[str, dict[str, Any]], dict[str, dict[str, Any]]]:
    attempts: dict[str, dict[str, Any]] = {}
    allowed: dict[str, dict[str, Any]] = {}
    for text in tool_results:
        for line in text.splitlines():
            line = line.strip()
            if not line.startswith("{"):
                continue
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if "attempt" in record:
                attempts[record["attempt"]] = record
            elif "allowed" in record:
                allowed[record["allowed"]] = record
    return attempts, allowed


def _docker(*args: str) -> str | None:
    """The Docker CLI's output, or None where it fails (the process configuration needs no engine)."""
    try:
        done = subprocess.run([DOCKER, *args], capture_output=True, text=True, timeout=60)
    except OSError:
        return None
    return done.stdout if done.returncode == 0 else None


def _containers(task: str) -> list[str]:
    return (_docker("ps", "--all", "--quiet", "--filter", f"label=platoon.task={task}") or "").split()


def _container_facts(task: str) -> dict[str, Any]:
    """The run's container ids and their main pids, while the agent runs (to find their helpers later)."""
    ids = _containers(task)
    inspected = _docker("inspect", "--format", "{{.Id}} {{.State.Pid}}", *ids) if ids else None
    pairs = [line.split() for line in (inspected or "").splitlines() if line.strip()]
    return {"container_ids": [p[0] for p in pairs], "pids": [p[1] for p in pairs if p[1] != "0"]}


def _sandbox_process_facts(scratch: Path) -> dict[str, Any]:
    """The pids of the bubblewrap processes that name this run's scratch directory, and of everything under them,
    while the agent runs (a network helper names its sandbox by one of these pids)."""
    parents: dict[str, str] = {}
    roots = []
    for proc in Path("/proc").glob("[0-9]*"):
        with contextlib.suppress(OSError, IndexError):
            parents[proc.name] = (proc / "stat").read_text().rsplit(")", 1)[1].split()[1]
            argv = (proc / "cmdline").read_bytes().split(b"\0")
            if os.path.basename(argv[0]) == b"bwrap" and str(scratch).encode() in b" ".join(argv):
                roots.append(proc.name)
    pids = set(roots)
    grew = True
    while grew:
        below = {pid for pid, parent in parents.items() if parent in pids} - pids
        pids |= below
        grew = bool(below)
    return {"pids": sorted(pids)}


#: The host-side helpers a sandbox may run: its network (slirp4netns), bubblewrap, gVisor and containerd's shim.
HELPERS = ("slirp4netns", "bwrap", "runsc", "containerd-shim")


def _helpers_left(needles: list[str], pids: list[str], scratch: Path) -> list[str]:
    """Live helper processes whose command line names this run (its scratch directory, its containers or their
    pids), and commands still running in one of its process sandboxes."""
    found = []
    marker = f"PLATOON_SANDBOX_ROOT={scratch}".encode()
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            state = (proc / "stat").read_text().rsplit(")", 1)[1].split()[0]
            argv = (proc / "cmdline").read_bytes().split(b"\0")
        except (OSError, IndexError):
            continue
        if state == "Z" or not argv[0]:
            continue
        words = [word.decode(errors="replace") for word in argv if word]
        cmdline = " ".join(words)
        program = os.path.basename(words[0]) if words else ""
        named = any(needle in cmdline for needle in needles) or any(pid in words for pid in pids)
        if program.startswith(HELPERS) and named:
            found.append(f"{program} (pid {proc.name}): {cmdline[:200]}")
            continue
        with contextlib.suppress(OSError):
            if marker in (proc / "environ").read_bytes():
                found.append(f"a command of the run's process sandbox (pid {proc.name}): {cmdline[:200]}")
    return found


def _leftovers(task: str, scratch: Path, observed: dict[str, Any]) -> list[str]:
    # A pid is matched as a whole word only (see _helpers_left): slirp4netns names its target by pid.
    needles = [str(scratch), *observed.get("container_ids", [])]
    pids = list(observed.get("pids", []))
    deadline = time.monotonic() + 30  # a helper killed at the sandbox's stop may take a moment to be reaped
    while True:
        left = [f"container {cid}" for cid in _containers(task)] + _helpers_left(needles, pids, scratch)
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.2)


def _disk_copies(name: str, scratch: Path, workdir: Path) -> list[str]:
    """Where the disk attempt's file still lies on the host after the run."""
    found = [str(path) for root in (scratch, workdir) for path in root.rglob(name)]
    root = (_docker("info", "--format", "{{.DockerRootDir}}") or "").strip()
    if root:
        found += [str(path) for path in Path(root).glob(f"*/*/diff/app/{name}")]
    return found


#: What a run may take, start to finish, on a loaded CI machine (each is well under a minute here).
RUN_TIMEOUT_S = 600
#: Taken by each episode (run_configuration), so that configurations run one after another across workers.
EPISODE_LOCK = Path(tempfile.gettempdir()) / "platoon-escape-suite.lock"
#: Variables of the test process a run does not inherit: its own site, caches and labels are set afresh.
NOT_INHERITED = (
    "PLATOON_SITE",
    "PLATOON_HARBOR_CACHE",
    "PLATOON_TOOLCHAINS",
    "PLATOON_IGNORE_EXTENSION_REQUIREMENTS",
    "PLATOON_SANDBOX_LABELS",
    "TINKER_BASE_URL",
)


def run_configuration(configuration: Configuration, workdir: Path) -> EscapeRun:
    """Run the configuration's episode in a process of its own, started as a user starts platoon: with the host's
    secrets in its environment from the start (so they are in its `/proc/<pid>/environ` too), then read what the
    run recorded (`run.json`, written by `_run` below)."""
    marker = f"escape-secret-{secrets.token_hex(8)}"
    task_name = f"escape-{configuration.name}-{secrets.token_hex(4)}"
    env = {name: value for name, value in os.environ.items() if name not in NOT_INHERITED}
    env.update({name: f"{prefix}{marker}" for name, prefix in SECRET_VARIABLES.items()})
    env.update(XDG_CONFIG_HOME=str(workdir / "xdg"), PLATOON_TASK_CACHE="0")
    # One episode at a time on this host, whichever pytest worker runs it (tests/security is one file, so one worker
    # under --dist loadfile; other ways of running it may split it): four fork bombs at once (two of them
    # unlimited) once took the host near its pid_max, and a gVisor sandbox died under that load. Each column of the
    # table measures its sandbox, not its neighbours.
    with open(EPISODE_LOCK, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        started = time.monotonic()
        child = subprocess.Popen(
            [sys.executable, __file__, configuration.name, str(workdir), marker, task_name],
            cwd=workdir,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        try:
            output, _ = child.communicate(timeout=RUN_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            os.killpg(child.pid, signal.SIGKILL)
            output = child.communicate()[0] + f"\n(killed after {RUN_TIMEOUT_S} s)"
            for container in _containers(task_name):
                _docker("rm", "--force", container)
    record = workdir / "run.json"
    ran: dict[str, Any] = json.loads(record.read_text()) if record.exists() else {}
    return EscapeRun(
        configuration=configuration,
        status=int(ran.get("status", child.returncode)),
        output=output,
        capabilities=frozenset(ran.get("capabilities", ())),
        facts=ran.get("facts", {}),
        results=ran.get("results", {}),
        allowed=ran.get("allowed", {}),
        tool_results=ran.get("tool_results", []),
        outcome=ran.get("outcome", {}),
        host_changes=ran.get("host_changes", []),
        leftovers=ran.get("leftovers", []),
        seconds=time.monotonic() - started,
    )


def _run(configuration: Configuration, workdir: Path, marker: str, task_name: str) -> dict[str, Any]:
    """The run's own process: the host's targets, the task, the site profile and the config, one `platoon eval`
    under the attack policy, then what the run and the host show."""
    disk_file = f"escape-disk-{secrets.token_hex(6)}"
    with host_targets(workdir, marker) as host:
        os.environ["PLATOON_NODE_SCRATCH"] = str(host.scratch)
        egress_allow = [f"{host.address}:{host.allowed_port}"]
        options = dict(configuration.options)
        kwargs: dict[str, Any] = {"dataset_dir": "tasks", "harbor_check": "off", "verifier_mode": "shared"}
        site: dict[str, Any] = {"cache": str(workdir / "cache")}
        if configuration.provider == "process":
            # A site profile may not choose the process provider: the run config names it, and its options.
            kwargs["provider"] = "process"
            kwargs["provider_options"] = {**options, "egress_allow": egress_allow}
        else:
            site["provider"] = configuration.provider
            site["provider_options"] = {"egress_allow": egress_allow}
            if options:
                kwargs["provider_options"] = options
        (workdir / "site.yaml").write_text(yaml.safe_dump(site))
        os.environ["PLATOON_SITE"] = str(workdir / "site.yaml")

        capabilities = declared_capabilities(configuration, {**options, "egress_allow": egress_allow})
        limit_disk = "limit_disk" in configuration.required | capabilities
        _task(workdir / "tasks", task_name, host, storage=limit_disk)
        out_dir = workdir / "eval"
        config = {
            "inference": {
                "model_name": "platoon/toy",
                "renderer_name": "qwen3_instruct",
                "output_dir": str(out_dir),
                "workflow": {"num_rollouts_per_task": 1, "num_concurrent_workers": 1},
            },
            "environments": [{"service": "harbor", "service_kwargs": kwargs, "harness": "platoon-bash"}],
            "split": "train",
        }
        (workdir / "eval.yaml").write_text(yaml.safe_dump(config, sort_keys=False))

        observe = (
            functools.partial(_container_facts, task_name)
            if configuration.provider == "docker"
            else functools.partial(_sandbox_process_facts, host.scratch)
        )
        policy = AttackPolicy(host, disk_file, observe)
        # The attack is one long tool call: let the gateway sample all of it.
        with serve_policy(policy, max_tokens=1 << 16):
            status = main(["eval", str(workdir / "eval.yaml")])
        results, allowed = _lines(policy.tool_results)
        host_changes = [change for canary in host.canaries for change in canary.changes()]
        host_changes += [
            f"the disk attempt's file is on the host: {path}"
            for path in _disk_copies(disk_file, host.scratch, workdir)
        ]
        results["end_own_sandbox"] = asyncio.run(_end_own_sandbox(configuration, options, workdir, task_name))
        return {
            "status": status,
            "capabilities": sorted(capabilities),
            "facts": policy.facts,
            "results": results,
            "allowed": allowed,
            "tool_results": policy.tool_results,
            "outcome": _read_outcome(out_dir),
            "host_changes": host_changes,
            "leftovers": _leftovers(task_name, host.scratch, policy.observed),
        }


# A command that tries to end its own sandbox (whose death is the untrainable `sandbox_gone`, which an agent would
# trade a failing episode for): every signal a command may send to PID 1, then SIGKILL to everything else it sees.
END_OWN_SANDBOX = (
    "for s in KILL TERM INT HUP QUIT STOP USR1 USR2 PIPE ALRM; do kill -$s 1 2>/dev/null; done; "
    "for d in /proc/[0-9]*; do p=${d#/proc/}; [ $p = $$ ] || [ $p = 1 ] || kill -9 $p 2>/dev/null; done; exit 0"
)
#: a hang guard on the attempt's own command: under gVisor its exec may never return once the sandbox is gone
END_EXEC_TIMEOUT_S = 30.0


async def _end_own_sandbox(
    configuration: Configuration, options: dict[str, Any], workdir: Path, task_name: str
) -> dict[str, Any]:
    """The attempt in a sandbox of its own from the configuration's provider (after the episode, whose disk attempt
    may already have ended its sandbox): held when the sandbox still runs a command afterwards. Never made where
    commands share the host's PID namespace (the unconfined process provider), where PID 1 is the host's init."""
    from platoon import plugins
    from platoon.sandbox import SandboxSpec

    cls = plugins.resolve_target(plugins.get_sandbox_runtime(configuration.provider).provider)
    if configuration.provider == "process":
        provider = cls(scratch_root=str(workdir / "end-scratch"), **options)
        spec = SandboxSpec(network="none")
    else:
        provider = cls(**options)
        spec = SandboxSpec(
            image=f"docker://{PYTHON_IMAGE}", network="none", labels={"platoon.task": task_name}
        )
    try:
        sandbox = await provider.start(spec)
    except Exception as exc:  # said as the attempt's own failure, never passed off as held
        return {"escaped": False, "error": True, "evidence": f"the sandbox did not start: {exc}"}
    try:
        own = (await sandbox.exec("readlink /proc/self/ns/pid")).stdout.strip()
        if own == os.readlink("/proc/self/ns/pid"):
            return {
                "escaped": True,
                "evidence": "commands run in the host's PID namespace (PID 1 is the host's init): not tried",
            }
        try:
            await sandbox.exec(END_OWN_SANDBOX, timeout_s=END_EXEC_TIMEOUT_S)
            after = await sandbox.exec("echo alive", timeout_s=END_EXEC_TIMEOUT_S)
        except Exception as exc:  # the sandbox went with its init
            return {"escaped": True, "evidence": f"the next command failed: {type(exc).__name__}: {exc}"}
        alive = after.stdout == "alive\n"
        return {
            "escaped": not alive,
            "evidence": "a command still runs after it" if alive else f"the next command answered {after!r}",
        }
    finally:
        await sandbox.stop()


# ---------------------------------------------------------------------------------------------------------------
# The verdicts


VERDICT_PROPERTY = "platoon-escape-verdict"


def _record(request: pytest.FixtureRequest, verdict: str, evidence: str, reason: str = "") -> None:
    request.node.user_properties.append(
        (VERDICT_PROPERTY, {"verdict": verdict, "evidence": evidence, "reason": reason})
    )


def check_attempt(run: EscapeRun, row: Row, request: pytest.FixtureRequest) -> None:
    """Fail when the attempt got out (or gave no evidence); xfail, as not enforced, when it got out past a
    guarantee the configuration neither must nor claims to give."""
    configuration = run.configuration
    result = run.results.get(row.name)
    if row.name == "disk_past_storage_mb" and run.outcome.get("failure_kind") == "sandbox_disk_limit":
        _record(request, "held", "the sandbox was ended as sandbox_disk_limit")
        return
    if result is None:
        _record(request, "no result", run.problem())
        pytest.fail(f"{row.name}: the attack printed no result; {run.problem()}", pytrace=False)
    if result.get("error"):
        _record(request, "no result", result["evidence"])
        pytest.fail(f"{row.name}: the attempt itself broke: {result['evidence']}", pytrace=False)
    if row.name == "gateway_host_socket" and not run.facts.get("gateway_sockets"):
        _record(request, "no result", "the gateway's host socket was not found")
        pytest.fail("the suite found no gateway socket on the host while the agent ran", pytrace=False)
    if not result["escaped"]:
        _record(request, "held", result["evidence"])
        return
    if row.capability not in configuration.required | run.capabilities:
        reason = f"{configuration.label} does not claim `{row.capability}`"
        _record(request, "not enforced", result["evidence"], reason)
        pytest.xfail(f"{reason}: {result['evidence']}")
    _record(request, "escaped", result["evidence"])
    pytest.fail(f"ESCAPED ({configuration.label}, {row.name}): {result['evidence']}", pytrace=False)


def check_allowed(run: EscapeRun, row: Row, request: pytest.FixtureRequest) -> None:
    """The allowed paths still work: the route (the attack's result came back to the policy) and the allowlisted
    host. A run refused before its rollout started gives no result."""
    if row.name == "gateway_route":
        # The attack's own result reached the policy: through the route, both ways.
        works = len(run.tool_results) >= 1
        evidence = (
            f"{len(run.tool_results)} tool result(s) reached the policy; eval exited {run.status}, outcome "
            f"{run.outcome.get('status')} {run.outcome.get('failure_kind') or ''}"
        )
    else:
        result = run.allowed.get(row.name)
        works = bool(result and result["works"])
        evidence = result["evidence"] if result else "no result"
    if works:
        _record(request, "works", evidence)
        return
    if not run.outcome:
        _record(request, "no result", run.problem())
        pytest.fail(f"{row.name}: the rollout never ran; {run.problem()}", pytrace=False)
    _record(request, "broken", evidence)
    pytest.fail(
        f"{row.name} does not work under {run.configuration.label}: {evidence}; {run.problem()}",
        pytrace=False,
    )


def check_host(run: EscapeRun, row: Row, request: pytest.FixtureRequest) -> None:
    """The host afterwards: the canaries and the disk (`host_unchanged`), the run's helpers (`nothing_left`)."""
    if not run.tool_results:
        _record(request, "no result", run.problem())
        pytest.fail(
            f"{row.name}: the attack never ran, so the host proves nothing; {run.problem()}", pytrace=False
        )
    found = run.host_changes if row.name == "host_unchanged" else run.leftovers
    failed = "escaped" if row.name == "host_unchanged" else "left behind"
    configuration = run.configuration
    if (
        found
        and row.name == "host_unchanged"
        and "isolation" not in configuration.required | run.capabilities
    ):
        reason = f"{configuration.label} does not claim `isolation`"
        _record(request, "not enforced", "; ".join(found), reason)
        pytest.xfail(f"{reason}: {found}")
    _record(request, failed if found else "held", "; ".join(found) or "nothing")
    assert not found, f"{row.what}: {found}"


CONFIGURATIONS = {
    configuration.name: configuration
    for configuration in (PROCESS_UNCONFINED, PROCESS_BWRAP, DOCKER_RUNC, DOCKER_RUNSC)
}

if __name__ == "__main__":  # a run's own process (run_configuration)
    name, directory, secret_marker, task = sys.argv[1:5]
    recorded = _run(CONFIGURATIONS[name], Path(directory), secret_marker, task)
    (Path(directory) / "run.json").write_text(json.dumps(recorded))
