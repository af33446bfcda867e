"""Harbor datasets: naming and ids, `hf://` fetch through huggingface_hub from a local fake hub, the lock, a current
lock fetching nothing, a changed commit refused until fetched, `verify` finding damage, `index`, and a run whose
dataset is missing refused as not prepared."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from platoon.envs.service import EnvNotPrepared
from platoon.errors import ConfigError
from platoon_harbor import datasets

A = "a" * 40
B = "b" * 40


def task_files(name: str, *, data: str = "1 2 3\n", group: str | None = None) -> dict[str, bytes]:
    """The files of a small Harbor task: its Dockerfile copies data.txt, which is its input file."""
    files = {
        "task.toml": f'[task]\nname = "{name}"\n[agent]\ntimeout_sec = 60\n',
        "instruction.md": f"<!-- canary GUID -->\nSolve {name}.\n",
        "environment/Dockerfile": "FROM debian:bookworm-slim\nWORKDIR /app\nCOPY data.txt /app/data.txt\n",
        "environment/data.txt": data,
        "tests/test.sh": "#!/bin/bash\necho 1 > /logs/verifier/reward.txt\n",
        "solution/solve.sh": "#!/bin/bash\ntrue\n",
        "environment/__pycache__/x.pyc": "junk",
    }
    return {k: v.encode() for k, v in files.items()}


def dataset_files(prefix: str = "", n: int = 3) -> dict[str, bytes]:
    files: dict[str, bytes] = {}
    for i in range(n):
        for rel, data in task_files(f"t{i}", data=f"data {i}\n").items():
            files[f"{prefix}t{i}/{rel}"] = data
    files[f"{prefix}README.md"] = b"a dataset\n"
    return files


def write_config(path: Path, dataset: str, **kwargs: Any) -> Path:
    lines = [
        "environments:",
        "  - name: hb",
        "    service: harbor",
        "    service_kwargs:",
        f"      dataset: {dataset!r}",
    ]
    lines += [f"      {key}: {json.dumps(value)}" for key, value in kwargs.items()]
    path.write_text("\n".join(lines) + "\n")
    return path


def platoon(
    args: list[str], hub_url: str | None = None, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    """The real command line in a child process: huggingface_hub reads HF_ENDPOINT/HF_HUB_OFFLINE at import."""
    env = dict(os.environ)
    env.pop("HF_HUB_OFFLINE", None)
    if hub_url is not None:
        env["HF_ENDPOINT"] = hub_url
    env["HF_HUB_DISABLE_XET"] = "1"
    return subprocess.run(
        [sys.executable, "-m", "platoon", "harbor", *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=cwd,
        timeout=120,
    )


def json_lines(text: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in text.splitlines() if line.startswith("{")]


# ---------------------------------------------------------------------------------------------------------------
# Naming and ids
# ---------------------------------------------------------------------------------------------------------------


def test_dataset_references_parse_and_unsupported_schemes_are_refused(tmp_path: Path) -> None:
    ref = datasets.parse_dataset(f"hf://org/name@{A}#sub/dir")
    assert (ref.kind, ref.repo, ref.revision, ref.subdir, ref.pinned) == (
        "hf",
        "org/name",
        A,
        "sub/dir",
        True,
    )
    assert datasets.parse_dataset(f"hf://datasets/org/name@{A}").repo == "org/name"
    assert not datasets.parse_dataset("hf://org/name@main").pinned
    assert not datasets.parse_dataset("hf://org/name").pinned
    local = datasets.parse_dataset("tasks", tmp_path)
    assert (local.kind, local.path) == ("local", tmp_path / "tasks")
    for bad in (
        "harbor://x/y",
        "git+https://example.com/x.git",
        "hf://name-only@" + A,
        "s3://b/k",
        f"hf://o/n@{A}#../x",
    ):
        with pytest.raises(ConfigError):
            datasets.parse_dataset(bad)


def _write(root: Path, files: dict[str, bytes]) -> None:
    for rel, data in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)


def test_task_ids_scan_registry_index_and_duplicates(tmp_path: Path) -> None:
    root = tmp_path / "ds"
    _write(root, dataset_files())
    _write(root, {f"group/deep/{k}": v for k, v in task_files("deep").items()})
    _write(root, {f".hidden/h/{k}": v for k, v in task_files("h").items()})
    assert sorted(datasets.task_ids(root)) == ["group/deep", "t0", "t1", "t2"]
    # A registry names the tasks; only listed tasks that exist count.
    (root / "registry.json").write_text(
        json.dumps(
            {"name": "ds", "tasks": [{"name": "first", "path": "t0"}, {"name": "gone", "path": "nope"}]}
        )
    )
    assert list(datasets.task_ids(root)) == ["first"]
    (root / "registry.json").write_text(json.dumps([{"tasks": [{"name": "x", "path": "../t0"}]}]))
    with pytest.raises(ConfigError, match=r"'\.\.'"):
        datasets.task_ids(root)
    (root / "registry.json").write_text(
        json.dumps([{"tasks": [{"name": "x", "path": "t0"}, {"name": "x", "path": "t1"}]}])
    )
    with pytest.raises(ConfigError, match="duplicate task id 'x'"):
        datasets.task_ids(root)
    (root / "registry.json").unlink()
    # task-index.json rows with task_path name a fetched dataset's tasks.
    (root / "task-index.json").write_text(json.dumps({"one": {"task_path": "t1", "difficulty": "easy"}}))
    assert list(datasets.task_ids(root, fetched=True)) == ["one"]
    assert "t1" in datasets.task_ids(root)  # dataset_dir mode: the scan


def test_content_hash_follows_the_gitignore_and_default_ignores(tmp_path: Path) -> None:
    task = tmp_path / "t"
    _write(task, task_files("t"))
    before = datasets.content_hash(task)
    (task / "environment" / "notes.swp").write_text("editor junk")  # a default ignore
    (task / "unrelated.txt").write_text("not covered")
    assert datasets.content_hash(task) == before
    (task / "tests" / "extra.py").write_text("covered")
    assert datasets.content_hash(task) != before
    (task / ".gitignore").write_text("tests/*.py\n!tests/keep.py\nbuild/\n")
    (task / "tests" / "keep.py").write_text("kept")
    (task / "environment" / "build").mkdir()
    (task / "environment" / "build" / "out").write_text("ignored under an ignored directory")
    assert datasets._files(task) == [
        "environment/Dockerfile",
        "environment/__pycache__/x.pyc",  # a .gitignore replaces the default ignores
        "environment/data.txt",
        "environment/notes.swp",
        "instruction.md",
        "solution/solve.sh",
        "task.toml",
        "tests/keep.py",
        "tests/test.sh",
    ]


def test_input_files_are_the_dockerfile_sources_with_normalised_text(tmp_path: Path) -> None:
    one, two = tmp_path / "one", tmp_path / "two"
    _write(one, task_files("one", data="a\nb\n"))
    _write(two, task_files("two", data="\ufeffa  \r\n\r\nb\r\n"))  # BOM, CRLF, trailing blanks, a blank line
    (one / "environment" / "unused.txt").write_text("not copied")
    got = datasets.input_files(one)
    assert list(got) == ["environment/data.txt"]
    assert got == datasets.input_files(two)


# ---------------------------------------------------------------------------------------------------------------
# Fetch, cache and lock, through the real command line and huggingface_hub
# ---------------------------------------------------------------------------------------------------------------


def test_fetch_locks_and_a_second_fetch_sends_no_request(hub: Any, tmp_path: Path) -> None:
    splits = {"train": ["t0", "t1"], "val": ["t2"]}
    hub.publish("org/ds", A, {**dataset_files("tasks/"), "tasks/splits.json": json.dumps(splits).encode()})
    cache = tmp_path / "cache"
    config = write_config(tmp_path / "run.yaml", f"hf://org/ds@{A}#tasks")
    done = platoon(["fetch", str(config), "--cache", str(cache)], hub.url)
    assert done.returncode == 0, done.stderr
    (line,) = json_lines(done.stdout)
    assert (
        line["environment"] == "hb"
        and line["tasks"] == 3
        and line["runnable"] == 3
        and line["fetched"] is True
    )
    lock_path = Path(line["lock"])
    assert lock_path.parent == cache / "locks" and lock_path.name.endswith(".lock.json")
    lock = datasets.read_lock(lock_path)
    assert (
        lock["resolved"] == A
        and lock["hash_rule"] == "harbor-packager-v1"
        and lock["dataset"] == f"hf://org/ds@{A}#tasks"
    )
    assert [t["name"] for t in lock["tasks"]] == ["t0", "t1", "t2"]
    # the dataset's splits file, fetched with the index files, in its order
    assert lock["splits"] == [{"split": "train", "tasks": ["t0", "t1"]}, {"split": "val", "tasks": ["t2"]}]
    for task in lock["tasks"]:
        entry = cache / task["path"]
        assert task["digest"] == "sha256:" + datasets.content_hash(entry)
        assert list(task["input_files"]) == ["environment/data.txt"]
        assert os.access(entry / "tests" / "test.sh", os.X_OK)  # executable bits come back
        assert not (entry / "environment" / "__pycache__").exists()  # never downloaded: not covered
    # One task per line, so that a lock diffs well.
    text = lock_path.read_text()
    assert sum(1 for ln in text.splitlines() if ln.lstrip().startswith('{"digest"')) == 3
    assert not any("README.md" in r for r in hub.downloads())  # the dataset's README is no task file
    assert not any("__pycache__" in r for r in hub.downloads())
    seen = len(hub.requests)
    assert seen > 0

    again = platoon(["fetch", str(config), "--cache", str(cache)], hub.url)
    assert again.returncode == 0, again.stderr
    assert json_lines(again.stdout)[0]["fetched"] is False
    assert len(hub.requests) == seen  # a pinned dataset with a current lock sends nothing

    # A run resolves it without any network (HF_HUB_OFFLINE stays set in this process).
    resolved = datasets.resolve_dataset({"dataset": f"hf://org/ds@{A}#tasks"}, cache)
    assert sorted(resolved.tasks) == ["t0", "t1", "t2"] and resolved.lock_path == lock_path
    assert resolved.splits() == splits


def test_a_changed_commit_is_refused_until_it_is_fetched(hub: Any, tmp_path: Path) -> None:
    hub.publish("org/ds", A, dataset_files())
    changed = dataset_files()
    changed["t1/instruction.md"] = b"Solve t1, now harder.\n"
    hub.publish("org/ds", B, changed)
    cache, lock = tmp_path / "cache", tmp_path / "pinned.lock.json"
    config = write_config(tmp_path / "run.yaml", f"hf://org/ds@{A}", lock=str(lock))
    assert platoon(["fetch", str(config), "--cache", str(cache)], hub.url).returncode == 0
    moved = write_config(tmp_path / "moved.yaml", f"hf://org/ds@{B}", lock=str(lock))
    with pytest.raises(EnvNotPrepared) as caught:
        datasets.resolve_dataset({"dataset": f"hf://org/ds@{B}", "lock": str(lock)}, cache, config=str(moved))
    assert caught.value.failure_kind == "env_config"
    assert f"platoon prepare {moved}" in str(caught.value) and "other fetch settings" in str(caught.value)
    done = platoon(["fetch", str(moved), "--cache", str(cache)], hub.url)
    assert done.returncode == 0, done.stderr
    resolved = datasets.resolve_dataset({"dataset": f"hf://org/ds@{B}", "lock": str(lock)}, cache)
    assert resolved.lock is not None and resolved.lock["resolved"] == B
    assert (resolved.tasks["t1"] / "instruction.md").read_text() == "Solve t1, now harder.\n"


def test_a_moving_reference_needs_update(hub: Any, tmp_path: Path) -> None:
    hub.publish("org/ds", A, dataset_files(n=1))
    config = write_config(tmp_path / "run.yaml", "hf://org/ds@main")
    refused = platoon(["fetch", str(config), "--cache", str(tmp_path / "c")], hub.url)
    assert refused.returncode == 78 and "moving reference" in refused.stderr and "--update" in refused.stderr
    assert hub.requests == []
    done = platoon(["fetch", str(config), "--cache", str(tmp_path / "c"), "--update"], hub.url)
    assert done.returncode == 0, done.stderr
    assert datasets.read_lock(Path(json_lines(done.stdout)[0]["lock"]))["resolved"] == A


def test_a_download_that_does_not_match_the_listing_is_fetched_again_then_fails(
    hub: Any, tmp_path: Path
) -> None:
    hub.publish("org/ds", A, dataset_files(n=1))
    hub.tamper["t0/instruction.md"] = b"tampered on the way\n"
    config = write_config(tmp_path / "run.yaml", f"hf://org/ds@{A}")
    done = platoon(["fetch", str(config), "--cache", str(tmp_path / "c")], hub.url)
    assert done.returncode == 1
    assert "t0/instruction.md does not match" in done.stderr
    assert len(hub.downloads("t0/instruction.md")) == 2


def test_verify_finds_a_damaged_cache_file(hub: Any, tmp_path: Path) -> None:
    hub.publish("org/ds", A, dataset_files())
    cache = tmp_path / "cache"
    config = write_config(tmp_path / "run.yaml", f"hf://org/ds@{A}")
    lock_path = Path(
        json_lines(platoon(["fetch", str(config), "--cache", str(cache)], hub.url).stdout)[0]["lock"]
    )
    ok = platoon(["verify", str(config), "--cache", str(cache)])
    assert ok.returncode == 0, ok.stderr
    assert json_lines(ok.stdout)[0]["damaged"] == 0
    entry = cache / datasets.read_lock(lock_path)["tasks"][1]["path"]
    target = entry / "tests" / "test.sh"
    target.unlink()  # (it is a hard link into the download cache: replace it, as an editor would)
    target.write_text("#!/bin/bash\necho 1 > /logs/verifier/reward.txt  # forged\n")
    bad = platoon(["verify", str(config), "--cache", str(cache)])
    assert bad.returncode == 1
    assert "t1:" in bad.stderr and "the lock says sha256:" in bad.stderr
    only = platoon(["verify", str(lock_path), "--cache", str(cache), "--task", "t0"])
    assert only.returncode == 0, only.stderr
    # A fetch with --repair puts the entry back.
    assert platoon(["fetch", str(config), "--cache", str(cache), "--repair"], hub.url).returncode == 0
    assert platoon(["verify", str(lock_path), "--cache", str(cache)]).returncode == 0


def test_index_lists_tasks_with_their_split(tmp_path: Path) -> None:
    source = tmp_path / "src"
    _write(source, dataset_files(n=4))
    (source / "task-index.json").write_text(json.dumps({f"t{i}": {"repo": f"r{i // 2}"} for i in range(4)}))
    cache = tmp_path / "cache"
    config = write_config(tmp_path / "run.yaml", "src", holdout={"fraction": 0.5, "group_by": "repo"})
    fetched = platoon(["fetch", str(config), "--cache", str(cache)])
    assert fetched.returncode == 0, fetched.stderr
    assert json_lines(fetched.stdout)[0]["holdout"]["eval"] == 2
    assert "hold-out stratum all: 4 selected" in fetched.stderr
    shown = platoon(["index", str(config), "--cache", str(cache)])
    assert shown.returncode == 0, shown.stderr
    header, *rows = shown.stdout.splitlines()
    assert header.split() == ["ENVIRONMENT", "TASK", "DIGEST", "SPLIT", "REFUSED", "INDEX"]
    assert [r.split()[1] for r in rows] == ["t0", "t1", "t2", "t3"]
    listed = json_lines(platoon(["index", str(config), "--cache", str(cache), "--json-output"]).stdout)
    sides = {row["id"]: (row["split"], row["index"]["repo"]) for row in listed}
    assert (
        sides["t0"][0] == sides["t1"][0] and sides["t2"][0] == sides["t3"][0] != sides["t0"][0]
    )  # whole groups
    # A local source is fetched again every time, and copied, never linked to the user's files.
    assert json_lines(platoon(["fetch", str(config), "--cache", str(cache)]).stdout)[0]["fetched"] is True
    entry = cache / datasets.read_lock(Path(json_lines(fetched.stdout)[0]["lock"]))["tasks"][0]["path"]
    assert (entry / "task.toml").stat().st_ino != (source / "t0" / "task.toml").stat().st_ino


def test_a_fetched_dataset_lists_its_splits_file_narrowed_to_the_selection(tmp_path: Path) -> None:
    from platoon_harbor.service import HarborService

    source = tmp_path / "src"
    _write(source, dataset_files(n=4))
    (source / "splits.json").write_text(json.dumps({"train": ["t0", "t1", "t3"], "val": ["t2"], "test": []}))
    (source / "allow.txt").write_text("t0\nt2\nt3\n")
    cache = tmp_path / "cache"
    config = write_config(tmp_path / "run.yaml", "src", tasks="src/allow.txt")
    fetched = platoon(["fetch", str(config), "--cache", str(cache)])
    assert fetched.returncode == 0, fetched.stderr
    lock = datasets.read_lock(Path(json_lines(fetched.stdout)[0]["lock"]))
    assert [(row["split"], row["tasks"]) for row in lock["splits"]] == [
        ("train", ["t0", "t3"]),
        ("val", ["t2"]),
        ("test", []),
    ]
    service = HarborService(dataset=str(source), tasks=str(source / "allow.txt"), cache=str(cache))
    assert asyncio.run(service.list_splits()) == ["train", "val", "test"]
    assert asyncio.run(service.list_tasks("val")) == ["t2"]
    with pytest.raises(ConfigError) as refused:
        asyncio.run(service.list_tasks("validation"))
    assert str(refused.value) == "harbor: no split 'validation'; known splits: train, val, test"


def test_a_run_whose_dataset_is_missing_is_not_prepared(tmp_path: Path) -> None:
    config = write_config(tmp_path / "run.yaml", f"hf://org/ds@{A}")
    with pytest.raises(EnvNotPrepared) as caught:
        datasets.resolve_dataset(
            {"dataset": f"hf://org/ds@{A}"}, tmp_path / "empty-cache", config=str(config)
        )
    message = str(caught.value)
    assert "not fetched" in message and f"platoon prepare {config}" in message
    missing = platoon(["index", str(config), "--cache", str(tmp_path / "empty-cache")])
    assert missing.returncode == 78 and "platoon harbor fetch" in missing.stderr


def test_offline_mode_fails_fast(tmp_path: Path) -> None:
    config = write_config(tmp_path / "run.yaml", f"hf://org/ds@{A}")
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_ENDPOINT="http://127.0.0.1:9")
    done = subprocess.run(
        [sys.executable, "-m", "platoon", "harbor", "fetch", str(config), "--cache", str(tmp_path / "c")],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert done.returncode == 1 and "HF_HUB_OFFLINE" in done.stderr
