"""Fixtures of the TOML harness spec tests: a spec written from a small, valid base with one change applied."""

from __future__ import annotations

import textwrap
from collections.abc import Callable
from pathlib import Path

import pytest

#: a valid spec using most tables; tests replace or append lines to make one mistake at a time
BASE = """
name = "acme-bash"
version = "1.2"
timeout_s = 600
max_steps = 20

[install]
commands = ["python3 --version"]
toolchain = "acme-tools"
timeout_s = 300

[install.recipe]
python = "3.12"
lock = "requirements.lock"
cache = ["tiktoken"]
generate = { "share/config.json" = "gen.py" }

[launch]
argv = ["{toolchain}/bin/python3", "{state_dir}/agent.py", "--base-url", "{base_url}/v1", "--steps", "{max_steps}",
        "--temperature", "{options.temperature}"]
env = { ACME_API_KEY = "{api_key}", ACME_OPTIONS = "{options}" }
files = { "instruction.md" = "{instruction}" }
assets = { "agent.py" = "agent.py" }

[builtins]
tools = ["bash"]

[builtins.disable]
args = ["--no-bash"]

[mcp]
args = ["--mcp-url", "{mcp_url}", "--mcp-config", "{mcp_config_path}"]
env = { ACME_MCP_KEY = "{api_key}" }
config_template = '{"url": "{mcp_url}"}'

[final_message]
file = "final.txt"
json_key = "info.answer"

[exit_codes]
3 = "completed"
5 = "error"

[resources]
memory_mb = 512

[budget]
enforce = "gateway"

[options.temperature]
type = "float"
default = 0.7
min = 0
max = 2
description = "sampling temperature"

[options.mode]
type = "str"
default = "fast"
allowed = ["fast", "careful"]

[options.retries]
type = "int"
default = 1
min = 0

[options.replay]
type = "bool"
default = true
"""


@pytest.fixture
def base() -> str:
    """The text of the valid base spec."""
    return BASE


@pytest.fixture
def spec_dir(tmp_path: Path) -> Path:
    """A directory holding the files BASE ships next to itself."""
    (tmp_path / "agent.py").write_text("print('agent')\n")
    (tmp_path / "requirements.lock").write_text("acme==1.0 --hash=sha256:00\n")
    (tmp_path / "gen.py").write_text("import sys\n")
    return tmp_path


@pytest.fixture
def write_spec(spec_dir: Path) -> Callable[..., Path]:
    """`write_spec(text=BASE, name="spec.toml")` writes a spec into `spec_dir` and returns its path."""

    def write(text: str | None = None, name: str = "spec.toml") -> Path:
        text = BASE if text is None else text
        path = spec_dir / name
        path.write_text(textwrap.dedent(text).lstrip("\n"))
        return path

    return write
