"""`platoon rollout`: one task through its route on the policy of an evaluation or a training config, the agent
tree it prints (a root with subagents), the JSON summary, the ad-hoc run directory, and its refusals."""

from __future__ import annotations

import json
import re
import shutil
import textwrap
from pathlib import Path
from typing import Any

import pytest
import yaml
from eval_support import (
    HOSTED_KEY,
    HOSTED_KEY_ENV,
    binary_search,
    files_containing,
    number_search_eval,
    only_dir,
)

from platoon.cli import main
from platoon.testing import last_user_message, serve_policy

#: a harness whose root spawns two subagents (each one model call), then plays number search with platoon-react
TREE_HARNESS = """
import platoon as pt
from platoon.harness.agent import AgentResult
from platoon_harnesses.react import react


@pt.harness("tree-search")
async def tree_search(ctx):
    if ctx.depth > 0:
        reply = await ctx.chat([{"role": "user", "content": ctx.instruction}])
        return AgentResult(final_message=reply.text)
    await ctx.agents.spawn("Suggest a first guess for this range.", max_steps=1)
    await ctx.agents.spawn(
        "Check   the upper half of the range,\\n thoroughly, and report every number you would try there first.",
        max_steps=1,
    )
    return await react(ctx)
"""


def tree_policy(prompt: str) -> str:
    """Children get a plain answer; the root searches."""
    if last_user_message(prompt).startswith(("Suggest", "Check")):
        return "try the middle"
    return binary_search(prompt)


@pytest.fixture
def tree_config(workdir: Path, write_config: Any, monkeypatch: pytest.MonkeyPatch) -> Path:
    (workdir / "treeharness.py").write_text(TREE_HARNESS)
    monkeypatch.syspath_prepend(str(workdir))
    data = number_search_eval(workflow={"rollout_config": {"verbose": False, "max_steps": 20}})
    entry = data["environments"][0]
    entry.update(package="treeharness", harness="tree-search", agents={"max_depth": 1})
    return write_config(data)


def ids_masked(text: str) -> str:
    """The tree with its ids replaced: the collection id and the 8-character agent ids."""
    text = re.sub(r"^rollout \S+", "rollout ID", text)
    return re.sub(r"(policy|subagent) [0-9a-f-]{8}", r"\1 XXXXXXXX", text)


def test_rollout_prints_the_agent_tree_of_a_subagent_rollout(workdir, tree_config, capsys):
    with serve_policy(tree_policy):
        status = main(["rollout", str(tree_config), "--task", "val:0"])
    captured = capsys.readouterr()
    assert status == 0, captured.err
    run_dir = only_dir(workdir / "runs" / "adhoc")
    assert re.fullmatch(r"\d{8}T\d{6}Z-val-0", run_dir.name)
    collection = json.loads((run_dir / "trajectory_collection.json").read_text())
    root = next(iter(collection["trajectories"].values()))
    steps = len(root["steps"])
    assert ids_masked(captured.out) == textwrap.dedent(
        f"""\
        rollout ID  task val:0
        agents 3  steps {steps + 2}  max depth 1  reward 1  outcome scored [reward=1]
        policy XXXXXXXX  steps {steps}  reward 1  outcome scored [reward=1]
        ├─ subagent XXXXXXXX  steps 1  reward 1  goal 'Suggest a first guess for this range.'
        └─ subagent XXXXXXXX  steps 1  reward 1  goal 'Check the upper half of the range, thoroughly, and report...'
        """
    )
    # The ids shown are the trajectories' first 8 characters, children under their parent.
    ids = list(collection["trajectories"])
    assert captured.out.splitlines()[0] == f"rollout {collection['id']}  task val:0"
    shown = [line.lstrip("├└─│ ").split()[1] for line in captured.out.splitlines()[2:]]
    assert shown == [trajectory_id[:8] for trajectory_id in ids]
    # The run record: config snapshot, lock with the split's components, judges and policy, and the event file.
    lock = json.loads((run_dir / "lock.json").read_text())
    assert lock["judges"] == {"enabled": True}
    assert lock["policy"]["backend"] == "tinker" and lock["policy"]["model"] == "platoon/toy"
    assert {c["kind"] for c in lock["components"]} >= {
        "environment",
        "harness",
        "program",
        "service",
        "rollout",
    }
    harness = next(c for c in lock["components"] if c["kind"] == "harness")
    assert harness["resolved"] == "tree-search@1" and harness["source"] == "treeharness:tree_search"
    assert (run_dir / "config.resolved.yaml").is_file()
    [events] = list((run_dir / "rollouts" / "events").iterdir())
    assert events.name == f"events_val_0_{collection['id']}.jsonl"
    records = [json.loads(line) for line in events.read_text().splitlines()]
    assert [r["trajectory_id"] for r in records if r["type"] == "trajectory_created"] == ids
    assert not (run_dir / "process.json").exists()


