"""`platoon tinker serve`, the child-process server, the state directory default and the missing-torch error."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from urllib.parse import urlsplit

import httpx
import pytest

from platoon.gateway import tinker_sdk
from platoon.local_server.losses import LOSS_NAMES
from platoon.local_server.process import default_state_dir, start_local_server_process


def test_tinker_serve_answers_until_interrupted(tmp_path):
    child = subprocess.Popen(
        # -X faulthandler: a server that does not stop is aborted below and prints where each thread was
        [
            sys.executable,
            "-X",
            "faulthandler",
            "-m",
            "platoon",
            "tinker",
            "serve",
            "--dir",
            str(tmp_path / "state"),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        # Ctrl-C as at a terminal: a suite started in the background by a shell without job control has SIGINT
        # ignored, and an ignored SIGINT is inherited (and respected by Python)
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        assert child.stdout is not None and child.stderr is not None
        base_url = child.stdout.readline().strip()
        assert base_url.startswith("http://127.0.0.1:")
        key = child.stdout.readline().strip()  # issued for this start
        assert key.startswith("tml-")
        headers = {"X-API-Key": key}
        capabilities = httpx.get(
            f"{base_url}/api/v1/get_server_capabilities", headers=headers, timeout=10
        ).json()
        assert capabilities == {
            "supported_models": [
                {
                    "model_name": "platoon/toy",
                    "max_context_length": 32768,
                    "trainable": True,
                    "sampleable": True,
                }
            ],
            "supported_loss_fns": list(LOSS_NAMES),
        }
        assert [child.stderr.readline() for _ in range(4)] == [
            f"platoon: local Tinker server for platoon/toy at {base_url}\n",
            f"platoon: checkpoints in {tmp_path / 'state'}; Ctrl-C stops the server\n",
            f"platoon: TINKER_BASE_URL={base_url}\n",
            f"platoon: TINKER_API_KEY={key} (no other key works)\n",
        ]
        child.send_signal(signal.SIGINT)
        try:
            assert child.wait(timeout=20) == 0
        except subprocess.TimeoutExpired:
            child.send_signal(signal.SIGABRT)
            _, stderr = child.communicate(timeout=10)
            raise AssertionError(
                f"the server did not stop within 20 s of Ctrl-C; its threads:\n{stderr}"
            ) from None
    finally:
        child.kill()
    assert (tmp_path / "state" / "runs").is_dir()


@pytest.mark.parametrize("for_a_command", [False, True])
def test_the_banner_fits_a_100_column_terminal(for_a_command):
    from pathlib import Path

    from platoon.local_server import issue_api_key
    from platoon.local_server.process import banner

    lines = banner(
        model="Qwen/Qwen3-4B-Instruct-2507",
        base_url="http://127.0.0.1:41234",
        listening_on=None,
        directory=Path.home() / ".cache" / "platoon" / "local-tinker",
        issued_key=issue_api_key(),
        for_a_command=for_a_command,
    )
    assert [line for line in lines if len(f"platoon: {line}") > 100] == []
    assert "checkpoints in ~/.cache/platoon/local-tinker" in "\n".join(lines)
    # a server that `tinker_base_url: local` started: the command stops it and holds its key, so neither Ctrl-C
    # nor the key is the user's business
    assert len(lines) == (1 if for_a_command else 4)


def serve(*args: str) -> list[str]:
    """`python -m platoon tinker serve ARGS`, as a user runs it."""
    return [sys.executable, "-X", "faulthandler", "-m", "platoon", "tinker", "serve", *args]


@pytest.mark.parametrize(
    ("options", "said"),
    [
        (
            ["--host", "0.0.0.0"],
            "--host 0.0.0.0 listens beyond this machine, where anyone who can reach the port could train, save "
            "and delete weights: pass --api-key",
        ),
        (["--host", "192.0.2.7"], "--host 192.0.2.7 listens beyond this machine"),
        (["--host", "0.0.0.0", "--api-key", "tml-short"], "--api-key must hold at least 16 letters"),
        (["--api-key", "sk-0123456789abcdef0123"], "--api-key must start with tml-"),
    ],
)
def test_tinker_serve_refuses_to_listen_beyond_loopback_without_a_key(tmp_path, options, said):
    done = subprocess.run(
        serve("--dir", str(tmp_path / "state"), *options), capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 78
    assert done.stderr.splitlines() == [done.stderr.strip()], "one line"
    assert done.stderr.startswith(f"platoon: {said}"), done.stderr
    assert done.stdout == ""
    assert not (tmp_path / "state").exists()


def test_tinker_serve_on_every_address_prints_a_url_other_machines_can_use(tmp_path):
    key = "tml-shared-with-the-lab-0123456789"
    child = subprocess.Popen(
        serve("--dir", str(tmp_path / "state"), "--host", "0.0.0.0", "--api-key", key),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        assert child.stdout is not None and child.stderr is not None
        base_url = child.stdout.readline().strip()
        host = urlsplit(base_url).hostname
        assert host not in ("127.0.0.1", "0.0.0.0", "localhost", None), base_url
        banner = [child.stderr.readline() for _ in range(4)]
        assert (
            banner[0]
            == f"platoon: local Tinker server for platoon/toy, listening on 0.0.0.0:{urlsplit(base_url).port}\n"
        )
        assert banner[2] == f"platoon: TINKER_BASE_URL={base_url} (reachable by other machines)\n"
        assert key not in "".join(banner), "a key given on the command line is not repeated"
        url = f"{base_url}/api/v1/get_server_capabilities"
        assert httpx.get(url, headers={"X-API-Key": key}, timeout=10).status_code == 200
        assert httpx.get(url, headers={"X-API-Key": "tml-made-up"}, timeout=10).status_code == 401
        child.send_signal(signal.SIGINT)
        stdout, _ = child.communicate(timeout=60)
    finally:
        child.kill()
    assert child.returncode == 0
    assert stdout == "", "no key line: the caller gave the key"


def test_child_process_server_starts_and_stops(tmp_path):
    base_url, _, stop = start_local_server_process(state_dir=tmp_path)
    try:
        assert httpx.get(f"{base_url}/api/v1/healthz", timeout=10).json() == {"status": "ok"}
    finally:
        stop()
    try:
        httpx.get(f"{base_url}/api/v1/healthz", timeout=2)
    except httpx.ConnectError:
        pass
    else:
        raise AssertionError("the server still answers after stop()")


def test_a_child_that_built_the_model_stops_quietly(tmp_path, capfd):
    """The child has torch, transformers and triton loaded once a model is built: it stops without the interpreter's
    teardown, so nothing of triton's nanobind leak reports reaches the terminal the trainer prints to."""
    import tinker

    from platoon.gateway.tinker_service import close_session

    base_url, api_key, stop = start_local_server_process(state_dir=tmp_path)
    try:
        client = tinker.ServiceClient(base_url=base_url, api_key=api_key)
        try:
            tinker_sdk.made(client.create_lora_training_client(base_model="platoon/toy", rank=8))
        finally:
            close_session(client)
    finally:
        stop()
    assert "leaked" not in capfd.readouterr().err


