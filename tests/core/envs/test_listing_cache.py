"""The task listing cache: a `python://` environment listed once is listed again from `<cache>/task-listings`
without importing the openreward SDK, until its module or data files change; a cache that cannot be trusted is
ignored and rebuilt, never an error.

Each command runs in a fresh process (the SDK is imported once per process), which reports whether it imported
openreward.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
BANDIT = REPO / "examples" / "bandit" / "train.yaml"

# Runs `platoon ARGS...` in this process and prints, as its last line, the exit status and whether the command
# imported the SDK.
RUNNER = textwrap.dedent(
    """
    import json, sys
    from platoon.cli import main
    try:
        status = main(sys.argv[1:])
    except SystemExit as exc:
        status = exc.code
    print(json.dumps({"status": status, "sdk": "openreward" in sys.modules}))
    """
)

ENV_MODULE = textwrap.dedent(
    """
    import json
    from pathlib import Path

    from openreward.environments import Environment, TextBlock, ToolOutput, tool
    from pydantic import BaseModel

    DATA = Path(__file__).with_name("tasks.json")


    class Answer(BaseModel):
        text: str


    class ListedEnv(Environment):
        @classmethod
        def list_splits(cls):
            return ["train"]

        @classmethod
        def list_tasks(cls, split):
            return json.loads(DATA.read_text())

        def get_prompt(self):
            return [TextBlock(text="say something")]

        @tool
        async def answer(self, params: Answer) -> ToolOutput:
            return ToolOutput(blocks=[TextBlock(text="ok")], reward=1.0, finished=True)
    """
)


def _tasks(count: int) -> str:
    return json.dumps([{"id": f"t{i}", "goal": "say something"} for i in range(count)])


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """An environment package (module and data file side by side), a training config naming it, and a site
    profile whose cache root is in the test's directory."""
    package = tmp_path / "src" / "listedenv"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "env.py").write_text(ENV_MODULE)
    (package / "tasks.json").write_text(_tasks(8))
    (tmp_path / "train.yaml").write_text(
        textwrap.dedent(
            f"""
            log_path: {tmp_path / "runs"}
            tinker_base_url: local
            train:
              model_name: platoon/toy
              renderer_name: qwen3_instruct
              batch_size: 4
              max_training_steps: 2
            environments:
              - service: python://listedenv.env:ListedEnv
            stats:
              experiment_name: listed
              wandb:
                mode: disabled
            """
        )
    )
    (tmp_path / "site.yaml").write_text(f"cache: {tmp_path / 'cache'}\n")
    return tmp_path