def test_rollout_json_output_is_the_summary(workdir, tree_config, capsys):
    with serve_policy(tree_policy):
        status = main(
            ["rollout", str(tree_config), "--task", "val:1", "--json-output", "--output-dir", "mine"]
        )
    captured = capsys.readouterr()
    assert status == 0, captured.err
    summary = json.loads(captured.out)
    collection = json.loads((workdir / "mine" / "trajectory_collection.json").read_text())
    ids = list(collection["trajectories"])
    assert summary["id"] == collection["id"] and summary["task"] == "val:1"
    assert (summary["total_steps"], summary["max_depth"], summary["reward"]) == (
        sum(a["steps"] for a in summary["agents"]),
        1,
        1.0,
    )
    assert summary["outcome"]["status"] == "scored"
    root, first, second = summary["agents"]
    assert set(root) == {"id", "parent", "depth", "role", "goal", "steps", "reward", "outcome", "error"}
    assert (root["id"], root["parent"], root["depth"], root["role"]) == (ids[0], None, 0, "policy")
    assert root["goal"].startswith("Guess the correct number between")
    for child in (first, second):
        assert (child["parent"], child["depth"], child["role"], child["steps"]) == (ids[0], 1, "subagent", 1)
        assert child["outcome"] is None  # children share the episode's outcome
    assert first["goal"] == "Suggest a first guess for this range."


def test_rollout_on_a_training_config_samples_the_train_policy(
    workdir, write_config, capsys, monkeypatch, tinker_server
):
    monkeypatch.setenv("TINKER_API_KEY", tinker_server.api_key)  # the one key the server issued
    data = {
        "log_path": "logs",
        "tinker_base_url": tinker_server.base_url,
        "train": {
            "model_name": "platoon/toy",
            "renderer_name": "qwen3_instruct",
            "max_training_steps": 1,
            "workflow_config": {
                "rollout_config": {
                    "verbose": False,
                    "max_steps": 1,
                    "sampling_precedence": "config",
                    "inference_params": {"max_completion_tokens": 4},
                }
            },
        },
        "environments": [{"env": "platoon-number-search", "harness": "platoon-react"}],
    }
    config = write_config(data, "train.yaml")
    status = main(["rollout", str(config), "--task", "train:3", "--json-output"])
    captured = capsys.readouterr()
    assert status == 0, captured.err
    summary = json.loads(captured.out)
    [root] = summary["agents"]
    assert root["steps"] == 1 and summary["task"] == "train:3"
    run_dir = only_dir(workdir / "runs" / "adhoc")
    lock = json.loads((run_dir / "lock.json").read_text())
    port = tinker_server.base_url.rsplit(":", 1)[1].split("/")[0]
    assert lock["policy"] == {
        "backend": "tinker",
        "model": "platoon/toy",
        "model_path": None,
        "renderer": "qwen3_instruct",
        "base_url_origin": f"http://127.0.0.1:{port}",
    }
    assert not (workdir / "logs").exists()  # a rollout never writes into the training run's directory
    assert "sampling" not in captured.err  # no run, no checkpoint: the base model goes without saying
    assert files_containing(run_dir, tinker_server.api_key) == []


def test_rollout_against_a_hosted_model(workdir, write_config, capsys, hosted_server):
    hosted = {"base_url": hosted_server.base_url, "api_key_env": HOSTED_KEY_ENV}
    config = write_config(number_search_eval(model_name="my-hosted-model", renderer_name=None, hosted=hosted))
    status = main(["rollout", str(config), "--task", "val:0", "--model", "another-model"])
    captured = capsys.readouterr()
    assert status == 0, captured.err
    assert captured.out.splitlines()[1].endswith("reward 1  outcome scored [reward=1]")
    assert {s["body"]["model"] for s in hosted_server.seen} == {"another-model"}  # --model replaces it
    run_dir = only_dir(workdir / "runs" / "adhoc")
    lock = json.loads((run_dir / "lock.json").read_text())
    assert lock["policy"]["backend"] == "hosted" and lock["policy"]["model"] == "another-model"
    assert lock["policy"]["probe"] == {"ok": True, "dialects": ["openai_chat"]}
    assert files_containing(run_dir, HOSTED_KEY) == []