def test_state_dir_defaults_to_the_site_cache(tmp_path, monkeypatch):
    profile = tmp_path / "site.yaml"
    profile.write_text(f"cache: {tmp_path / 'cache'}\n")
    monkeypatch.setenv("PLATOON_SITE", str(profile))
    assert default_state_dir() == tmp_path / "cache" / "local-tinker"


def test_missing_torch_is_one_line(run_python_no_torch):
    result = run_python_no_torch(
        """
        from platoon.testing import local_tinker_server
        try:
            with local_tinker_server():
                pass
        except ImportError as exc:
            print(exc)
        from platoon.cli import main
        raise SystemExit(main(["tinker", "serve"]))
        """
    )
    assert result.returncode == 1
    line = "the local Tinker-compatible server needs torch, which is not installed: pip install 'platoon-core[local]'"
    assert result.stdout == line + "\n"
    assert result.stderr == f"platoon: {line}\n"


def _run_python_no_torch(code: str) -> subprocess.CompletedProcess[str]:
    # `sys.modules["torch"] = None` makes every `import torch` raise ImportError, as on a machine without it.
    prelude = "import sys\nsys.modules['torch'] = None\n"
    return subprocess.run(
        [sys.executable, "-c", prelude + textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "TINKER_TELEMETRY": "0"},
    )


@pytest.fixture
def run_python_no_torch():
    return _run_python_no_torch
