"""Run records: the resolved config and lock, identity refusals,
the process.json hold on a run dir, the JSONL conventions and the one-line TINKER_API_KEY errors.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import yaml

from platoon._version import running_version
from platoon.config import load_config
from platoon.errors import ConfigError
from platoon.gateway.tinker_service import (
    TinkerKeyError,
    check_tinker_key,
    refused_key_error,
    uses_local_server,
)
from platoon.rollouts import records
from platoon.rollouts.records import (
    IdentityRecord,
    ProcessRecord,
    RunDirInUse,
    append_jsonl,
    check_identity,
    check_name_collision,
    hold_run_dir,
    read_jsonl,
    update_lock,
    write_lock,
    write_resolved_config,
)

TRAIN = {"train": {"model_name": "Qwen/Qwen3-4B", "renderer_name": "qwen3"}}

#: the one line a start without a Tinker key says (naming the local server, which needs none)
MISSING_KEY = (
    "TINKER_API_KEY is not set: the policy is sampled through Tinker, which needs it; for the embedded local "
    "server, which needs none, set TINKER_BASE_URL=local (or tinker_base_url: local in the config)"
)


@pytest.fixture(autouse=True)
def clean_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    for name in ("PLATOON_SITE", "PLATOON_HARBOR_CACHE", "PLATOON_TOOLCHAINS", "PLATOON_IMAGE_PULLS"):
        monkeypatch.delenv(name, raising=False)


def write(path: Path, content: Any) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        textwrap.dedent(content) if isinstance(content, str) else yaml.safe_dump(content, sort_keys=False)
    )
    return path


# --- config.resolved.yaml ---------------------------------------------------------------------------------------


def test_resolved_config_header_and_absolute_outputs(tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    write(work / "base.yaml", {**TRAIN, "log_path": "runs"})
    top = write(work / "top.yaml", {"extends": "base.yaml", "stats": {"trial_name": "t1"}})
    loaded = load_config(top, ["train.batch_size=2"], cwd=work)
    run_dir = records.run_dir_of(loaded.data, cwd=work)
    assert run_dir == work / "runs" / "platoon_tinker" / "t1"

    path = write_resolved_config(run_dir, loaded, cwd=work)
    text = path.read_text()
    lines = text.splitlines()
    assert lines[0].startswith(f"# Written by platoon {running_version()} at ")
    assert lines[1:4] == [
        f"# source: {work / 'base.yaml'}",
        f"# source: {work / 'top.yaml'}",
        "# override: train.batch_size=2",
    ]
    assert not any(line.startswith("# site profile") for line in lines)
    data = yaml.safe_load(text)
    assert data["log_path"] == str(work / "runs")
    assert data["train"]["batch_size"] == 2
    assert "extends" not in data
    assert not any(p.name.endswith(".partial") for p in run_dir.iterdir())


def test_resolved_config_loads_the_same_from_another_directory(tmp_path: Path) -> None:
    work = tmp_path / "work"
    write(work / "c.yaml", {**TRAIN, "log_path": "out/runs", "train": {**TRAIN["train"], "batch_size": 3}})
    loaded = load_config(work / "c.yaml", cwd=work)
    run_dir = records.run_dir_of(loaded.data, cwd=work)
    path = write_resolved_config(run_dir, loaded, cwd=work)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    again = load_config(path, cwd=elsewhere)
    assert records.run_dir_of(again.data, cwd=elsewhere) == run_dir
    assert again.config is not None and loaded.config is not None
    assert again.config.model_dump() == {
        **loaded.config.model_dump(),
        "log_path": str(work / "out" / "runs"),
    }


def test_resolved_config_names_the_site_profile_and_what_it_gave(tmp_path: Path) -> None:
    site = write(tmp_path / "xdg" / "platoon" / "site.yaml", {"runs": str(tmp_path / "data")})
    cfg = write(tmp_path / "exp.yaml", TRAIN)
    loaded = load_config(cfg, cwd=tmp_path)
    run_dir = records.run_dir_of(loaded.data, cwd=tmp_path)
    assert run_dir == tmp_path / "data" / "exp" / "run"
    text = write_resolved_config(run_dir, loaded, cwd=tmp_path).read_text()
    assert loaded.site is not None
    assert f"# site profile: {site} (sha256 {loaded.site.sha256})" in text.splitlines()
    assert "# from the site profile: log_path" in text.splitlines()
    assert "# from the site profile: stats.experiment_name" in text.splitlines()
    # The snapshot needs no profile: what it gave is written out.
    os.remove(site)
    again = load_config(run_dir / "config.resolved.yaml", cwd=tmp_path)
    assert again.site_gave == {} and records.run_dir_of(again.data) == run_dir


def test_snapshot_writes_the_default_harbor_provider(tmp_path: Path) -> None:
    cfg = write(tmp_path / "c.yaml", {**TRAIN, "log_path": "x"})
    loaded = load_config(cfg, cwd=tmp_path)
    loaded.data["environments"] = [
        {"name": "h", "service": "harbor", "service_kwargs": {"dataset": "d"}},
        {"name": "k", "service": "harbor", "service_kwargs": {"provider": "singularity"}},
        {"name": "n", "service": "harbor"},
        {"name": "t", "service": "table", "service_kwargs": {"path": "/t.jsonl"}},
    ]
    data = records.snapshot_data(loaded, cwd=tmp_path)
    kwargs = [entry.get("service_kwargs") for entry in data["environments"]]
    assert kwargs == [
        {"dataset": "d", "provider": "docker"},
        {"provider": "singularity"},
        {"provider": "docker"},
        {"path": "/t.jsonl"},
    ]
    assert "provider" not in loaded.data["environments"][0]["service_kwargs"]  # the loaded data is untouched


def test_header_comments_cannot_break_the_yaml(tmp_path: Path) -> None:
    cfg = write(tmp_path / "c.yaml", {**TRAIN, "log_path": "x"})
    loaded = load_config(cfg, cwd=tmp_path)
    loaded.overrides.append("stats.trial_name=a\nlog_path: /evil")  # what an odd argv could hold
    path = write_resolved_config(tmp_path / "run", loaded, cwd=tmp_path)
    data = yaml.safe_load(path.read_text())
    assert data["log_path"] == str(tmp_path / "x")
    assert "# override: stats.trial_name=a\\nlog_path: /evil" in path.read_text()


# --- lock.json --------------------------------------------------------------------------------------------------


def _loaded(tmp_path: Path, overrides: list[str] | None = None) -> Any:
    cfg = write(tmp_path / "c.yaml", {**TRAIN, "log_path": "runs"})
    return load_config(cfg, overrides or [], cwd=tmp_path)


def test_lock_fields(tmp_path: Path) -> None:
    loaded = _loaded(tmp_path)
    component = {
        "kind": "program",
        "ref": "single",
        "resolved": "platoon.programs.single:single",
        "source": "builtin",
        "distribution": "platoon-core",
        "distribution_version": "0.2.0",
        "entry_point": "single = platoon.programs:single",
        "environments": ["a"],
    }
    providers = [
        {"environment": "a", "provider": "docker", "options": {}, "source": "default", "option_sources": {}}
    ]
    lock = write_lock(
        tmp_path / "run", loaded, [component], sandbox_providers=providers, argv=["platoon", "train"]
    )
    on_disk = (tmp_path / "run" / "lock.json").read_text()
    assert on_disk.endswith("}\n") and on_disk.startswith("{\n  ")
    assert json.loads(on_disk) == lock
    assert list(lock) == [
        "versions",
        "commits",
        "platoon_git_sha",
        "platoon_git_dirty",
        "python",
        "hostname",
        "started_at",
        "argv",
        "deprecations",
        "components",
        "extensions",
        "site",
        "sandbox_providers",
    ]
    assert lock["versions"]["platoon"] == running_version()
    assert set(lock["versions"]) == {"platoon", "tinker", "tinker_cookbook", "openreward", "hpc_sandbox"}
    assert isinstance(lock["versions"]["tinker"], str)  # a dependency of core
    assert isinstance(lock["commits"], dict)
    assert lock["python"] == ".".join(map(str, sys.version_info[:3]))
    assert lock["hostname"] == socket.gethostname()
    assert lock["started_at"].endswith("+00:00") and len(lock["started_at"]) == len(
        "2025-01-01T00:00:00+00:00"
    )
    assert lock["argv"] == ["platoon", "train"]
    assert lock["deprecations"] == []
    assert lock["components"] == [component]
    assert lock["sandbox_providers"] == providers
    assert lock["site"] == {
        "path": None,
        "sha256": None,
        "cache_root": str(tmp_path / "home" / ".cache" / "platoon"),
        "cache_root_source": "default",
        "gave": {},
    }
    for dist, record in lock["extensions"].items():
        assert set(record) == {"version", "requires", "direct_url"}, dist
    # The checkout this runs from is a git work tree: its sha is recorded, dirty or not.
    if lock["platoon_git_sha"] is not None:
        assert len(lock["platoon_git_sha"]) == 40 and isinstance(lock["platoon_git_dirty"], bool)


def test_lock_records_deprecations_and_the_site(tmp_path: Path) -> None:
    write(
        tmp_path / "xdg" / "platoon" / "site.yaml",
        {"runs": str(tmp_path / "data"), "cache": str(tmp_path / "c")},
    )
    cfg = write(tmp_path / "exp.yaml", {**TRAIN, "checkpoint": {"strategy": "step"}})
    loaded = load_config(cfg, cwd=tmp_path)
    lock = records.build_lock(loaded, [], argv=[])
    assert lock["deprecations"] == [
        {
            "path": "checkpoint.strategy",
            "replacement": "`every` alone (training steps, 0 never)",
            "removed_in": "0.3.0",
        }
    ]
    assert loaded.site is not None
    assert lock["site"] == {
        "path": str(loaded.site.path),
        "sha256": loaded.site.sha256,
        "cache": str(tmp_path / "c"),
        "runs": str(tmp_path / "data"),
        "cache_root": str(tmp_path / "c"),
        "cache_root_source": "site",
        "gave": {"log_path": str(tmp_path / "data"), "stats.experiment_name": "exp"},
        "named_after": str(cfg),
    }


def test_image_pulls(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    loaded = _loaded(tmp_path)
    pull = {"reference": "r:1", "path": "/i.sif", "sha256": "ab", "manifest_digest": "sha256:cd"}
    pulls = tmp_path / "pulls.jsonl"
    pulls.write_text(json.dumps({**pull, "extra": 1}) + "\n\n")
    monkeypatch.setenv("PLATOON_IMAGE_PULLS", str(pulls))
    assert records.build_lock(loaded, [])["image_pulls"] == [pull]
    for content, said in [
        ("", "holds no image pulls"),
        ("{not json\n", "line 1 is not a JSON object"),
        (json.dumps({"reference": "r"}) + "\n", "line 1 is not a JSON object"),
    ]:
        pulls.write_text(content)
        with pytest.raises(ConfigError) as info:
            write_lock(tmp_path / "never", loaded, [])
        assert said in str(info.value) and "\n" not in str(info.value)
        assert not (tmp_path / "never").exists()  # refused before anything is written
    monkeypatch.setenv("PLATOON_IMAGE_PULLS", str(tmp_path / "missing.jsonl"))
    with pytest.raises(ConfigError, match="cannot be read"):
        records.build_lock(loaded, [])


def test_update_lock_replaces_atomically(tmp_path: Path) -> None:
    run = tmp_path / "run"
    write_lock(run, _loaded(tmp_path), [], argv=[])
    update_lock(run, tool_call_parsing={"model_name": "m", "parser": "hermes"})
    data = update_lock(run, excluded_tasks={"env": {"train": {"listed": 3, "excluded": ["t"]}}})
    on_disk = json.loads((run / "lock.json").read_text())
    assert on_disk == data
    assert on_disk["tool_call_parsing"] == {"model_name": "m", "parser": "hermes"}
    assert on_disk["excluded_tasks"]["env"]["train"]["excluded"] == ["t"]
    assert "versions" in on_disk
    assert sorted(p.name for p in run.iterdir()) == ["lock.json"]  # no .lock.json.partial left behind


def test_update_lock_goes_through_the_partial_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    run = tmp_path / "run"
    write_lock(run, _loaded(tmp_path), [], argv=[])
    replaced: list[tuple[str, str]] = []
    real = os.replace

    def spy(src: Any, dst: Any) -> None:
        replaced.append((Path(src).name, Path(dst).name))
        real(src, dst)

    monkeypatch.setattr(records.os, "replace", spy)
    update_lock(run, judges={"enabled": True})
    assert replaced == [(".lock.json.partial", "lock.json")]


def test_name_collision(tmp_path: Path) -> None:
    write(tmp_path / "xdg" / "platoon" / "site.yaml", {"runs": str(tmp_path / "data")})
    first = load_config(write(tmp_path / "a" / "exp.yaml", TRAIN), cwd=tmp_path)
    run = records.run_dir_of(first.data)
    assert check_name_collision(run, first) is None  # no lock yet
    write_lock(run, first, [], argv=[])
    assert check_name_collision(run, first) is None  # the same file
    second = load_config(write(tmp_path / "b" / "exp.yaml", TRAIN), cwd=tmp_path)
    assert records.run_dir_of(second.data) == run
    said = check_name_collision(run, second)
    assert said is not None and said.startswith(f"{run} belongs to {tmp_path / 'a' / 'exp.yaml'}")
    assert "stats.experiment_name" in said
    named = load_config(write(tmp_path / "b" / "exp2.yaml", {**TRAIN, "stats": {"experiment_name": "exp"}}))
    assert check_name_collision(run, named) is None  # named explicitly: the user chose this dir


# --- identity.json ----------------------------------------------------------------------------------------------


def _split(held: list[str], evaluated: list[str] | None = None, **more: Any) -> dict[str, Any]:
    return {
        "holdout": {"fraction": 0.1},
        "held_out": held,
        "eval": evaluated if evaluated is not None else held,
        **more,
    }


def test_identity_round_trip(tmp_path: Path) -> None:
    record = records.write_identity(tmp_path, "m", "qwen3", {"a": _split(["t1"])})
    data = json.loads((tmp_path / "identity.json").read_text())
    assert list(data) == ["version", "model", "renderer", "environments", "written_at"]
    assert data["version"] == 1 and data["environments"]["a"]["held_out"] == ["t1"]
    assert records.read_identity(tmp_path) == record == IdentityRecord.from_json(data)


def test_identity_unchanged_is_accepted(tmp_path: Path) -> None:
    records.write_identity(tmp_path, "m", "qwen3", {"a": _split(["t1", "t2"])})
    assert check_identity(tmp_path, "m", "qwen3", {"a": _split(["t2", "t1"])}) == []


def test_model_and_renderer_changes_are_refused(tmp_path: Path) -> None:
    records.write_identity(tmp_path, "Qwen/A", "qwen3")
    assert check_identity(tmp_path, "Qwen/B", "llama3") == [
        "train.model_name: this run trained Qwen/A and this start names Qwen/B: a resume keeps its model; start a "
        "new run (another stats.trial_name) to change it",
        "train.renderer_name: this run used qwen3 and this start names llama3: a resume keeps its renderer; start "
        "a new run (another stats.trial_name) to change it",
    ]


KEEP = "a resume keeps the run's hold-out; start a new run (another stats.trial_name) to change it"


def test_hold_out_changes_are_refused(tmp_path: Path) -> None:
    records.write_identity(tmp_path, "m", "r", {"a": _split(["t1", "t2"])})
    # t2 released to training, t3 newly held out
    problems = check_identity(tmp_path, "m", "r", {"a": _split(["t1", "t3"])}, training={"a": ["t2", "t4"]})
    assert problems == [
        f"environments[a]: 1 task(s) the run held out would now train (t2): {KEEP}",
        f"environments[a]: 1 task(s) are newly held out (t3): {KEEP}",
    ]
    # The hold-out removed while the entry still trains: its held-out tasks train now.
    assert check_identity(tmp_path, "m", "r", {}, training={"a": ["t1", "t2", "t9"]}) == [
        f"environments[a]: 2 task(s) the run held out would now train (t1, t2): {KEEP}"
    ]
    # A hold-out added to an entry that had none.
    assert check_identity(tmp_path, "m", "r", {"a": _split(["t1", "t2"]), "b": _split(["x"])}) == [
        f"environments[b]: a hold-out was added to a run that had none: {KEEP}"
    ]


def test_hold_out_without_training_ids_is_read_safely(tmp_path: Path) -> None:
    records.write_identity(tmp_path, "m", "r", {"a": _split(["t1", "t2"])})
    # Without the training ids, a released task counts as training ...
    assert check_identity(tmp_path, "m", "r", {"a": _split(["t1"])}) == [
        f"environments[a]: 1 task(s) the run held out would now train (t2): {KEEP}"
    ]
    # ... unless the split record lists what trains.
    assert check_identity(tmp_path, "m", "r", {"a": _split(["t1"], train=["t3"])}) == []


def test_only_logged_changes(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    records.write_identity(tmp_path, "m", "r", {"a": _split(["t1", "t2", "t3"])})
    caplog.set_level("INFO", logger=records.__name__)
    # t3 left the selection (no longer listed anywhere), t2 moved out of evaluation (refused): logged only.
    now = {"a": _split(["t1", "t2"], evaluated=["t1"])}
    assert check_identity(tmp_path, "m", "r", now, training={"a": ["t4"]}) == []
    assert "1 held-out tasks left the selection: t3" in caplog.text
    assert "evaluated held-out tasks changed" in caplog.text


def test_missing_identity(tmp_path: Path) -> None:
    assert check_identity(tmp_path, "m", "r") == []  # no hold-out: the resume writes one
    assert check_identity(tmp_path, "m", "r", {"b": _split(["x"]), "a": _split(["y"])}) == [
        f"identity.json is missing and this start holds tasks out (environments[a], environments[b]): {KEEP}"
    ]


def test_many_tasks_are_abbreviated(tmp_path: Path) -> None:
    records.write_identity(tmp_path, "m", "r", {"a": _split([])})
    (problem,) = check_identity(tmp_path, "m", "r", {"a": _split([f"t{i:02d}" for i in range(12)])})
    assert (
        problem
        == f"environments[a]: 12 task(s) are newly held out (t00, t01, t02, t03, t04, ... (12 in all)): {KEEP}"
    )


def test_settle_identity(tmp_path: Path) -> None:
    run = tmp_path / "run"
    write_lock(run, _loaded(tmp_path), [], argv=[])
    first = records.settle_identity(run, "m", "r", resuming=False)
    assert first is not None and records.read_identity(run) == first
    assert records.settle_identity(run, "m", "r", resuming=True) == first
    with pytest.raises(ConfigError) as info:
        records.settle_identity(run, "other", "r", resuming=True)
    assert info.value.exit_code == 78
    lock = json.loads((run / "lock.json").read_text())
    assert lock["resume_refused"]["identity"]["model"] == "m"
    assert lock["resume_refused"]["problems"] == info.value.problems
    assert info.value.problems[0].startswith(
        "train.model_name: this run trained m and this start names other"
    )
    # A resume of a run without identity.json and without a hold-out writes one.
    os.remove(run / "identity.json")
    assert records.settle_identity(run, "m", "r", resuming=True) is not None
    assert (run / "identity.json").exists()


# --- process.json -----------------------------------------------------------------------------------------------


@pytest.fixture
def sleeper() -> Any:
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    yield proc
    proc.kill()
    proc.wait()


def _hold_for(run: Path, pid: int, **more: Any) -> None:
    record = ProcessRecord(
        command=["platoon", "train", "c.yaml"],
        host=socket.gethostname(),
        pid=pid,
        start_time=records.process_start_time(pid),
    )
    records.write_json_atomic(run / "process.json", {**record.to_json(), **more})


def test_hold_run_dir_writes_process_json(tmp_path: Path) -> None:
    run = tmp_path / "run"
    record = hold_run_dir(run, command=["platoon", "train", "c.yaml"])
    data = json.loads((run / "process.json").read_text())
    assert list(data) == [
        "command",
        "host",
        "pid",
        "start_time",
        "label",
        "trainer_pid",
        "trainer_start_time",
    ]
    assert data["pid"] == os.getpid() and data["host"] == socket.gethostname() and data["label"] == "train"
    assert data["command"] == ["platoon", "train", "c.yaml"]
    if sys.platform.startswith("linux"):
        assert isinstance(data["start_time"], int)
    assert records.read_process(run) == record
    # This process holding it already is no refusal (a supervised child start re-checks).
    hold_run_dir(run)
    updated = records.update_process(run, trainer_pid=12345, trainer_start_time=7)
    assert updated.trainer_pid == 12345 and updated.pid == os.getpid()


def test_a_live_process_holds_the_run_dir(tmp_path: Path, sleeper: Any) -> None:
    run = tmp_path / "run"
    run.mkdir()
    _hold_for(run, sleeper.pid)
    before = (run / "process.json").read_text()
    with pytest.raises(RunDirInUse) as info:
        hold_run_dir(run)
    message = str(info.value)
    assert info.value.exit_code == 78 and "\n" not in message
    assert message.startswith(f"{run} is in use: process.json names pid {sleeper.pid} (train)")
    assert (run / "process.json").read_text() == before
    assert sorted(p.name for p in run.iterdir()) == ["process.json"]  # refused before anything is written


def test_a_live_trainer_holds_the_run_dir(tmp_path: Path, sleeper: Any) -> None:
    run = tmp_path / "run"
    run.mkdir()
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    _hold_for(
        run, dead.pid, trainer_pid=sleeper.pid, trainer_start_time=records.process_start_time(sleeper.pid)
    )
    with pytest.raises(RunDirInUse, match=f"is in use: process.json names trainer pid {sleeper.pid}"):
        records.check_run_dir_free(run)


def test_stale_process_json_is_taken_over(tmp_path: Path, sleeper: Any) -> None:
    run = tmp_path / "run"
    run.mkdir()
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    _hold_for(run, dead.pid)
    assert hold_run_dir(run).pid == os.getpid()
    # A live pid whose start time differs is a reused pid: stale.
    _hold_for(run, sleeper.pid, start_time=1)
    if sys.platform.startswith("linux"):
        assert hold_run_dir(run).pid == os.getpid()
    # Another host's record is not this host's business (reaping refuses it, training does not).
    _hold_for(run, sleeper.pid, host="some-other-host")
    assert hold_run_dir(run).pid == os.getpid()
    # Garbage is no hold.
    (run / "process.json").write_text("{cut off")
    assert hold_run_dir(run).pid == os.getpid()


# --- JSONL ------------------------------------------------------------------------------------------------------


def test_jsonl_readers_skip_bad_lines(tmp_path: Path) -> None:
    path = tmp_path / "x.jsonl"
    assert read_jsonl(path) == []
    path.write_bytes(b'{"a": 1}\n[1, 2]\n"text"\nnot json\n\n\xff\xfe\n{"b": 2}\n{"c": ')
    assert read_jsonl(path) == [{"a": 1}, {"b": 2}]


def test_appenders_cut_off_a_cut_off_line_and_keep_it_aside(tmp_path: Path, capsys: Any) -> None:
    path = tmp_path / "sub" / "x.jsonl"
    append_jsonl(path, {"a": 1})
    with open(path, "ab") as handle:
        handle.write(b'{"cut": ')  # a crash mid-write
    append_jsonl(path, {"b": Path("/p")})
    assert path.read_bytes() == b'{"a": 1}\n{"b": "/p"}\n'  # every line parses
    assert (tmp_path / "sub" / "x.jsonl.torn").read_bytes() == b'{"cut": \n'
    assert f"{path} ended in a cut-off row (8 bytes" in capsys.readouterr().err
    # a whole row that only lost its newline is kept
    with open(path, "ab") as handle:
        handle.write(b'{"whole": true}')
    append_jsonl(path, {"after": 1})
    assert read_jsonl(path) == [{"a": 1}, {"b": "/p"}, {"whole": True}, {"after": 1}]
    append_jsonl(path, {"c": "é"})
    assert read_jsonl(path)[-1] == {"c": "é"}


# --- TINKER_API_KEY ---------------------------------------------------------------------------------------------


def test_key_missing_and_malformed_are_one_line() -> None:
    for env, said in [
        ({}, MISSING_KEY),
        ({"TINKER_API_KEY": ""}, MISSING_KEY),
        (
            {"TINKER_API_KEY": "sk-secret-value"},
            "TINKER_API_KEY must start with tml-, as the Tinker client requires",
        ),
    ]:
        with pytest.raises(TinkerKeyError) as info:
            check_tinker_key(None, env)
        assert str(info.value) == said and info.value.exit_code == 78
        assert "secret" not in str(info.value)
    with pytest.raises(TinkerKeyError):
        check_tinker_key("https://tinker.example", {"TINKER_API_KEY": "x", "TINKER_BASE_URL": "local"})
    assert check_tinker_key(None, {"TINKER_API_KEY": "tml-abc"}) == "tml-abc"


def test_local_server_is_exempt() -> None:
    """The local server a command starts issues that command's key: TINKER_API_KEY is neither needed nor read."""
    assert check_tinker_key("local", {}) is None
    assert check_tinker_key("local", {"TINKER_API_KEY": "sk-nope"}) is None
    assert check_tinker_key("local", {"TINKER_API_KEY": "tml-mine"}) is None
    assert check_tinker_key(None, {"TINKER_BASE_URL": "local"}) is None
    assert uses_local_server(None, {"TINKER_BASE_URL": "local"})
    assert not uses_local_server("http://127.0.0.1:1", {"TINKER_BASE_URL": "local"})