@pytest.mark.parametrize("flag", [["--renderer", "qwen3"], ["--model-path", "tinker://x/sampler_weights/1"]])
def test_tinker_settings_are_refused_for_a_hosted_model(workdir, write_config, capsys, hosted_server, flag):
    hosted = {"base_url": hosted_server.base_url, "api_key_env": HOSTED_KEY_ENV}
    config = write_config(number_search_eval(renderer_name=None, hosted=hosted))
    assert main(["rollout", str(config), "--task", "val:0", *flag]) == 64
    err = capsys.readouterr().err.splitlines()
    assert err[-1].startswith(f"platoon: {flag[0]} do not apply to a hosted model (inference.hosted is set)")
    assert not (workdir / "runs").exists()


def test_a_config_of_another_kind_is_refused(workdir, write_config, capsys):
    config = write_config({"environments": [{"env": "platoon-number-search"}]}, "envs.yaml")
    assert main(["rollout", str(config), "--task", "val:0"]) == 78
    captured = capsys.readouterr()
    assert captured.err == (
        "platoon: rollout needs a training config (train:) or an evaluation config (inference:)\n"
    )
    assert captured.out == ""


def test_rollout_needs_a_task(workdir, write_config, capsys):
    config = write_config(number_search_eval())
    assert main(["rollout", str(config)]) == 64
    assert capsys.readouterr().err == "platoon: rollout needs --task ID (ENVIRONMENT::TASK_ID in a mixture)\n"


def test_an_unknown_task_is_refused_before_anything_is_written(workdir, write_config, capsys):
    config = write_config(number_search_eval())
    with serve_policy(binary_search):
        assert main(["rollout", str(config), "--task", "val:99999"]) == 78
    err = capsys.readouterr().err.splitlines()
    assert err[-1].startswith("platoon: --task 'val:99999': environments[default] has no such task")
    assert not (workdir / "runs").exists()


