"""`platoon prepare CONFIG` for Harbor entries: the dataset fetched into the site
cache, the images built into `<harbor cache>/images/docker.json`, the dataset check of the tasks without a verdict,
the toolchain and tokenizer steps, each with its line and skipped when done; the run that stops before any rollout
when images are missing; an interrupted prepare (SIGINT in the middle of a build) that the next prepare finishes.

Docker builds run against the private engine (.ci/docker-engine) and never skip; base image `platoon-test/busybox`.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from platoon import hooks, registry
from platoon.cli import main
from platoon.harness.registry import forget_loaded_specs
from platoon.hookspecs import PrepareStep
from platoon_harbor import images

BUSYBOX = "platoon-test/busybox"


def make_task(root: Path, name: str, dockerfile: str, files: dict[str, str]) -> Path:
    task = root / name
    (task / "environment").mkdir(parents=True)
    (task / "tests").mkdir()
    (task / "task.toml").write_text(f'[task]\nname = "{name}"\n')
    (task / "instruction.md").write_text(f"Do {name}.\n")
    (task / "tests" / "test.sh").write_text("#!/bin/sh\necho 1 > /logs/verifier/reward.txt\n")
    (task / "environment" / "Dockerfile").write_text(dockerfile)
    for path, text in files.items():
        (task / "environment" / path).write_text(text)
    return task


def docker(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["docker", *args], capture_output=True, text=True, timeout=120, check=False)


@pytest.fixture(scope="module", autouse=True)
def engine() -> None:
    if docker("info").returncode != 0 or docker("image", "inspect", BUSYBOX).returncode != 0:
        pytest.fail(
            f"no Docker engine with {BUSYBOX} answers at DOCKER_HOST={os.environ.get('DOCKER_HOST', '(unset)')}: "
            "run `.ci/docker-engine start` and source its env file",
            pytrace=False,
        )


@pytest.fixture
def site(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A project whose site profile puts the cache under tmp_path; the images built here are removed after."""
    profile = Path(os.environ["XDG_CONFIG_HOME"]) / "platoon" / "site.yaml"
    profile.parent.mkdir(parents=True, exist_ok=True)
    cache = tmp_path / "cache"
    profile.write_text(f"cache: {cache}\n")
    monkeypatch.chdir(tmp_path)
    yield cache
    found = cache / "harbor" / "images" / "docker.json"
    if found.is_file():
        docker("rmi", "-f", *(e["image"] for e in json.loads(found.read_text())["images"].values()))