class _Response:
    def __init__(self, body: Any, url: str) -> None:
        self._body = body
        self.text = body if isinstance(body, str) else json.dumps(body)
        self.request = type("R", (), {"url": url})()

    def json(self) -> Any:
        if isinstance(self._body, str):
            raise ValueError("not json")
        return self._body


def _status_error(
    code: int, body: Any, url: str = "https://user:pw@tinker.example:8443/api/v1/x?k=tml-q"
) -> Any:
    import httpx
    from tinker import APIStatusError

    request = httpx.Request("POST", url)
    response = httpx.Response(code, request=request, text=body if isinstance(body, str) else json.dumps(body))
    return APIStatusError("refused", response=response, body=body)


def test_refused_key_is_one_line_without_the_key() -> None:
    env = {"TINKER_API_KEY": "tml-very-secret"}
    error = refused_key_error(
        _status_error(401, {"detail": "invalid key tml-very-secret"}), what="a sampling client", env=env
    )
    assert error is not None and error.exit_code == 78
    assert str(error) == (
        "the Tinker service at https://tinker.example:8443 refused TINKER_API_KEY when asked for a sampling "
        "client (HTTP 401: invalid key TINKER_API_KEY): set TINKER_API_KEY to a key that service accepts"
    )
    nested = refused_key_error(_status_error(403, {"error": {"message": "forbidden\nhere"}}), env=env)
    assert (
        nested is not None and "(HTTP 403: forbidden here)" in str(nested) and "when asked" not in str(nested)
    )
    text = refused_key_error(_status_error(401, "x" * 500), env=env)
    assert text is not None and "\n" not in str(text)
    detail = str(text).split("HTTP 401: ", 1)[1].split("): set", 1)[0]
    assert len(detail) == 300


