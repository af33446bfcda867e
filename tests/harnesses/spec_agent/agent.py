"""A small command-line agent for the spec runner's tests (standard library only).

`--mode chat` asks the model (Chat Completions, key from AGENT_KEY) with the environment's MCP tools until it
answers without a tool call or a tool result says the episode finished; `budget` asks until the gateway's budget
stop arrives; `hang` starts a child that leaves the process group and ignores TERM, then sleeps; `crash` exits 7;
`oom` allocates until the sandbox's memory limit kills it; `env` reports its environment; `aux` tries an aux call. The final message goes to --final-file.
"""

import argparse
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request


def post(url, body, key, kind=None):
    headers = {
        "Authorization": "Bearer " + key,
        "Content-Type": "application/json",
        "Accept": "application/json, text/event-stream",
    }
    if kind:
        headers["X-Platoon-Call-Kind"] = kind
    request = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST", headers=headers)
    with urllib.request.urlopen(request, timeout=120) as reply:
        return reply.read().decode()


def rpc(url, key, method, params, ident):
    body = post(url, {"jsonrpc": "2.0", "id": ident, "method": method, "params": params}, key)
    data = [line[5:].strip() for line in body.splitlines() if line.startswith("data:")]
    return json.loads(data[-1] if data else body)["result"]


def finish(args, text, code=0):
    with open(args.final_file, "w") as handle:
        handle.write(text)
    print("FINAL: " + text, flush=True)
    sys.exit(code)


def chat(args, key, messages, tools):
    body = {"model": os.environ.get("AGENT_MODEL", "policy"), "messages": messages}
    if tools:
        body["tools"] = tools
    return json.loads(post(args.base_url + "/chat/completions", body, key))["choices"][0]["message"]


def main():
    parser = argparse.ArgumentParser()
    for flag in ("--base-url", "--mode", "--final-file", "--instruction-file", "--mcp-url"):
        parser.add_argument(flag)
    parser.add_argument("--max-turns", type=int, default=10)
    args = parser.parse_args()
    key = os.environ["AGENT_KEY"]
    if args.mode == "crash":
        print("about to crash", flush=True)
        sys.exit(7)
    if args.mode == "oom":
        print("allocating", flush=True)
        hoard = [bytearray(16 << 20) for _ in range(64)]  # 1 GiB, far over the test's limit
        finish(args, f"survived with {len(hoard)} blocks")
    if args.mode == "env":
        finish(
            args, json.dumps({name: os.environ[name] for name in sorted(os.environ) if name != "AGENT_KEY"})
        )
    if args.mode == "aux":  # an aux call: refused (403) where the key is placed next to model-written code
        try:
            post(
                args.base_url + "/chat/completions",
                {"model": "policy", "messages": [{"role": "user", "content": "hi"}]},
                key,
                kind="aux",
            )
            finish(args, "aux allowed")
        except urllib.error.HTTPError as error:
            finish(args, f"aux refused {error.code}")
    if args.mode == "hang":
        child = subprocess.Popen(
            [
                sys.executable,
                "-c",
                "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(999)",
            ],
            start_new_session=True,
        )
        print(f"CHILD {child.pid}", flush=True)
        print(f"SELF {os.getpid()}", flush=True)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        time.sleep(999)
    with open(args.instruction_file) as handle:
        messages = [{"role": "user", "content": handle.read()}]
    if args.mode == "budget":
        for _ in range(50):
            reply = chat(args, key, messages, None)
            content = reply.get("content") or ""
            if content.startswith("[platoon]"):
                finish(args, content)
            messages += [reply, {"role": "user", "content": "go on"}]
        sys.exit(5)
    tools = []
    if args.mcp_url:
        rpc(
            args.mcp_url,
            key,
            "initialize",
            {
                "protocolVersion": "2025-06-18",
                "capabilities": {},
                "clientInfo": {"name": "test-agent", "version": "1"},
            },
            0,
        )
        for tool in rpc(args.mcp_url, key, "tools/list", {}, 1)["tools"]:
            tools.append(
                {
                    "type": "function",
                    "function": {
                        "name": tool["name"],
                        "description": tool.get("description", ""),
                        "parameters": tool.get("inputSchema") or {"type": "object", "properties": {}},
                    },
                }
            )
    for turn in range(args.max_turns):
        reply = chat(args, key, messages, tools)
        messages.append(reply)
        calls = reply.get("tool_calls") or []
        if not calls:
            finish(args, reply.get("content") or "")
        for call in calls:
            arguments = json.loads(call["function"]["arguments"] or "{}")
            print(f"TOOL {call['function']['name']} {json.dumps(arguments)}", flush=True)
            result = rpc(
                args.mcp_url,
                key,
                "tools/call",
                {"name": call["function"]["name"], "arguments": arguments},
                10 + turn,
            )
            text = "\n".join(block.get("text", "") for block in result.get("content", []))
            messages.append({"role": "tool", "tool_call_id": call["id"], "content": text})
            if ((result.get("_meta") or {}).get("platoon") or {}).get("finished"):
                finish(args, text)
    sys.exit(3)


if __name__ == "__main__":
    main()
