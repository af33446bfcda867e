"""Harbor task images: build plans and keys, built once per site with the real docker CLI against
the private engine (.ci/docker-engine), never rebuilt while unchanged, a changed task rebuilt alone, `ADD` of a URL
and of a git repository served from this machine, both builders, and `platoon harbor images`.

The Docker tests never skip: a machine without an engine fails them with one line saying how to start it. Base
images are the locally built `platoon-test/busybox`; nothing is pulled. Every task holds a random file, so its key is
this test's own, and the images a test built are removed after it.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import threading
import uuid
from collections.abc import Iterator
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from platoon.cli import main
from platoon.envs.service import EnvNotPrepared
from platoon_harbor import images

BUSYBOX = "platoon-test/busybox"


def make_task(
    root: Path, name: str, dockerfile: str | None, files: dict[str, str] | None = None, **toml: str
) -> Path:
    task = root / name
    (task / "environment").mkdir(parents=True)
    (task / "tests").mkdir()
    environment = "".join(f'{key} = "{value}"\n' for key, value in toml.items())
    (task / "task.toml").write_text(
        f'[task]\nname = "{name}"\n' + (f"[environment]\n{environment}" if toml else "")
    )
    (task / "instruction.md").write_text(f"Do {name}.\n")
    (task / "tests" / "test.sh").write_text("#!/bin/sh\necho 1 > /logs/verifier/reward.txt\n")
    if dockerfile is not None:
        (task / "environment" / "Dockerfile").write_text(dockerfile)
    for path, text in (files or {}).items():
        (task / "environment" / path).parent.mkdir(parents=True, exist_ok=True)
        (task / "environment" / path).write_text(text)
    return task


SIMPLE = f"FROM {BUSYBOX}\nCOPY hello.txt /app/hello.txt\nWORKDIR /app\n"


# ------------------------------------------------------------------------------------------ plans (no Docker)


def test_equal_tasks_share_a_key_and_any_change_to_what_the_build_reads_is_a_new_key(tmp_path):
    a = make_task(tmp_path, "a", SIMPLE, {"hello.txt": "hi\n"})
    b = make_task(tmp_path, "b", SIMPLE, {"hello.txt": "hi\n"})
    plans, keys = images.plan_tasks([a, b])
    assert plans[0].key == plans[1].key and plans[0].key.startswith("sha256:")
    assert [(k.kind, k.tasks, k.bases) for k in keys.values()] == [("shared", ["a", "b"], (BUSYBOX,))]
    key = plans[0].key

    def key_of(task: Path) -> str | None:
        return images.plan_task(task).key

    # the Dockerfile is a file of the context too (`COPY . /app` copies it): even a new comment is a new key
    (b / "environment" / "Dockerfile").write_text("# a comment\n\n" + SIMPLE)
    assert key_of(b) not in (None, key)
    (b / "environment" / "Dockerfile").write_text(SIMPLE)
    assert key_of(b) == key
    (b / "environment" / "hello.txt").write_text("hello\n")
    assert key_of(b) not in (None, key)
    (b / "environment" / "hello.txt").write_text("hi\n")
    (b / "environment" / "hello.txt").chmod(0o755)  # the executable bit is content too
    assert key_of(b) not in (None, key)
    (b / "environment" / "hello.txt").chmod(0o644)
    assert key_of(b) == key
    (b / "environment" / "notes" / "x").parent.mkdir()
    (b / "environment" / "notes" / "x").write_text("a file the Dockerfile does not name is still context\n")
    assert key_of(b) not in (None, key)
    shutil.rmtree(b / "environment" / "notes")
    (b / "environment" / ".dockerignore").write_text("*.md\n")
    assert key_of(b) not in (None, key)
    (b / "environment" / ".dockerignore").unlink()
    (b / "environment" / "Dockerfile").write_text(SIMPLE + "ENV X=1\n")
    assert key_of(b) not in (None, key)


def test_plan_kinds_refusals_and_remote_sources(tmp_path):
    prebuilt = images.plan_task(make_task(tmp_path, "prebuilt", None, docker_image="python:3.12-slim"))
    assert (prebuilt.kind, prebuilt.ref, prebuilt.key) == ("prebuilt", "python:3.12-slim", None)
    assert images.plan_task(make_task(tmp_path, "bare", None)).kind == "none"
    heredoc = images.plan_task(
        make_task(
            tmp_path, "heredoc", f"FROM {BUSYBOX}\nRUN <<EOF\necho one\necho two\nEOF\nCOPY \\\n  a /a\n"
        )
    )
    assert heredoc.problem is None and heredoc.key
    refused = {
        "copy-url": f"FROM {BUSYBOX}\nCOPY https://example.org/x /x\n",
        "no-from": "RUN echo hi\n",
        "frontend": f"# syntax=acme/frontend:1\nFROM {BUSYBOX}\n",
        "unknown": f"FROM {BUSYBOX}\nFROBNICATE x\n",
        "heredoc": f"FROM {BUSYBOX}\nRUN <<EOF\necho never ends\n",
    }
    for name, text in refused.items():
        plan = images.plan_task(make_task(tmp_path / "refused", name, text))
        assert plan.key is None and plan.problem and plan.problem.startswith("image: "), name
    # Docker's own 1.x frontend is accepted (and dropped when building: it would be pulled)
    assert images.plan_task(
        make_task(tmp_path, "syntax", f"# syntax=docker/dockerfile:1.4\nFROM {BUSYBOX}\n")
    ).key
    assert images.classify_source("https://example.org/repo.git#main:sub") == "git"
    assert images.classify_source("git@github.com:org/repo") == "git"
    assert images.classify_source("git://host/repo") == "git"
    assert images.classify_source("https://example.org/file.tar.gz") == "url"
    assert images.classify_source("github.com/org/repo") == "context"
    assert images.classify_source("ftp://host/file") == "context"
    remote = images.plan_task(
        make_task(
            tmp_path, "remote", f"FROM {BUSYBOX}\nARG REF=main\nADD https://example.org/r.git#${{REF}} /src\n"
        )
    )
    assert [(r.kind, r.source) for r in remote.remotes] == [("git", "https://example.org/r.git#main")]
    record = images.plan_for_lock(tmp_path / "remote")
    assert record["kind"] == "per_task" and record["key"] == remote.key and record["base"] == BUSYBOX
    assert record["deferred"] == [] and record["notes"] == ["ADD git https://example.org/r.git#main"]
    assert images.plan_for_lock(tmp_path / "refused" / "no-from")["refused"].startswith("image: ")


def test_image_for_never_builds(tmp_path):
    task = make_task(tmp_path, "a", SIMPLE, {"hello.txt": "hi\n"})
    with pytest.raises(EnvNotPrepared) as caught:
        images.image_for(task, "docker", tmp_path / "cache")
    assert caught.value.failure_kind == "env_config" and "platoon prepare" in caught.value.message
    assert not (tmp_path / "cache").exists()
    prebuilt = make_task(tmp_path, "p", None, docker_image="acme/image:1")
    assert images.image_for(prebuilt, "docker", tmp_path / "cache") == "acme/image:1"
    assert images.image_for(make_task(tmp_path, "n", None), "docker", default="base:1") == "base:1"
    with pytest.raises(EnvNotPrepared):
        images.image_for(make_task(tmp_path, "m", None), "docker")


# --------------------------------------------------------------------------------------------- with Docker


def docker(*args: str, binary: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [binary or "docker", *args], capture_output=True, text=True, timeout=120, check=False
    )


@pytest.fixture(scope="module", autouse=True)
def engine() -> None:
    if docker("info").returncode != 0 or docker("image", "inspect", BUSYBOX).returncode != 0:
        pytest.fail(
            f"no Docker engine with {BUSYBOX} answers at DOCKER_HOST={os.environ.get('DOCKER_HOST', '(unset)')}: "
            "run `.ci/docker-engine start` and source its env file",
            pytrace=False,
        )


@pytest.fixture
def builds(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[list[str]]]:
    """Every `docker build` the builder runs (the evidence that nothing was rebuilt); built images removed after."""
    calls: list[list[str]] = []
    real = images._run_build

    def counted(argv: list[str], env: dict[str, str], log: Path, timeout: float) -> int:
        calls.append(argv)
        return real(argv, env, log, timeout)

    monkeypatch.setattr(images, "_run_build", counted)
    yield calls
    tags = {argv[argv.index("-t") + 1] for argv in calls}
    if tags:
        docker("rmi", "-f", *tags)


def tags(calls: list[list[str]]) -> set[str]:
    return {argv[argv.index("-t") + 1] for argv in calls}


def nonce() -> dict[str, str]:
    return {"nonce.txt": uuid.uuid4().hex}


def test_built_once_never_rebuilt_and_a_changed_task_rebuilt_alone(tmp_path, builds):
    a = make_task(tmp_path, "a", SIMPLE, {"hello.txt": "from a\n", **nonce()})
    b = make_task(tmp_path, "b", SIMPLE, {"hello.txt": "from b\n", **nonce()})
    image_map = images.ImageMap(tmp_path / "maps" / "docker.json")
    _, keys = images.plan_tasks([a, b])
    results = images.build_keys(list(keys.values()), image_map, builder="docker")
    assert [r.status for r in results] == ["built", "built"] and len(tags(builds)) == 2
    calls = len(builds)  # (a client without BuildKit tries it once, then builds with the classic builder)
    recorded = image_map.read()
    assert set(recorded) == set(keys)
    entry = recorded[images.plan_task(a).key]
    assert entry["image"] == images.docker_tag(images.plan_task(a).key) and entry["builder"] == "docker"
    assert (
        entry["workdir"] == "/app" and "PATH=/bin" in entry["env"] and entry["sha256"].startswith("sha256:")
    )
    assert entry["receipt"]["example_task"] == "a" and entry["receipt"]["bases"] == [BUSYBOX]
    assert Path(entry["receipt"]["log"]).is_file()
    tag = images.image_for(a, "docker", image_map=image_map.path)
    assert docker("run", "--rm", "--network", "none", tag, "cat", "/app/hello.txt").stdout == "from a\n"

    # unchanged: no build command runs again, and the map is not rewritten
    before = image_map.path.read_text()
    again = images.build_keys(list(images.plan_tasks([a, b])[1].values()), image_map, builder="docker")
    assert [r.status for r in again] == ["skipped", "skipped"] and len(builds) == calls
    assert image_map.path.read_text() == before

    # b changes: only b's key is new, only it is built; a's entry stays as it was
    (b / "environment" / "hello.txt").write_text("from b, changed\n")
    _, keys = images.plan_tasks([a, b])
    missing = [k for k in keys.values() if k.key not in images.present_keys(image_map.read(), keys)]
    assert [k.tasks for k in missing] == [["b"]]
    images.build_keys(missing, image_map, builder="docker")
    assert tags(builds[calls:]) == {images.docker_tag(missing[0].key)}
    assert image_map.read()[images.plan_task(a).key] == entry
    tag = images.image_for(b, "docker", image_map=image_map.path)
    assert (
        docker("run", "--rm", "--network", "none", tag, "cat", "/app/hello.txt").stdout == "from b, changed\n"
    )

    # an image removed from the engine no longer counts as present, so the next prepare builds it again
    docker("rmi", "-f", entry["image"])
    assert images.present_keys(image_map.read(), [images.plan_task(a).key]) == set()


class _Quiet(SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """A local HTTP server over a folder holding a file and a bare git repository (git's "dumb" HTTP protocol)."""
    root = tmp_path / "served"
    root.mkdir()
    (root / "file.txt").write_text("fetched by url\n")
    work = tmp_path / "repo"
    work.mkdir()
    (work / "sub").mkdir()
    (work / "sub" / "g.txt").write_text("fetched by git\n")
    git = ["git", "-c", "user.email=t@example.org", "-c", "user.name=t", "-c", "init.defaultBranch=main"]
    for args in (["init", "-q"], ["add", "."], ["commit", "-qm", "one"]):
        subprocess.run([*git, "-C", str(work), *args], check=True)
    subprocess.run([*git, "clone", "-q", "--bare", str(work), str(root / "repo.git")], check=True)
    subprocess.run(["git", "-C", str(root / "repo.git"), "update-server-info"], check=True)
    server = ThreadingHTTPServer(("127.0.0.1", 0), partial(_Quiet, directory=str(root)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", root
    finally:
        server.shutdown()
        server.server_close()


REMOTE = (
    "FROM " + BUSYBOX + "\n"
    "ADD {url}/file.txt /data/file.txt\n"
    "ADD {url}/repo.git#main:sub /data/repo\n"
    "RUN cat /data/file.txt /data/repo/g.txt > /data/both.txt\n"
)


@pytest.mark.parametrize(
    ("binary", "buildkit", "mode"),
    [("/usr/bin/docker", None, "buildkit"), ("docker", "0", "classic")],
    ids=["buildkit-debian-client", "classic"],
)
def test_add_of_a_url_and_of_a_git_repository(tmp_path, builds, served, monkeypatch, binary, buildkit, mode):
    if not shutil.which(binary):
        pytest.fail(f"{binary} is not installed (apt-get install docker.io)", pytrace=False)
    monkeypatch.setenv("PLATOON_DOCKER", binary)
    if buildkit is None:
        monkeypatch.delenv("DOCKER_BUILDKIT", raising=False)
    else:
        monkeypatch.setenv("DOCKER_BUILDKIT", buildkit)
    url, _ = served
    task = make_task(tmp_path, "remote", REMOTE.format(url=url), nonce())
    image_map = images.ImageMap(tmp_path / "docker.json")
    _, keys = images.plan_tasks([task])
    [result] = images.build_keys(list(keys.values()), image_map, builder="docker")
    assert result.status == "built", result.detail
    assert result.entry is not None and result.entry["receipt"]["builder_version"].endswith(mode)
    tag = images.image_for(task, "docker", image_map=image_map.path)
    shown = docker(
        "run", "--rm", "--network", "none", tag, "sh", "-c", "cat /data/both.txt; ls -a /data/repo"
    )
    assert shown.stdout == "fetched by url\nfetched by git\n.\n..\ng.txt\n"  # the clone's .git is not copied


def test_a_failed_build_is_reported_with_its_log_and_recorded_nowhere(tmp_path, builds):
    task = make_task(tmp_path, "broken", f"FROM {BUSYBOX}\nRUN exit 3\n", nonce())
    image_map = images.ImageMap(tmp_path / "docker.json")
    [result] = images.build_keys(list(images.plan_tasks([task])[1].values()), image_map, builder="docker")
    assert result.status == "failed" and "docker build failed" in result.detail and ".log" in result.detail
    assert image_map.read() == {}
    with pytest.raises(images.ImageError, match="oci builder is not available"):
        images.build_keys([], image_map, builder="oci")


@pytest.mark.slow
@pytest.mark.guarantee(
    "A task image's build fails",
    "Harbor images, classic Docker builder",
    "one line naming the log; no container, no step image, no scratch directory left",
)
def test_a_failed_classic_build_leaves_nothing_behind_and_says_so_in_one_line(
    tmp_path, builds, capsys, monkeypatch
):
    monkeypatch.setenv("DOCKER_BUILDKIT", "0")
    marker = uuid.uuid4().hex  # names this build's steps among whatever else the shared engine runs
    make_task(tmp_path / "ds", "broken", f"FROM {BUSYBOX}\nRUN echo {marker} > /step\nRUN test -z {marker}\n")
    Path(tmp_path / "c.yaml").write_text(
        "environments:\n  - service: harbor\n    service_kwargs: {dataset_dir: ds, image_map: maps/docker.json}\n"
    )
    monkeypatch.chdir(tmp_path)
    scratch = tmp_path / "scratch"
    assert main(["harbor", "images", "build", "c.yaml", "--scratch", str(scratch)]) == 1
    [line] = capsys.readouterr().out.splitlines()
    assert "  failed  docker build failed (1)" in line and "returned a non-zero code: 1" in line
    log = Path(line.split("; log ")[1].split(":", 1)[0])
    output = log.read_text()
    # the first RUN made an image and the second a container before it failed: both are gone again
    [step_image] = re.findall(r"Removing intermediate container \S+\n ---> ([0-9a-f]{12})", output)
    assert docker("image", "inspect", step_image).returncode != 0
    containers = docker("ps", "-a", "--no-trunc", "--format", "{{.ID}} {{.Command}}").stdout
    assert marker not in containers
    assert tags(builds) and docker("image", "inspect", *tags(builds)).returncode != 0  # nothing tagged
    assert list(scratch.iterdir()) == []  # the staged context is gone
    assert not (tmp_path / "maps" / "docker.json").exists()  # nothing recorded


# ------------------------------------------------------------------------------------ platoon harbor images


def test_images_commands_plan_build_verify_alias(tmp_path, builds, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    make_task(tmp_path / "ds", "a", SIMPLE, {"hello.txt": "a\n", **nonce()})
    make_task(tmp_path / "ds", "b", SIMPLE, {"hello.txt": "b\n", **nonce()})
    make_task(tmp_path / "ds", "p", None, docker_image="acme/prebuilt:1")
    Path("c.yaml").write_text(
        "environments:\n  - service: harbor\n    service_kwargs: {dataset_dir: ds, image_map: maps/docker.json}\n"
    )
    assert main(["harbor", "images", "plan", "c.yaml", "--json-output"]) == 0
    planned = json.loads(capsys.readouterr().out)
    rows = sorted((r["kind"], r["tasks"], r["in_map"], r["example_task"]) for r in planned["keys"])
    assert rows == [("per_task", 1, False, "a"), ("per_task", 1, False, "b")]
    assert planned["summary"][0] | {"map": None} == {
        "environment": "environments[0]",
        "map": None,
        "provider": "docker",
        "tasks": 3,
        "keys": 2,
        "shared": 0,
        "in_map": 0,
        "prebuilt": 1,
        "none": 0,
        "refused": 0,
    }
    assert main(["harbor", "images", "verify", "c.yaml"]) == 1
    assert capsys.readouterr().out.count("  missing  ") == 2
    # shard 1/2 builds the second key of the sorted list only
    assert main(["harbor", "images", "build", "c.yaml", "--shard", "1/2"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 1 and "  built  platoon-harbor:" in out[0] and len(tags(builds)) == 1
    assert main(["harbor", "images", "build", "c.yaml"]) == 0
    assert len(capsys.readouterr().out.splitlines()) == 1 and len(tags(builds)) == 2
    calls = len(builds)
    assert main(["harbor", "images", "build", "c.yaml"]) == 0  # nothing left to build
    assert capsys.readouterr().out == "" and len(builds) == calls
    assert main(["harbor", "images", "verify", "c.yaml"]) == 0
    assert capsys.readouterr().out.count("  ok  platoon-harbor:") == 2
    assert main(["harbor", "images", "plan", "c.yaml"]) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[0].split() == ["key", "role", "kind", "tasks", "bases", "in", "map", "example", "task"]
    assert table[-1].startswith("environments[0]: 2 key(s) (0 shared) for 3 task(s), 2 in the map ")
    # --key forces a rebuild of that key alone
    key = json.loads((tmp_path / "maps" / "docker.json").read_text())["images"]
    first = sorted(key)[0]
    assert main(["harbor", "images", "build", "c.yaml", "--key", first]) == 0
    assert tags(builds[calls:]) == {images.docker_tag(first)}
    assert capsys.readouterr().out.startswith(first[:19] + "  built")
    assert main(["harbor", "images", "build", "c.yaml", "--push", "acme/x"]) == 64
    capsys.readouterr()

    # alias: a process-provider map records the keys as `local`
    assert (
        main(["harbor", "images", "alias", "c.yaml", "--image", "local", "--image-map", "maps/process.json"])
        == 0
    )
    aliased = json.loads((tmp_path / "maps" / "process.json").read_text())["images"]
    assert sorted(aliased) == sorted(key) and {e["image"] for e in aliased.values()} == {"local"}
    assert main(["harbor", "images", "verify", "c.yaml", "--image-map", "maps/process.json"]) == 0
    assert "not checked" in capsys.readouterr().err

    # --key takes a key back exactly as `plan` prints it (and in full): the printed prefix round-trips
    shown = [line.split()[0] for line in table[1:-1] if line.startswith("sha256:")]
    assert len(shown) == 2 and all(len(k) < len(first) for k in shown)
    alias = ["harbor", "images", "alias", "c.yaml", "--image", "local", "--image-map"]
    assert main([*alias, "maps/one.json", "--key", shown[1]]) == 0
    assert capsys.readouterr().out == f"{shown[1]}  alias  local\n"
    [full] = json.loads((tmp_path / "maps" / "one.json").read_text())["images"]
    assert full.startswith(shown[1]) and full in key
    assert main([*alias, "maps/one.json", "--key", full, "--key", shown[1].removeprefix("sha256:")]) == 0
    assert capsys.readouterr().out == f"{shown[1]}  alias  local\n"  # the same key named twice, aliased once
    for wrong in ("sha256:" + "0" * 12, "sha256:"):
        assert main([*alias, "maps/one.json", "--key", wrong]) == 64
        [line] = capsys.readouterr().err.splitlines()
        assert f"--key {wrong} is not a build key of these tasks" in line


def test_a_separate_verifier_built_from_tests_dockerfile(tmp_path, builds):
    task = make_task(tmp_path, "v", SIMPLE, {"hello.txt": "main\n", **nonce()})
    (task / "task.toml").write_text('[task]\nname = "v"\n[verifier]\nenvironment_mode = "separate"\n')
    (task / "tests" / "Dockerfile").write_text(f"FROM {BUSYBOX}\nCOPY test.sh /tests/test.sh\n")
    plans, keys = images.plan_tasks([task])
    assert [(p.task.role, p.kind) for p in plans] == [("environment", "build"), ("verifier", "build")]
    assert {k.example.task.role for k in keys.values()} == {"environment", "verifier"}
    image_map = images.ImageMap(tmp_path / "docker.json")
    with pytest.raises(EnvNotPrepared, match="its verifier image"):
        images.image_for(task, "docker", image_map=image_map.path, role="verifier")
    results = images.build_keys(list(keys.values()), image_map, builder="docker")
    assert [r.status for r in results] == ["built", "built"]
    assert sorted(e["receipt"]["role"] for e in image_map.read().values()) == ["environment", "verifier"]
    tag = images.image_for(task, "docker", image_map=image_map.path, role="verifier")
    assert tag != images.image_for(task, "docker", image_map=image_map.path)
    shown = docker("run", "--rm", "--network", "none", tag, "cat", "/tests/test.sh").stdout
    assert shown == "#!/bin/sh\necho 1 > /logs/verifier/reward.txt\n"
    # a shared verifier, or one naming its own image, builds nothing of its own
    (task / "task.toml").write_text('[task]\nname = "v"\n[verifier.environment]\ndocker_image = "acme/v:1"\n')
    assert [p.task.role for p in images.plan_tasks([task])[0]] == ["environment"]
    (task / "task.toml").write_text('[task]\nname = "v"\n')
    assert images.verifier_source(task) is None