def _run(project: Path, *args: str, cache: str | None = None) -> tuple[dict, str]:
    """Run `platoon ARGS` in a fresh process with the task cache on (or `PLATOON_TASK_CACHE=cache`); returns its
    report and its stdout."""
    env = {k: v for k, v in os.environ.items() if k != "PLATOON_TASK_CACHE"}
    env["PLATOON_SITE"] = str(project / "site.yaml")
    env["PYTHONPATH"] = os.pathsep.join([str(project / "src"), env.get("PYTHONPATH", "")])
    if cache is not None:
        env["PLATOON_TASK_CACHE"] = cache
    done = subprocess.run(
        [sys.executable, "-c", RUNNER, *args],
        env=env,
        cwd=project,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    *lines, last = done.stdout.strip().splitlines()
    return json.loads(last), "\n".join(lines)


def _validate(project: Path, cache: str | None = None) -> tuple[dict, str]:
    report, out = _run(project, "config", "validate", str(project / "train.yaml"), "--tasks", cache=cache)
    assert report["status"] == 0, out
    return report, out


def _cache_files(project: Path) -> list[Path]:
    return sorted((project / "cache" / "task-listings").glob("*.json"))


@pytest.mark.slow
def test_a_listing_is_answered_from_the_cache_without_the_sdk_until_its_data_or_module_changes(project):
    first, out = _validate(project)
    assert first["sdk"] and "training tasks: 8," in out
    assert len(_cache_files(project)) == 1

    again, out = _validate(project)
    assert not again["sdk"], "a cache hit imports no SDK"
    assert "training tasks: 8," in out

    # A changed data file beside the module is another environment: listed anew (and cached anew).
    (project / "src" / "listedenv" / "tasks.json").write_text(_tasks(12))
    changed, out = _validate(project)
    assert changed["sdk"] and "training tasks: 12," in out
    assert not _validate(project)[0]["sdk"]

    # So is a changed module.
    module = project / "src" / "listedenv" / "env.py"
    module.write_text(module.read_text() + "\n# edited\n")
    assert _validate(project)[0]["sdk"]


@pytest.mark.slow
def test_a_corrupt_or_foreign_cache_file_is_ignored_and_rewritten(project):
    _validate(project)
    (cached,) = _cache_files(project)
    foreign = json.dumps({"format": 1, "key": cached.stem, "listing": {"task_ids": [3]}}).encode()
    for payload in (b"{not json", foreign, b"\xff\xfe", b"[]"):
        cached.write_bytes(payload)
        report, out = _validate(project)
        assert report["sdk"] and "training tasks: 8," in out
        assert json.loads(cached.read_text())["listing"]["task_ids"][:2] == ["train:0", "train:1"]
    assert not _validate(project)[0]["sdk"]


@pytest.mark.slow
def test_a_cache_that_cannot_be_written_is_skipped_and_the_cache_can_be_turned_off(project):
    (project / "cache").write_text("a file where the cache root should be")
    report, out = _validate(project)
    assert report["sdk"] and "training tasks: 8," in out
    assert _validate(project)[0]["sdk"]  # nothing was cached

    (project / "cache").unlink()
    _validate(project, cache="0")
    assert not _cache_files(project)


@pytest.mark.slow
def test_an_unreadable_data_file_makes_the_listing_uncached(project):
    # A link to nothing cannot be read by anyone (a mode of 0 would not stop root, who runs CI).
    (project / "src" / "listedenv" / "notes.txt").symlink_to(project / "gone.txt")
    assert _validate(project)[0]["sdk"]
    assert not _cache_files(project)


@pytest.mark.slow
def test_the_bandit_example_validates_from_the_cache_without_the_sdk(tmp_path):
    (tmp_path / "site.yaml").write_text(f"cache: {tmp_path / 'cache'}\n")
    args = ("config", "validate", str(BANDIT), f"log_path={tmp_path / 'runs'}", "--tasks")
    first, out = _run(tmp_path, *args)
    assert first["status"] == 0 and "training tasks: 24," in out
    second, out = _run(tmp_path, *args)
    assert second["status"] == 0 and not second["sdk"]
    assert "training tasks: 24, drawn in epochs of 24 (3 batches of 8)" in out


def test_the_key_settles_on_the_environment_not_on_unrelated_settings(tmp_path, monkeypatch):
    from platoon.envs import listing_cache

    monkeypatch.delenv("PLATOON_TASK_CACHE")
    ref = "python://platoon.envs.bandit.env:BanditEnvironment"
    settings = {"splits": ["train"], "limit": None}
    key = listing_cache.listing_key(ref, {}, settings)
    assert key is not None and key == listing_cache.listing_key(ref, {}, dict(settings))
    assert listing_cache.listing_key(ref, {"split": "val"}, settings) != key
    assert listing_cache.listing_key(ref, {}, {**settings, "limit": 3}) != key
    # Only in-process ORS references are cached; an unknown module or a bad reference is listed as before.
    assert listing_cache.listing_key("table", {}, settings) is None
    assert listing_cache.listing_key("python://no_such_module_here:Env", {}, settings) is None
    assert listing_cache.listing_key("python://platoon.envs.bandit.env", {}, settings) is None
    monkeypatch.setenv("PLATOON_TASK_CACHE", "off")
    assert listing_cache.listing_key(ref, {}, settings) is None


def test_a_start_that_will_train_lists_afresh_when_the_cached_listing_is_stale(tmp_path, monkeypatch, capsys):
    """What the key cannot see (code outside the environment's directory, environment variables) can make a cached
    listing stale: a start that trains checks it against the service it builds anyway, says so in one line, drops
    the entry and trains on the fresh listing, instead of failing one group per task the service no longer has."""
    import asyncio

    from platoon.config import load_config
    from platoon.startup.training_preflight import preflight, relist_if_stale

    monkeypatch.delenv("PLATOON_TASK_CACHE")
    (tmp_path / "site.yaml").write_text(f"cache: {tmp_path / 'cache'}\n")
    monkeypatch.setenv("PLATOON_SITE", str(tmp_path / "site.yaml"))
    config = load_config(BANDIT, [f"log_path={tmp_path / 'runs'}"]).config

    async def start() -> list[str]:
        checked = await relist_if_stale(
            config, await preflight(config, base_dir=BANDIT.parent), base_dir=BANDIT.parent
        )
        return [task for pool in checked.pools for task in pool.task_ids]

    listed = asyncio.run(start())  # listed through the service, and cached
    (cached,) = list((tmp_path / "cache" / "task-listings").glob("*.json"))
    entry = json.loads(cached.read_text())
    entry["listing"]["task_ids"][0] = "train:999"  # a task the environment no longer has
    cached.write_text(json.dumps(entry))

    assert asyncio.run(start()) == listed
    err = capsys.readouterr().err
    assert (
        f"platoon: environments[default]: the task listing cached in {tmp_path / 'cache' / 'task-listings'} is "
        "stale (the service no longer lists 'train:999'): listing the tasks afresh\n"
    ) in err
    assert json.loads(cached.read_text())["listing"]["task_ids"] == listed  # cached anew, fresh