@pytest.fixture
def builds(monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    calls: list[list[str]] = []
    real = images._run_build

    def counted(argv: list[str], env: dict[str, str], log: Path, timeout: float) -> int:
        calls.append(argv)
        return real(argv, env, log, timeout)

    monkeypatch.setattr(images, "_run_build", counted)
    return calls


SPEC = """name = "tiny-agent"
version = "1"

[install]
toolchain = "tiny-agent-1"

[install.recipe]
python = "3.12"
lock = "tiny.lock"

[launch]
argv = ["true"]
"""


@pytest.fixture
def toolchain(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """A TOML spec that names a toolchain, whose `toolchain.prepare` seam is answered here as platoon-harnesses
    would (its real builds are tests/harnesses/test_toolchains.py's): missing until built once, then current."""
    (tmp_path / "tiny.lock").write_text("")
    (tmp_path / "tiny.toml").write_text(SPEC)
    forget_loaded_specs()
    monkeypatch.setattr(registry, "_seams", {})
    state: dict[str, Any] = {"built": 0}

    def prepare(spec: Any, root: Any, dry_run: bool) -> PrepareStep:
        if state["built"]:
            return PrepareStep("toolchain tiny-agent-1", "current", "/toolchains/tiny-agent-1")
        if dry_run:
            return PrepareStep("toolchain tiny-agent-1", "missing", "would be built")
        state["built"] += 1
        return PrepareStep("toolchain tiny-agent-1", "done", "/toolchains/tiny-agent-1")

    hooks.register("toolchain.prepare", prepare)
    return state


CONFIG = """log_path: runs
tinker_base_url: local
train: {{model_name: platoon/toy, renderer_name: qwen3_instruct, max_training_steps: 1}}
environments:
  - name: tasks
    service: harbor
    service_kwargs: {{dataset: {dataset}}}
    harness: {harness}
"""


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, list[str], str]:
    code = main(argv)
    captured = capsys.readouterr()
    return code, captured.out.splitlines(), captured.err


def test_prepare_fetches_builds_and_then_finds_everything_current(tmp_path, site, builds, toolchain, capsys):
    dataset = tmp_path / "dataset"
    nonce = uuid.uuid4().hex
    for name in ("alpha", "beta"):
        make_task(
            dataset, name, f"FROM {BUSYBOX}\nCOPY data.txt /app/data.txt\n", {"data.txt": f"{name} {nonce}\n"}
        )
    Path("train.yaml").write_text(CONFIG.format(dataset=dataset, harness=tmp_path / "tiny.toml"))

    code, out, err = run(["prepare", "train.yaml", "--dry-run"], capsys)
    assert code == 1 and out[0].startswith("environments[tasks] dataset: missing: ")
    assert out[1:] == [
        "environments[tasks] images: missing: waits for the dataset",
        "environments[tasks] toolchain tiny-agent-1: missing: would be built",
        "policy tokenizer: current: platoon/toy (registered with platoon)",
        "not ready: 3 step(s) would make something (a dry run changes nothing)",
    ]
    assert not (site / "harbor").exists() and builds == []  # a dry run makes nothing

    code, out, err = run(["prepare", "train.yaml"], capsys)
    image_map = site / "harbor" / "images" / "docker.json"
    assert code == 0, err
    assert out[0].startswith("environments[tasks] dataset: done: ") and out[0].endswith(" (2/2 runnable)")
    # the dataset check ran on both tasks: neither has a solution, and their tests pass untouched
    check_file = next((site / "harbor" / "locks").glob("*.check.json"))
    checked = f"2 task(s) checked, 2 quarantined ({check_file})"
    assert out[1:] == [
        f"environments[tasks] images: done: 2 built, 0 already in {image_map}",
        f"environments[tasks] check: done: {checked}",
        "environments[tasks] toolchain tiny-agent-1: done: /toolchains/tiny-agent-1",
        "policy tokenizer: current: platoon/toy (registered with platoon)",
        "ready: 4 made now, 1 already current",
    ]
    assert "platoon: images: building 1/2 sha256:" in err and "platoon: images: building 2/2 sha256:" in err
    assert err.startswith(
        f"platoon: site profile {Path(os.environ['XDG_CONFIG_HOME'])}/platoon/site.yaml: cache "
    )
    recorded = json.loads(image_map.read_text())["images"]
    assert len(recorded) == 2 and {e["receipt"]["example_task"] for e in recorded.values()} == {
        "alpha",
        "beta",
    }
    calls = len(builds)

    # the second prepare makes nothing: no build runs, the map is not rewritten
    before = image_map.read_text()
    code, out, _ = run(["prepare", "train.yaml"], capsys)
    assert code == 0 and len(builds) == calls and image_map.read_text() == before
    assert out[1:] == [
        f"environments[tasks] images: current: 2 image(s) in {image_map}",
        f"environments[tasks] check: current: {checked}",
        "environments[tasks] toolchain tiny-agent-1: current: /toolchains/tiny-agent-1",
        "policy tokenizer: current: platoon/toy (registered with platoon)",
        "ready: 5 already current",
    ]

    # one task changes: the dataset is re-fetched (a local directory always is) and that task alone is rebuilt
    (dataset / "beta" / "environment" / "data.txt").write_text("beta, changed\n")
    code, out, err = run(["prepare", "train.yaml"], capsys)
    assert code == 0 and out[1] == f"environments[tasks] images: done: 1 built, 1 already in {image_map}"
    assert out[2] == f"environments[tasks] check: done: {checked}"  # beta alone, its content being new
    assert "platoon: check: 1/1 beta: quarantined" in err
    assert {argv[argv.index("-t") + 1] for argv in builds[calls:]} == {
        images.docker_tag(images.plan_task(dataset / "beta").key)
    }


def test_a_run_whose_images_are_not_built_stops_before_any_rollout_naming_prepare(
    tmp_path, site, builds, capsys
):
    dataset = tmp_path / "dataset"
    make_task(dataset, "alpha", f"FROM {BUSYBOX}\nCOPY data.txt /d\n", {"data.txt": uuid.uuid4().hex})
    Path("train.yaml").write_text(CONFIG.format(dataset=dataset, harness="platoon-oracle"))
    # not even fetched: the dataset says so
    code, out, err = run(["train", "train.yaml"], capsys)
    assert code == 78 and out == []
    assert (
        "platoon: what the run needs is not prepared on this site:\n  environments.0.service_kwargs: " in err
    )
    assert "is not fetched" in err and err.endswith("prepare it with: platoon prepare train.yaml\n")
    assert main(["config", "validate", "train.yaml"]) == 78  # the same check, before any run
    validated = capsys.readouterr().out
    assert "is not fetched" in validated and "  prepare it with: platoon prepare train.yaml\n" in validated
    # fetched, but its image is not built: a run never builds it
    assert main(["harbor", "fetch", "train.yaml"]) == 0
    capsys.readouterr()
    code, out, err = run(["train", "train.yaml", "train.max_training_steps=2"], capsys)
    assert code == 78 and out == [] and builds == []
    assert "1 task image(s) of the docker provider are not built" in err and "tasks alpha" in err
    assert err.endswith("prepare it with: platoon prepare train.yaml train.max_training_steps=2\n")
    assert not Path("runs").exists()
    # evaluation and a single rollout make the same check before anything runs
    Path("eval.yaml").write_text(
        "tinker_base_url: local\ninference: {model_name: platoon/toy, renderer_name: qwen3_instruct, output_dir: out}\n"
        f"environments: [{{service: harbor, service_kwargs: {{dataset: {dataset}}}, harness: platoon-oracle}}]\n"
    )
    for argv, config in (
        (["eval", "eval.yaml"], "eval.yaml"),
        (["rollout", "train.yaml", "--task", "alpha"], "train.yaml"),
    ):
        code, out, err = run(argv, capsys)
        assert code == 78 and "task image(s) of the docker provider are not built" in err, (argv, err)
        assert err.endswith(f"prepare it with: platoon prepare {config}\n")
    assert builds == [] and not Path("out").exists()


class _Gate(BaseHTTPRequestHandler):
    """The first request blocks until released (the build is then "in the middle"); later ones answer at once."""

    requested = threading.Event()
    release = threading.Event()

    def do_GET(self) -> None:
        first = not _Gate.requested.is_set()
        _Gate.requested.set()
        if first:
            _Gate.release.wait(300)
        body = b"open\n"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


def test_an_interrupted_prepare_leaves_what_the_next_one_finishes(tmp_path, site, capsys):
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Gate)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    _Gate.requested.clear()
    _Gate.release.clear()
    url = f"http://127.0.0.1:{server.server_address[1]}/gate"
    dataset = tmp_path / "dataset"
    make_task(
        dataset,
        "slow",
        f"FROM {BUSYBOX}\nCOPY nonce /nonce\nRUN wget -q -O /gate {url}\n",
        {"nonce": uuid.uuid4().hex},
    )
    Path("train.yaml").write_text(CONFIG.format(dataset=dataset, harness="platoon-oracle"))
    image_map = site / "harbor" / "images" / "docker.json"
    try:
        process = subprocess.Popen(
            [sys.executable, "-m", "platoon", "prepare", "train.yaml"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            # Ctrl-C as a terminal delivers it, whatever this process's own SIGINT disposition (an ignored signal
            # is inherited across exec, and Python then leaves it ignored)
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        )
        deadline = time.monotonic() + 120
        while not _Gate.requested.is_set():  # the build's RUN step is waiting on the gate: mid-build
            assert process.poll() is None, process.communicate()
            assert time.monotonic() < deadline, "the build never reached its RUN step"
            time.sleep(0.05)
        process.send_signal(signal.SIGINT)
        out, err = process.communicate(timeout=120)
        assert process.returncode == 130, (out, err)
        assert "images: building 1/1" in err and "ready" not in out
        # nothing half-made counts: the map has no entry, so the image is still "not built"
        assert not image_map.exists() or json.loads(image_map.read_text())["images"] == {}
        _Gate.release.set()
        code, out, err = run(["prepare", "train.yaml"], capsys)
        assert code == 0, err
        assert out[1] == f"environments[tasks] images: done: 1 built, 0 already in {image_map}"
        code, out, _ = run(["prepare", "train.yaml"], capsys)
        assert code == 0 and out[1] == f"environments[tasks] images: current: 1 image(s) in {image_map}"
    finally:
        _Gate.release.set()
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize(
    ("provider", "status", "detail"),
    [
        ("process", "done", "1 built, 0 already in "),
        ("singularity", "failed", "the oci builder is not available in this build"),
        (
            "acme.sandboxes:Provider",
            "failed",
            "platoon harbor images build c.yaml --builder docker --push REPO/NAME",
        ),
    ],
)
def test_the_images_step_follows_the_provider(
    tmp_path, builds, capsys, monkeypatch, provider, status, detail
):
    monkeypatch.chdir(tmp_path)
    make_task(tmp_path / "ds", "alpha", f"FROM {BUSYBOX}\nCOPY data.txt /d\n", {"data.txt": "a\n"})
    Path("c.yaml").write_text(
        "environments:\n  - service: harbor\n"
        f"    service_kwargs: {{dataset_dir: ds, image_map: maps/p.json, provider: '{provider}'}}\n"
    )
    code, out, _ = run(["prepare", "c.yaml"], capsys)
    assert code == (0 if status == "done" else 1) and builds == []
    assert out[1].startswith(f"environments[0] images: {status}: ") and detail in out[1], out[1]
    if provider == "process":  # the process provider runs tasks on the host: its keys are recorded as `local`
        recorded = json.loads((tmp_path / "maps" / "p.json").read_text())["images"]
        assert [(e["image"], e["builder"]) for e in recorded.values()] == [("local", "alias")]
        assert run(["prepare", "c.yaml"], capsys)[1][1].startswith(
            "environments[0] images: current: 1 image(s)"
        )
