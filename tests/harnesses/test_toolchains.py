"""Toolchains: real builds with `platoon toolchain build`, the manifest and tree hash,
the no-op / stale / interrupted rules, builds serialized on the flock, list and verify, the run-start refusal, the
prepare step and staging.

This machine cannot download CPython (python-build-standalone is unreachable), so the builds use `--uv` with a
small wrapper (`--uv` exists for such machines). The wrapper fakes ONE step, `uv python install`: it makes the
directory uv would make (`cpython-<version>-linux-x86_64-gnu` with `bin/python3`, next to uv's `.lock`, `.temp`
and the minor-version symlink) as a venv of the interpreter running the tests. Every other subcommand goes to the
real uv: `uv pip install --require-hashes` installs wheels built here from a local directory (`--offline
--no-index --find-links`). The tiktoken cache step runs for real against a small stand-in `tiktoken` package
(the real one downloads its encodings, which cannot happen here).
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import shutil
import stat
import subprocess
import sys
import textwrap
import threading
import time
import zipfile
from pathlib import Path
from typing import Any

import pytest

from platoon.cli import main
from platoon.harness.registry import forget_loaded_specs
from platoon.harness.spec import load_spec
from platoon.harness.toolchains import prepare_toolchain, toolchain_problems
from platoon_harnesses import toolchains

PYTHON = f"{sys.version_info.major}.{sys.version_info.minor}"
REAL_UV = shutil.which("uv")
pytestmark = pytest.mark.skipif(REAL_UV is None and not os.environ.get("CI"), reason="needs uv on PATH")

WRAPPER = '''#!{python}
"""A `uv` for tests: `python install` makes a local interpreter's venv where uv would put CPython; the rest is uv."""
import json, os, subprocess, sys, time
from pathlib import Path

HERE = Path(__file__).parent
REAL_UV, WHEELS, BASE = {real_uv!r}, {wheels!r}, {base!r}
args = sys.argv[1:]
with open(HERE / "calls.jsonl", "a") as log:
    keep = ("HOME", "TIKTOKEN_CACHE_DIR", "LITELLM_LOCAL_MODEL_COST_MAP", "OPENHANDS_SUPPRESS_BANNER", "UV_PYTHON")
    log.write(json.dumps({{"argv": args, "env": {{k: os.environ.get(k) for k in keep}}}}) + "\\n")
if args[:2] == ["python", "install"]:
    (HERE / "started").touch()
    while (HERE / "hold").exists():  # a test holds the build here to start a second one
        time.sleep(0.01)
    wanted, install_dir = args[2], Path(args[args.index("--install-dir") + 1])
    found = subprocess.run([BASE, "-c", "import platform; print(platform.python_version())"],
                           capture_output=True, text=True, check=True).stdout.strip()
    if not (HERE / "any-version").exists() and found.split(".")[: len(wanted.split("."))] != wanted.split("."):
        print(f"error: No download found for request: cpython-{{wanted}}-linux-x86_64-gnu", file=sys.stderr)
        sys.exit(2)
    install_dir.mkdir(parents=True, exist_ok=True)
    (install_dir / ".lock").touch()
    (install_dir / ".temp").mkdir(exist_ok=True)
    made = install_dir / f"cpython-{{found}}-linux-x86_64-gnu"
    subprocess.run([BASE, "-m", "venv", "--without-pip", str(made)], check=True)
    minor = ".".join(found.split(".")[:2])
    (install_dir / f"cpython-{{minor}}-linux-x86_64-gnu").symlink_to(made.name)
    sys.exit(0)
if args[:2] == ["pip", "install"]:
    args += ["--offline", "--no-index", "--find-links", WHEELS]
