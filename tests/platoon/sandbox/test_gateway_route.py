"""A sandbox off the host's network (`none`, and `public` with its filtered egress) reaches platoon's own gateway
through its route only: the gateway
serves one rollout on a Unix socket, the sandbox names it as an upstream, and a command inside calls the model
(Chat Completions) and the MCP tool plane through the route, while a listener on the host's loopback stays out of
reach and another rollout's key is refused.

Real components: `ModelGateway` over a scripted policy, `GatewayServer` on a Unix socket with the MCP plane
mounted, an openreward environment served in process for the tools, and the `docker` provider (the engine from
`.ci/docker-engine start`) and the `process` provider (a network namespace through bubblewrap).
"""

from __future__ import annotations

import asyncio
import json
import socket
from pathlib import Path
from typing import Any

import pytest
from openreward.environments import Environment, TextBlock, ToolOutput, tool
from pydantic import BaseModel

from platoon.envs.ors.inprocess import InProcessOrsService
from platoon.gateway.http.server import GatewayServer
from platoon.gateway.mcp import bind_tools, mount_mcp
from platoon.sandbox import SandboxSpec
from platoon.testing import ScriptedPolicy, make_gateway

PYTHON_IMAGE = "docker://platoon-test/python:bookworm"


class Note(BaseModel):
    text: str


class NotebookEnv(Environment):
    """One tool, `note`, whose calls the test reads back."""

    notes: list[str] = []

    @classmethod
    def list_splits(cls) -> list[str]:
        return ["train"]

    @classmethod
    def list_tasks(cls, split: str) -> list[dict[str, Any]]:
        return [{"task_name": "t0"}]

    def get_prompt(self) -> list[TextBlock]:
        return [TextBlock(text="Take a note.")]

    @tool
    async def note(self, params: Note) -> ToolOutput:
        """Write a note down."""
        NotebookEnv.notes.append(params.text)
        return ToolOutput(blocks=[TextBlock(text=f"noted {params.text}")], reward=0.0)


# Runs inside the sandbox: argv = route, agent key, host port. Prints one JSON object of what it saw.
CLIENT = r"""
import json, socket, sys, urllib.request, urllib.error
route, key, port = sys.argv[1], sys.argv[2], int(sys.argv[3])

def post(path, body, key=key):
    request = urllib.request.Request(route + path, data=json.dumps(body).encode(), method="POST", headers={
        "Authorization": "Bearer " + key, "Content-Type": "application/json",
        "Accept": "application/json, text/event-stream"})
    try:
        with urllib.request.urlopen(request, timeout=30) as reply:
            return reply.status, reply.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()

def message(body):  # a JSON-RPC reply comes as JSON or as server-sent events
    data = [line[5:].strip() for line in body.splitlines() if line.startswith("data:")]
    return json.loads(data[-1] if data else body)

seen = {}
status, body = post("/v1/chat/completions", {"model": "policy", "messages": [{"role": "user", "content": "hi"}]})
seen["chat"] = [status, json.loads(body)["choices"][0]["message"]["content"] if status == 200 else body]
rpc = lambda method, params, id=1: post("/mcp", {"jsonrpc": "2.0", "id": id, "method": method, "params": params})
seen["init"] = rpc("initialize", {"protocolVersion": "2025-06-18", "capabilities": {},
                                  "clientInfo": {"name": "probe", "version": "0"}})[0]
status, body = rpc("tools/list", {}, 2)
seen["tools"] = [t["name"] for t in message(body)["result"]["tools"]] if status == 200 else body
status, body = rpc("tools/call", {"name": "note", "arguments": {"text": "from the sandbox"}}, 3)
seen["call"] = message(body)["result"]["content"][0]["text"] if status == 200 else body
seen["stranger"] = post("/v1/chat/completions", {"model": "policy", "messages": []}, key=sys.argv[4])[0]
try:
    socket.create_connection(("127.0.0.1", port), timeout=3).close()
    seen["host"] = "connected"
except OSError as error:
    seen["host"] = "refused"
print(json.dumps(seen))
"""


def start_provider(name: str, network: str) -> Any:
    if name == "docker":
        from platoon_sandbox.docker import DockerProvider

        return DockerProvider(), PYTHON_IMAGE
    from platoon_sandbox import netns
    from platoon_sandbox.process import ProcessProvider

    problem = netns.unavailable()
    if problem is None and network == "public":
        from platoon_sandbox import egress

        problem = egress.process_unavailable()
    if problem is not None:
        pytest.fail(f"the process provider has no network namespace here: {problem}", pytrace=False)
    return ProcessProvider(), "local"


@pytest.mark.parametrize("network", ["none", "public"])
@pytest.mark.parametrize("provider_name", ["docker", "process"])
def test_a_sandbox_off_the_host_network_calls_the_model_and_the_tool_plane_through_its_route_and_nothing_else(
    provider_name: str, network: str, tmp_path: Path
) -> None:
    NotebookEnv.notes = []
    socket_dir = tmp_path / "gw"
    socket_dir.mkdir(mode=0o700)

    async def main() -> dict[str, Any]:
        policy = ScriptedPolicy(["hello from the policy"])
        gateway = make_gateway(policy)
        rollout = gateway.open_rollout("r")
        root = gateway.open_agent(rollout)
        stranger = gateway.open_agent(gateway.open_rollout("other"))
        service = InProcessOrsService(NotebookEnv)
        session = await service.open(await service.get_task("train:0"), rollout_id="r")
        bind_tools(root, session)
        server = GatewayServer(gateway, unix_socket=socket_dir / "gw.sock", rollouts=["r"])
        mount_mcp(server)
        provider, image = start_provider(provider_name, network)
        with socket.socket() as listener:
            listener.bind(("127.0.0.1", 0))
            listener.listen()
            port = listener.getsockname()[1]
            async with server:
                assert server.upstream == f"unix://{socket_dir / 'gw.sock'}"
                sandbox = await provider.start(
                    SandboxSpec(image=image, network=network, upstreams={"gateway": server.upstream})
                )
                try:
                    route = sandbox.routes["gateway"]
                    assert route == "http://127.0.0.1:18080"
                    result = await sandbox.exec(
                        ["python3", "-c", CLIENT, route, root.secret, str(port), stranger.secret],
                        timeout_s=60,
                    )
                finally:
                    await sandbox.stop()
        await session.close()
        assert result.exit_code == 0, result.stderr
        seen = json.loads(result.stdout)
        seen["recorded"] = [call.text for call in policy.calls]
        return seen

    seen = asyncio.run(main())
    assert seen["chat"] == [200, "hello from the policy"]
    assert seen["recorded"] == ["hello from the policy"]  # sampled by the policy behind the gateway
    assert seen["init"] == 200
    assert seen["tools"] == ["note"]
    assert seen["call"] == "noted from the sandbox" and NotebookEnv.notes == ["from the sandbox"]
    assert seen["stranger"] == 401  # the socket serves this rollout's keys only
    assert seen["host"] == "refused"  # off the host network: the host's loopback is out of reach
    assert not (socket_dir / "gw.sock").exists()  # the server removed its socket