def test_a_mixture_task_names_its_environment(workdir, write_config, capsys):
    data = number_search_eval()
    first = dict(data["environments"][0], name="small")
    second = dict(data["environments"][0], name="other")
    data["environments"] = [first, second]
    config = write_config(data)
    with serve_policy(binary_search):
        assert main(["rollout", str(config), "--task", "val:0"]) == 78
        assert "a mixture's tasks are ENVIRONMENT::TASK_ID" in capsys.readouterr().err
        assert main(["rollout", str(config), "--task", "other::val:0"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("rollout ") and "  task other::val:0\n" in out
    assert only_dir(workdir / "runs" / "adhoc").name.endswith("-other-val-0")


def test_the_run_dir_slug_and_tree_texts_follow_the_rules():
    from platoon.eval.one_task import task_slug
    from platoon.eval.policy import policy_slug
    from platoon.eval.tree import rollout_tree

    assert task_slug("env::train:41") == "env-train-41"
    assert task_slug("///") == "task"
    assert task_slug("x" * 70 + "/tail") == ("x" * 70 + "-tail")[-60:]
    assert policy_slug(None, "Qwen/Qwen3-4B-Instruct-2507") == "Qwen-Qwen3-4B-Instruct-2507"
    assert policy_slug("tinker://run-1/sampler_weights/000040", "m") == "run-1-sampler_weights-000040"
    assert policy_slug(None, "...") == "policy"
    assert len(policy_slug(None, "a" * 150)) == 100
    summary = {
        "id": "c1",
        "task": "t",
        "total_steps": 0,
        "max_depth": 2,
        "reward": None,
        "outcome": {"status": "invalid", "rewards": {}, "reason": "no   grader\nat all"},
        "agents": [
            {
                "id": "aaaaaaaaaa",
                "parent": None,
                "depth": 0,
                "role": "root",
                "goal": "g",
                "steps": 0,
                "reward": None,
                "outcome": {"status": "invalid", "rewards": {}, "reason": "self_grade"},
                "error": "Outcome invalid: self_grade",
            },
            {
                "id": "bbbbbbbbbb",
                "parent": "aaaaaaaaaa",
                "depth": 1,
                "role": "child",
                "goal": "x " * 40,
                "steps": 0,
                "reward": 0.5,
                "outcome": None,
                "error": None,
            },
            {
                "id": "cccccccccc",
                "parent": "bbbbbbbbbb",
                "depth": 2,
                "role": "child",
                "goal": "deep",
                "steps": 0,
                "reward": 0.25,
                "outcome": None,
                "error": None,
            },
            {
                "id": "dddddddddd",
                "parent": "aaaaaaaaaa",
                "depth": 1,
                "role": "child",
                "goal": "last",
                "steps": 0,
                "reward": 0.0,
                "outcome": None,
                "error": None,
            },
        ],
    }
    assert rollout_tree(summary).splitlines() == [
        "rollout c1  task t",
        "agents 4  steps 0  max depth 2  reward -  outcome invalid (no grader at all)",
        "root aaaaaaaa  steps 0  reward -  outcome invalid (self_grade)  error Outcome invalid: self_grade",
        "├─ child bbbbbbbb  steps 0  reward 0.5  goal '" + ("x " * 40)[:57] + "...'",
        "│  └─ child cccccccc  steps 0  reward 0.25  goal 'deep'",
        "└─ child dddddddd  steps 0  reward 0  goal 'last'",
    ]


def test_the_snapshot_of_a_rollout_loads_as_a_config(workdir, tree_config, capsys):
    with serve_policy(tree_policy):
        assert main(["rollout", str(tree_config), "--task", "val:0", "--output-dir", "out"]) == 0
    snapshot = yaml.safe_load((workdir / "out" / "config.resolved.yaml").read_text())
    assert snapshot["environments"][0]["env"] == "platoon-number-search@1"


def test_rollout_samples_a_saved_checkpoint(
    workdir, write_config, capsys, monkeypatch, tinker_server, request
):
    import tinker

    from platoon.gateway import tinker_sdk
    from platoon.gateway.tinker_service import close_session

    service = tinker.ServiceClient(base_url=tinker_server.base_url, api_key=tinker_server.api_key)
    request.addfinalizer(lambda: close_session(service))
    client = tinker_sdk.made(service.create_lora_training_client(base_model="platoon/toy", rank=8))
    path = client.save_weights_for_sampler("eval-test").result().path
    monkeypatch.setenv("TINKER_BASE_URL", tinker_server.base_url)
    monkeypatch.setenv("TINKER_API_KEY", tinker_server.api_key)  # the one key the server issued
    data = number_search_eval(
        workflow={
            "rollout_config": {
                "verbose": False,
                "max_steps": 1,
                "sampling_precedence": "config",
                "inference_params": {"max_completion_tokens": 4},
            }
        }
    )
    config = write_config(data)
    status = main(["rollout", str(config), "--task", "val:0", "--model-path", path])
    captured = capsys.readouterr()
    assert status == 0, captured.err
    assert captured.out.splitlines()[1].startswith("agents 1  steps 1  max depth 0  reward 0")
    lock = json.loads((only_dir(workdir / "runs" / "adhoc") / "lock.json").read_text())
    assert lock["policy"]["model_path"] == path


@pytest.mark.slow
def test_tinker_base_url_local_starts_the_local_server_for_the_command(
    workdir, write_config, capsys, monkeypatch
):
    profile = workdir / "site.yaml"
    profile.write_text(f"cache: {workdir / 'cache'}\n")
    monkeypatch.setenv("PLATOON_SITE", str(profile))
    monkeypatch.setenv("TINKER_BASE_URL", "local")  # and no TINKER_API_KEY: the local server needs none
    data = number_search_eval(
        workflow={
            "rollout_config": {
                "verbose": False,
                "max_steps": 1,
                "sampling_precedence": "config",
                "inference_params": {"max_completion_tokens": 4},
            }
        }
    )
    config = write_config(data)
    status = main(["rollout", str(config), "--task", "val:0", "--json-output"])
    captured = capsys.readouterr()
    assert status == 0, captured.err
    assert "platoon: starting the local Tinker-compatible server for platoon/toy" in captured.err
    assert json.loads(captured.out)["agents"][0]["steps"] == 1
    assert (workdir / "cache" / "local-tinker").is_dir()  # its state under the site cache
    lock = json.loads((only_dir(workdir / "runs" / "adhoc") / "lock.json").read_text())
    assert lock["policy"]["base_url_origin"] == "local"


def test_an_unknown_task_is_refused_before_the_local_server_starts(
    workdir, write_config, capsys, monkeypatch
):
    """The task is resolved first: an unknown one is refused (78) with nothing written, and no local server was
    started for it (its state directory under the site cache never appears)."""
    import os

    profile = workdir / "site.yaml"
    profile.write_text(f"cache: {workdir / 'cache'}\n")
    monkeypatch.setenv("PLATOON_SITE", str(profile))
    monkeypatch.setenv("TINKER_BASE_URL", "local")
    config = write_config(number_search_eval())
    assert main(["rollout", str(config), "--task", "val:99999"]) == 78
    err = capsys.readouterr().err.splitlines()
    assert err[-1].startswith("platoon: --task 'val:99999': environments[default] has no such task")
    assert not any("local Tinker" in line for line in err)
    assert not (workdir / "cache" / "local-tinker").exists()
    assert not (workdir / "runs").exists()
    children = [
        pid
        for pid in os.listdir("/proc")
        if pid.isdigit()
        and _parent_of(pid) == os.getpid()
        and b"platoon.local_server.process" in _cmdline(pid)
    ]
    assert not children


def test_rollout_of_a_trained_run_samples_its_newest_checkpoint(
    workdir, write_config, capsys, monkeypatch, tinker_server, request
):
    """A training config whose run saved checkpoints (or that run's directory) samples the newest sampler
    checkpoint not since deleted, and says so; `--base` samples the base model."""
    import tinker

    from platoon.gateway import tinker_sdk
    from platoon.gateway.tinker_service import close_session

    service = tinker.ServiceClient(base_url=tinker_server.base_url, api_key=tinker_server.api_key)
    request.addfinalizer(lambda: close_session(service))
    client = tinker_sdk.made(service.create_lora_training_client(base_model="platoon/toy", rank=8))
    saved = [client.save_weights_for_sampler(name).result().path for name in ("000001", "000002", "000003")]
    monkeypatch.setenv("TINKER_API_KEY", tinker_server.api_key)
    data = {
        "log_path": "logs",
        "tinker_base_url": tinker_server.base_url,
        "train": {
            "model_name": "platoon/toy",
            "renderer_name": "qwen3_instruct",
            "max_training_steps": 3,
            "workflow_config": {
                "rollout_config": {
                    "verbose": False,
                    "max_steps": 1,
                    "sampling_precedence": "config",
                    "inference_params": {"max_completion_tokens": 4},
                }
            },
        },
        "environments": [{"env": "platoon-number-search", "harness": "platoon-react"}],
        "stats": {"experiment_name": "search", "wandb": {"mode": "disabled"}},
    }
    config = write_config(data, "train.yaml")
    run = workdir / "logs" / "search" / "run"

    def roll_out(*args: str) -> tuple[str | None, list[str]]:
        """(the model_path the rollout's lock records, its stderr lines)."""
        status = main(["rollout", *args, "--task", "train:3", "--output-dir", "out"])
        captured = capsys.readouterr()
        assert status == 0, captured.err
        lock = json.loads((workdir / "out" / "lock.json").read_text())
        shutil.rmtree(workdir / "out")
        return lock["policy"]["model_path"], captured.err.splitlines()

    run.mkdir(parents=True)
    rows = [
        {"name": name, "kind": "permanent", "batch": batch, "state_path": None, "sampler_path": sampler}
        for batch, (name, sampler) in enumerate(zip(("000001", "000002", "000003"), saved, strict=True), 1)
    ]
    (run / "checkpoints.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    (run / "checkpoints_deleted.jsonl").write_text(json.dumps({"path": saved[2], "name": "000003"}) + "\n")
    path, err = roll_out(str(config))
    assert path == saved[1]  # the newest whose sampler weights still exist
    assert (
        f"platoon: sampling checkpoint 000002 (step 2) of {run}; pass --base to sample the base model" in err
    )

    (run / "config.resolved.yaml").write_text(config.read_text())
    assert roll_out(str(run))[0] == saved[1]  # the run's directory names the same run
    assert roll_out(str(config), "--base")[0] is None
    assert main(["rollout", str(config), "--task", "train:3", "--base", "--model-path", saved[0]]) == 64
    assert "--base samples the base model and --model-path a checkpoint" in capsys.readouterr().err
    assert main(["rollout", str(workdir), "--task", "train:3"]) == 78
    assert "a directory without config.resolved.yaml" in capsys.readouterr().err


def _parent_of(pid: str) -> int | None:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None


def _cmdline(pid: str) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""
