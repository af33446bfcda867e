"""`platoon tinker serve`, the child-process server, the state directory default, the numpy engine without torch
and the torch engine's missing-torch error."""

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


def test_the_torch_engine_without_torch_is_one_line_naming_the_extra(run_python_no_torch):
    result = run_python_no_torch(
        """
        from platoon.errors import ConfigError
        from platoon.testing import local_tinker_server
        try:
            with local_tinker_server(engine="torch"):
                pass
        except ConfigError as exc:
            print(exc, exc.exit_code)
        from platoon.cli import main
        raise SystemExit(main(["tinker", "serve", "--engine", "torch"]))
        """
    )
    missing = (
        "the local server's torch engine needs torch and transformers, which are not installed: "
        "pip install 'platoon-core[local-torch]' (or use the numpy engine)"
    )
    assert result.returncode == 78
    assert result.stdout == f"the local server's engine: {missing} 78\n"
    assert result.stderr == f"platoon: --engine: {missing}\n"


def test_the_numpy_engine_trains_samples_and_checkpoints_without_torch(run_python_no_torch, tmp_path):
    """The default engine through the real SDK, in a process where torch and transformers cannot be imported."""
    result = run_python_no_torch(
        f"""
        import tinker
        from tinker import types

        from platoon.gateway.tinker_service import close_session
        from platoon.testing import local_tinker_server

        tokens = [257, *b"user\\nPick a letter.", 258, 10, 257, *b"assistant\\n", 66]
        datum = types.Datum(
            model_input=types.ModelInput.from_ints(tokens[:-1]),
            loss_fn_inputs={{"target_tokens": tokens[1:], "weights": [1.0] * (len(tokens) - 1)}},
        )
        with local_tinker_server(state_dir={str(tmp_path)!r}) as server:
            client = tinker.ServiceClient(base_url=server.base_url, api_key=server.api_key)
            training = client.create_lora_training_client(base_model="platoon/toy", rank=8)
            losses = []
            for _ in range(3):
                out = training.forward_backward([datum], "cross_entropy").result()
                losses.append(out.metrics["loss:sum"])
                training.optim_step(types.AdamParams(learning_rate=0.01)).result()
            state = training.save_state("after-3").result().path
            sampler = training.save_weights_and_get_sampling_client("sampler-3")
            sampled = sampler.sample(
                types.ModelInput.from_ints(tokens[:-1]), 2, types.SamplingParams(max_tokens=4, seed=1)
            ).result()
            resumed = client.create_training_client_from_state_with_optimizer(state)
            again = resumed.forward_backward([datum], "cross_entropy").result().metrics["loss:sum"]
            close_session(client)
        import sys
        print(losses[0] > losses[1] > losses[2], abs(again - losses[2]) < abs(losses[2] - losses[1]))
        print([len(s.tokens) for s in sampled.sequences], state.startswith("tinker://"))
        print(sorted(name for name in ("torch", "transformers") if name in sys.modules))
        """
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == ["True True", "[4, 4] True", "[]"]


def _run_python_no_torch(code: str) -> subprocess.CompletedProcess[str]:
    # A finder ahead of every other that refuses torch and transformers: every import of them fails, and looking
    # them up finds nothing, as on a machine without them.
    prelude = textwrap.dedent(
        """
        import sys

        class RefuseTorch:
            def find_spec(self, name, path=None, target=None):
                if name.partition(".")[0] in ("torch", "transformers"):
                    raise ModuleNotFoundError(f"No module named {name!r}")
                return None

        sys.meta_path.insert(0, RefuseTorch())
        """
    )
    return subprocess.run(
        [sys.executable, "-c", prelude + textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "TINKER_TELEMETRY": "0", "HF_HUB_OFFLINE": "1"},
    )


@pytest.fixture
def run_python_no_torch():
    return _run_python_no_torch