os.execv(REAL_UV, [REAL_UV, *args])
'''

TINYAGENT = {
    "tinyagent/__init__.py": "VERSION = '1.0'\n",
    "tinyagent/__main__.py": "import sys\nprint('tinyagent says', ' '.join(sys.argv[1:]))\n",
}
# The stand-in for tiktoken: get_encoding writes where TIKTOKEN_CACHE_DIR says, as the real one caches there.
FAKE_TIKTOKEN = {
    "tiktoken/__init__.py": textwrap.dedent(
        """
        import os
        def get_encoding(name):
            folder = os.environ["TIKTOKEN_CACHE_DIR"]
            os.makedirs(folder, exist_ok=True)
            with open(os.path.join(folder, name + ".tiktoken"), "w") as f:
                f.write("encoding " + name)
        """
    ),
}


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def _wheel(folder: Path, name: str, version: str, files: dict[str, str]) -> Path:
    dist = f"{name}-{version}.dist-info"
    contents = {path: text.encode() for path, text in files.items()}
    contents[f"{dist}/METADATA"] = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n".encode()
    contents[f"{dist}/WHEEL"] = (
        b"Wheel-Version: 1.0\nGenerator: tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    )
    record = "".join(f"{p},sha256={_b64(d)},{len(d)}\n" for p, d in contents.items()) + f"{dist}/RECORD,,\n"
    contents[f"{dist}/RECORD"] = record.encode()
    path = folder / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as archive:
        for member, data in contents.items():
            archive.writestr(zipfile.ZipInfo(member, (2024, 1, 1, 0, 0, 0)), data)
    return path


def _locked(wheel: Path, name: str, version: str) -> str:
    return f"{name}=={version} --hash=sha256:{hashlib.sha256(wheel.read_bytes()).hexdigest()}\n"


@pytest.fixture(scope="module")
def wheels(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    folder = tmp_path_factory.mktemp("wheels")
    agent = _wheel(folder, "tinyagent", "1.0", TINYAGENT)
    tiktoken = _wheel(folder, "tiktoken", "0.0.1", FAKE_TIKTOKEN)
    return {
        "dir": folder,
        "agent": _locked(agent, "tinyagent", "1.0"),
        "tiktoken": _locked(tiktoken, "tiktoken", "0.0.1"),
    }


@pytest.fixture
def uv(tmp_path: Path, wheels: dict[str, Any]) -> Path:
    """The wrapper uv (its folder also holds `calls.jsonl`, the log of every call)."""
    folder = tmp_path / "fake-uv"
    folder.mkdir()
    script = folder / "uv"
    script.write_text(
        WRAPPER.format(python=sys.executable, real_uv=REAL_UV, wheels=str(wheels["dir"]), base=sys.executable)
    )
    script.chmod(0o755)
    return script


def _calls(uv: Path) -> list[dict[str, Any]]:
    log = uv.parent / "calls.jsonl"
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def _installs(uv: Path) -> list[dict[str, Any]]:
    return [c for c in _calls(uv) if c["argv"][:2] == ["python", "install"]]


SPEC = """
name = "tiny-agent"
version = "1"

[install]
toolchain = "tiny-agent-1"

[install.recipe]
python = "{python}"
lock = "tiny.lock"
{extra}

[launch]
argv = ["{{toolchain}}/bin/python3", "-m", "tinyagent", "{{instruction}}"]
"""

GENERATE = "import json, sys\nwith open(sys.argv[1], 'w') as f:\n    json.dump({'generated': True}, f)\n"


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, wheels: dict[str, Any]) -> Path:
    """A spec with a recipe (lock + generate script), and a site profile whose cache is in tmp_path."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("PLATOON_TOOLCHAINS", raising=False)
    monkeypatch.delenv("PLATOON_TOOLCHAIN_CACHE", raising=False)
    monkeypatch.setenv("PLATOON_NODE_SCRATCH", str(tmp_path / "scratch"))
    (tmp_path / "site.yaml").write_text(f"cache: {tmp_path / 'cache'}\n")
    monkeypatch.setenv("PLATOON_SITE", str(tmp_path / "site.yaml"))
    specs = tmp_path / "specs"
    specs.mkdir()
    _write_spec(specs, extra='generate = { "share/tiny/config.json" = "gen_config.py" }')
    (specs / "tiny.lock").write_text(wheels["agent"])
    (specs / "gen_config.py").write_text(GENERATE)
    forget_loaded_specs()
    yield tmp_path
    forget_loaded_specs()


def _write_spec(specs: Path, *, extra: str = "", python: str = PYTHON) -> Path:
    path = specs / "tiny.toml"
    path.write_text(SPEC.format(python=python, extra=extra))
    forget_loaded_specs()
    return path


def _root(project: Path) -> Path:
    return project / "cache" / "toolchains"


def _build(capsys: pytest.CaptureFixture[str], uv: Path, *extra: str) -> tuple[int, str, str]:
    code = main(["toolchain", "build", "specs/tiny.toml", "--uv", str(uv), *extra])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def _independent_tree(directory: Path) -> tuple[str, int, int]:
    """The tree hash as docs/toolchains.md words it, written out separately from the module under test."""
    entries: list[tuple[str, Path]] = []
    for folder, dirs, files in os.walk(directory):
        dirs[:] = [d for d in dirs if d != "__pycache__"]
        for name in dirs + files:
            full = Path(folder) / name
            rel = full.relative_to(directory).as_posix()
            if rel != "manifest.json":
                entries.append((rel, full))
    lines, count, size = [], 0, 0
    for rel, full in sorted(entries):
        mode = full.lstat().st_mode
        if stat.S_ISLNK(mode):
            lines.append(f"l\0{rel}\0{os.readlink(full)}")
        elif stat.S_ISDIR(mode):
            lines.append(f"d\0{rel}")
        else:
            digest = hashlib.sha256(full.read_bytes()).hexdigest()
            lines.append(f"f\0{rel}\0{digest}\0{'x' if mode & stat.S_IXUSR else '-'}")
            count += 1
            size += full.lstat().st_size
    text = "".join(line + "\n" for line in lines)
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest(), count, size


# ---------------------------------------------------------------------------------------------- build


def test_build_makes_a_working_toolchain_with_a_format_1_manifest(project, uv, capsys):
    code, out, err = _build(capsys, uv)
    assert code == 0, err
    path = _root(project) / "tiny-agent-1"
    manifest = json.loads((path / "manifest.json").read_text())
    assert out == f"tiny-agent@1: {path} ({manifest['tree_hash']})\n"

    spec_dir = project / "specs"
    lock_sha = hashlib.sha256((spec_dir / "tiny.lock").read_bytes()).hexdigest()
    identity = {
        "python": PYTHON,
        "lock_sha256": lock_sha,
        "caches": [],
        "generate": {"share/tiny/config.json": hashlib.sha256(GENERATE.encode()).hexdigest()},
    }
    tree, files, size = _independent_tree(path)
    assert manifest == {
        "format": 1,
        "name": "tiny-agent-1",
        "build_path": str(path),
        "spec": "tiny-agent@1",
        "python": manifest["python"],
        "lock_sha256": lock_sha,
        "recipe_sha256": hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest(),
        "packages": {"tinyagent": "1.0"},
        "caches": [],
        "generated": ["share/tiny/config.json"],
        "tree_hash": tree,
        "files": files,
        "bytes": size,
        "built_at": manifest["built_at"],
        "builder": manifest["builder"],
    }
    assert manifest["python"] == ".".join(map(str, sys.version_info[:3]))
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", manifest["built_at"])
    real_uv = subprocess.run([REAL_UV, "--version"], capture_output=True, text=True).stdout.split()[1]
    assert manifest["builder"]["uv"] == real_uv and manifest["builder"]["platoon"]

    # The toolchain runs its package; the generated file is there; nothing of the build is left beside it.
    ran = subprocess.run([path / "bin" / "python3", "-m", "tinyagent", "hi"], capture_output=True, text=True)
    assert ran.stdout == "tinyagent says hi\n"
    assert json.loads((path / "share/tiny/config.json").read_text()) == {"generated": True}
    assert sorted(p.name for p in _root(project).iterdir()) == [".tiny-agent-1.lock", "tiny-agent-1"]

    # The steps, as uv saw them: a throwaway HOME (gone now) and the fixed flags docs/toolchains.md lists.
    calls = _calls(uv)
    install = _installs(uv)[0]
    assert install["argv"][2] == PYTHON
    assert {"--no-bin", "--compile-bytecode", "--install-dir"} <= set(install["argv"])
    pip = next(c for c in calls if c["argv"][:2] == ["pip", "install"])
    assert pip["argv"][2:] == [
        "--python", str(path / "bin" / "python3"), "--break-system-packages", "--require-hashes",
        "--compile-bytecode", "--link-mode", "copy", "-r", str(spec_dir / "tiny.lock"),
    ]  # fmt: skip
    for call in calls:
        env = call["env"]
        assert env["HOME"] != os.path.expanduser("~") and not Path(env["HOME"]).exists()
        assert env["TIKTOKEN_CACHE_DIR"] == str(path / "share" / "tiktoken")
        assert env["LITELLM_LOCAL_MODEL_COST_MAP"] == "True" and env["OPENHANDS_SUPPRESS_BANNER"] == "1"
        assert env["UV_PYTHON"] is None  # the caller's interpreter choice does not reach the build


def test_a_current_toolchain_is_a_no_op(project, uv, capsys):
    assert _build(capsys, uv)[0] == 0
    path = _root(project) / "tiny-agent-1"
    before = (path / "manifest.json").read_text()
    code, out, _ = _build(capsys, uv)
    assert code == 0
    assert (path / "manifest.json").read_text() == before
    assert out == f"tiny-agent@1: {path} ({json.loads(before)['tree_hash']})\n"
    assert len(_installs(uv)) == 1


def test_a_toolchain_of_another_recipe_is_replaced_only_with_force(project, uv, capsys):
    assert _build(capsys, uv)[0] == 0
    path = _root(project) / "tiny-agent-1"
    before = json.loads((path / "manifest.json").read_text())
    with open(project / "specs" / "tiny.lock", "a") as lock:
        lock.write("# pinned again\n")
    forget_loaded_specs()
    code, out, err = _build(capsys, uv)
    assert code == 1 and out == ""
    spec_path = project / "specs" / "tiny.toml"
    assert err.startswith(
        f"platoon: tiny-agent@1: {path} holds a toolchain that is stale: it was built from "
    )
    assert err.rstrip().endswith(f"platoon toolchain build {spec_path} --root {_root(project)} --force"), err
    assert json.loads((path / "manifest.json").read_text()) == before  # untouched

    code, out, err = _build(capsys, uv, "--force")
    assert code == 0, err
    after = json.loads((path / "manifest.json").read_text())
    assert after["recipe_sha256"] != before["recipe_sha256"] and len(_installs(uv)) == 2
    assert "replacing" in err


def test_an_interrupted_build_is_replaced(project, uv, capsys):
    path = _root(project) / "tiny-agent-1"
    (path / "bin").mkdir(parents=True)
    (path / "bin" / "half-written").write_text("a build killed before its manifest\n")
    (_root(project) / ".tiny-agent-1.build-killed").mkdir()  # the temp dir of a killed build
    code, _, err = _build(capsys, uv)
    assert code == 0, err
    assert "replacing" in err and "(unfinished)" in err
    assert not (path / "bin" / "half-written").exists() and (path / "manifest.json").is_file()
    assert sorted(p.name for p in _root(project).iterdir()) == [".tiny-agent-1.lock", "tiny-agent-1"]


def test_a_failed_step_leaves_nothing_and_says_what_failed(project, uv, capsys, wheels):
    (project / "specs" / "tiny.lock").write_text("tinyagent==1.0 --hash=sha256:" + "0" * 64 + "\n")
    forget_loaded_specs()
    code, out, err = _build(capsys, uv)
    assert code == 1 and out == ""
    assert err.splitlines()[-1].startswith("platoon: tiny-agent@1: uv pip install failed (exit ")
    assert "hash" in err.lower()
    assert not (_root(project) / "tiny-agent-1").exists()

    # A uv that installs another CPython than the recipe asks for is caught by the version check.
    (project / "specs" / "tiny.lock").write_text(wheels["agent"])
    _write_spec(project / "specs", python="3.99")
    (uv.parent / "any-version").touch()
    code, _, err = _build(capsys, uv)
    assert code == 1
    assert (
        err.splitlines()[-1]
        == f"platoon: tiny-agent@1: uv python install 3.99 gave CPython {sys.version.split()[0]}"
    )
    assert not (_root(project) / "tiny-agent-1").exists()


def test_concurrent_builds_serialize_on_the_lock(project, uv):
    """A second build started while the first holds the lock waits, then finds the toolchain current."""
    (uv.parent / "hold").touch()
    argv = [sys.executable, "-m", "platoon", "toolchain", "build", "specs/tiny.toml", "--uv", str(uv)]
    first = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    while not (uv.parent / "started").exists():
        assert first.poll() is None, first.communicate()
        time.sleep(0.01)
    second = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert second.stderr is not None
    waiting = second.stderr.readline()  # blocks until the second build reports the lock is taken
    assert waiting == "platoon: tiny-agent@1: waiting for another build\n"
    (uv.parent / "hold").unlink()
    out_1, err_1 = first.communicate(timeout=120)
    out_2, err_2 = second.communicate(timeout=120)
    assert first.returncode == 0, err_1
    assert second.returncode == 0, err_2
    assert out_1 == out_2 and out_1.startswith("tiny-agent@1: ")
    assert len(_installs(uv)) == 1  # the second built nothing


def test_the_tiktoken_cache_is_warmed_into_the_toolchain(project, uv, capsys, wheels):
    _write_spec(project / "specs", extra='cache = ["tiktoken"]')
    (project / "specs" / "tiny.lock").write_text(wheels["agent"] + wheels["tiktoken"])
    code, _, err = _build(capsys, uv)
    assert code == 0, err
    path = _root(project) / "tiny-agent-1"
    manifest = json.loads((path / "manifest.json").read_text())
    assert manifest["caches"] == ["tiktoken"]
    assert manifest["packages"] == {"tiktoken": "0.0.1", "tinyagent": "1.0"}
    assert sorted(p.name for p in (path / "share" / "tiktoken").iterdir()) == [
        "cl100k_base.tiktoken",
        "o200k_base.tiktoken",
    ]


def test_a_tiktoken_cache_without_tiktoken_in_the_lock_fails(project, uv, capsys):
    _write_spec(project / "specs", extra='cache = ["tiktoken"]')
    path = _root(project) / "tiny-agent-1"
    code, _, err = _build(capsys, uv)
    assert code == 1
    assert err.splitlines()[-1].startswith(
        f"platoon: tiny-agent@1: warming tiktoken failed (exit 1): {path / 'bin' / 'python3'} -I -c ... cl100k_base "
        "o200k_base: Traceback (most recent call last): "
    )
    assert "No module named 'tiktoken'" in err
    assert not (_root(project) / "tiny-agent-1").exists()


def test_build_refuses_specs_with_nothing_to_build(project, uv, capsys):
    (project / "specs" / "plain.toml").write_text(
        'name = "plain"\nversion = "1"\n[launch]\nargv = ["true"]\n'
    )
    assert main(["toolchain", "build", "specs/plain.toml", "--uv", str(uv)]) == 78
    assert (
        capsys.readouterr().err
        == "platoon: specs/plain.toml: plain@1 names no toolchain ([install] toolchain)\n"
    )
    assert main(["toolchain", "build", "specs/missing.toml"]) == 78
    assert "missing.toml" in capsys.readouterr().err


def test_the_deprecated_variable_names_the_root_and_must_agree_with_the_profile(
    project, uv, capsys, monkeypatch
):
    elsewhere = project / "elsewhere"
    monkeypatch.setenv("PLATOON_TOOLCHAINS", str(elsewhere))
    code, _, err = _build(capsys, uv)
    assert code == 78
    assert (
        f"$PLATOON_TOOLCHAINS is {elsewhere}, but the site profile's cache puts it at {_root(project)}" in err
    )
    monkeypatch.setenv("PLATOON_SITE", "/dev/null")
    code, out, err = _build(capsys, uv)
    assert code == 0, err
    assert "$PLATOON_TOOLCHAINS: deprecated; use the site profile's cache instead" in err
    assert out.startswith(f"tiny-agent@1: {elsewhere / 'tiny-agent-1'} (sha256:")
    code, out, _ = _build(capsys, uv, "--root", str(project / "explicit"))  # an explicit root wins
    assert code == 0 and f"{project / 'explicit' / 'tiny-agent-1'}" in out


# ---------------------------------------------------------------------------------------------- list, verify


def test_list_and_verify_find_a_modified_file(project, uv, capsys):
    assert _build(capsys, uv)[0] == 0
    root = _root(project)
    (root / "half").mkdir()
    assert main(["toolchain", "list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == f"toolchains under {root}:"
    assert lines[1].split() == [
        "name",
        "state",
        "spec",
        "python",
        "packages",
        "size",
        "tree",
        "hash",
        "built",
    ]
    assert lines[2].split()[:2] == ["half", "unfinished"]
    row = lines[3].split()
    manifest = json.loads((root / "tiny-agent-1" / "manifest.json").read_text())
    assert row[:5] == ["tiny-agent-1", "ok", "tiny-agent@1", manifest["python"], "1"]
    assert manifest["tree_hash"][:23] in row and manifest["built_at"] in row

    assert main(["toolchain", "verify", "tiny-agent-1"]) == 0
    assert capsys.readouterr().out == "tiny-agent-1: ok\n"
    module = next((root / "tiny-agent-1").glob("lib/python*/site-packages/tinyagent/__init__.py"))
    module.write_text("VERSION = 'tampered'\n")
    assert main(["toolchain", "verify"]) == 1
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "half: FAILED: " + f"{root / 'half'} has no manifest.json (an unfinished build)"
    assert out[1].startswith("tiny-agent-1: MODIFIED: tree hash is sha256:")
    assert out[1].endswith(f"the manifest records {manifest['tree_hash']}")


def test_list_of_an_empty_root(project, capsys):
    assert main(["toolchain", "list", "--root", str(project / "none")]) == 0
    assert capsys.readouterr().out == f"no toolchains under {project / 'none'}\n"


# ---------------------------------------------------------------------------------------------- a run never builds

TRAIN = """
log_path: runs
tinker_base_url: local
train: {{model_name: m, renderer_name: qwen3_instruct, max_training_steps: 1}}
environments: [{{service: table, service_kwargs: {{rows: [{{id: t1, goal: hi}}]}}, harness: {spec}}}]
"""
EVAL = """
tinker_base_url: local
inference: {{model_name: m, renderer_name: qwen3_instruct, output_dir: out}}
environments: [{{service: table, service_kwargs: {{rows: [{{id: t1, goal: hi}}]}}, harness: {spec}}}]
"""


def _refusals(
    project: Path, capsys: pytest.CaptureFixture[str], only: tuple[str, ...] = ()
) -> dict[str, tuple[int, str]]:
    spec = project / "specs" / "tiny.toml"
    (project / "train.yaml").write_text(TRAIN.format(spec=spec))
    (project / "eval.yaml").write_text(EVAL.format(spec=spec))
    found = {}
    for name, argv in {
        "validate": ["config", "validate", "train.yaml", "eval.yaml"],
        "train": ["train", "train.yaml"],
        "eval": ["eval", "eval.yaml"],
        "rollout": ["rollout", "train.yaml", "--task", "t1"],
    }.items():
        if only and name not in only:
            continue
        code = main(argv)
        captured = capsys.readouterr()
        found[name] = (code, captured.out + captured.err)
    return found


def test_a_missing_or_stale_toolchain_stops_every_run_with_the_build_command(project, uv, capsys):
    spec = project / "specs" / "tiny.toml"
    root = _root(project)
    line = (
        f"environments.0.harness: toolchain tiny-agent-1 of tiny-agent@1 is not built ({root / 'tiny-agent-1'} "
        f"does not exist); build it with: platoon toolchain build {spec} --root {root}"
    )
    for name, (code, text) in _refusals(project, capsys).items():
        assert code == 78, (name, text)
        assert line in text, (name, text)
        assert "Traceback" not in text
    assert not (root / "tiny-agent-1").exists()  # a run never builds

    assert main(["toolchain", "build", str(spec), "--uv", str(uv)]) == 0
    capsys.readouterr()
    # Built, the toolchain no longer stops anything (only validated: a run would now start for real).
    for name, (_, text) in _refusals(project, capsys, only=("validate",)).items():
        assert "toolchain" not in text, (name, text)

    with open(project / "specs" / "tiny.lock", "a") as lock:
        lock.write("# changed\n")
    forget_loaded_specs()
    for name, (code, text) in _refusals(project, capsys).items():
        assert code == 78
        assert "is stale: it was built from another recipe" in text, (name, text)
        assert f"build it with: platoon toolchain build {spec} --root {root} --force" in text, (name, text)


# ---------------------------------------------------------------------------------------------- prepare, hooks


def test_the_prepare_step_builds_what_is_missing_and_never_forces(project, uv, monkeypatch):
    monkeypatch.setenv("PATH", f"{uv.parent}{os.pathsep}{os.environ['PATH']}")  # prepare uses uv on PATH
    spec = load_spec(project / "specs" / "tiny.toml")
    path = _root(project) / "tiny-agent-1"
    dry = prepare_toolchain(spec, dry_run=True)
    assert dry is not None and (dry.step, dry.status) == ("toolchain tiny-agent-1", "missing")
    assert not path.exists()
    done = prepare_toolchain(spec)
    assert done is not None and done.status == "done", done
    assert prepare_toolchain(spec).status == "current"  # type: ignore[union-attr]
    assert toolchain_problems(spec) == []

    with open(project / "specs" / "tiny.lock", "a") as lock:
        lock.write("# changed\n")
    spec = load_spec(project / "specs" / "tiny.toml")
    failed = prepare_toolchain(spec)
    assert failed is not None and failed.status == "failed"
    assert failed.detail.endswith(f"--root {_root(project)} --force")
    assert len(_installs(uv)) == 1  # nothing rebuilt


# ---------------------------------------------------------------------------------------------- staging


def test_staging_copies_once_under_the_lock_and_verifies(project, uv, capsys, monkeypatch):
    assert _build(capsys, uv)[0] == 0
    path = _root(project) / "tiny-agent-1"
    manifest = json.loads((path / "manifest.json").read_text())
    version = manifest["tree_hash"].removeprefix("sha256:")[:16]
    cache = project / "scratch" / f"platoon-toolchains-{os.getuid()}"
    (cache).mkdir(parents=True)
    (cache / f"tiny-agent-1-{version}.partial").mkdir()  # a killed stager's copy

    copies = []
    real_copytree = shutil.copytree

    def counting(*args: Any, **kwargs: Any) -> Any:
        if Path(args[0]) == path:  # copytree calls itself for every subdirectory
            copies.append(args[1])
        time.sleep(0.05)  # widen the window in which the other threads contend for the lock
        return real_copytree(*args, **kwargs)

    monkeypatch.setattr(toolchains.shutil, "copytree", counting)
    results: list[Path] = []
    threads = [threading.Thread(target=lambda: results.append(toolchains.stage(path))) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    staged = cache / f"tiny-agent-1-{version}"
    assert results == [staged] * 4 and len(copies) == 1
    assert toolchains.tree_hash(staged) == manifest["tree_hash"]
    assert sorted(p.name for p in cache.iterdir()) == [f".tiny-agent-1-{version}.lock", staged.name]
    ran = subprocess.run([staged / "bin" / "python3", "-m", "tinyagent", "x"], capture_output=True, text=True)
    assert ran.stdout == "tinyagent says x\n"

    # A toolchain changed after its build does not stage: no copy is left under any name.
    monkeypatch.setenv("PLATOON_TOOLCHAIN_CACHE", str(project / "other-cache"))
    (path / "share" / "tiny" / "config.json").write_text("{}")
    with pytest.raises(toolchains.ToolchainError, match="the copy's tree hash is sha256:"):
        toolchains.stage(path)
    assert [p.name for p in (project / "other-cache").iterdir()] == [f".tiny-agent-1-{version}.lock"]