def test_refused_key_as_the_cause_of_a_future_error() -> None:
    try:
        try:
            raise _status_error(403, {"message": "no"})
        except Exception as exc:
            raise ValueError("future failed") from exc
    except ValueError as wrapped:
        error = refused_key_error(wrapped, env={})
    assert error is not None and "(HTTP 403: no)" in str(error)


def test_other_errors_are_not_refusals() -> None:
    assert refused_key_error(_status_error(500, {"detail": "boom"}), env={}) is None
    assert refused_key_error(ValueError("x"), env={}) is None
    assert refused_key_error(RuntimeError("y"), base_url="https://a.example", env={}) is None
    # Without a request on the error, the base URL names the service (its origin only).
    fake = type("E", (Exception,), {"status_code": 401, "body": {"detail": "bad"}})()
    error = refused_key_error(fake, base_url="https://u:p@svc.example/v1?x=1", env={})
    assert error is not None and str(error).startswith("the Tinker service at https://svc.example refused")


def test_a_supervised_child_start_may_check_its_supervisors_dir(tmp_path: Path) -> None:
    run = tmp_path / "run"
    hold_run_dir(run)  # this process plays the supervisor
    child = subprocess.run(
        [
            sys.executable,
            "-c",
            f"from platoon.rollouts import records; records.check_run_dir_free({str(run)!r})",
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert child.returncode == 0, child.stderr
