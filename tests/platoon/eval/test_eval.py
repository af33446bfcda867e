"""`platoon eval` end to end on number search: a scripted policy served in process, the local Tinker-compatible
server, and a hosted OpenAI-compatible model; the report field by field, the run record, fresh directories per
start, the provenance refusal, resume, and the refusals that come before anything is written.
"""

from __future__ import annotations

import gc
import json
import time
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
from platoon.testing import Completion, serve_policy


def guesses_to_find(task_id: str) -> int:
    """How many guesses the binary search makes on a number-search val task (its steps)."""
    from platoon.envs.number_search.env import task_spec

    misc = task_spec("val", int(task_id.split(":")[1]))["misc"]
    low, high, target, guesses = misc["low"], misc["high"], misc["target"], 0
    while True:
        guesses += 1
        guess = (low + high) // 2
        if guess == target:
            return guesses
        low, high = (guess + 1, high) if guess < target else (low, guess - 1)


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, list[str]]:
    status = main(argv)
    captured = capsys.readouterr()
    return status, captured.out, captured.err.splitlines()


def problems(err: list[str]) -> list[str]:
    """The stderr lines other than the site-profile and sample-timeout notes every start prints."""
    notes = ("platoon: no site profile", "platoon: site profile", "platoon: sample timeout")
    return [line for line in err if not line.startswith(notes)]


def rows(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def stats(values: list[float]) -> dict[str, Any]:
    return {"count": len(values), "mean": sum(values) / len(values), "min": min(values), "max": max(values)}


EMPTY = {"count": 0, "mean": None, "min": None, "max": None}


# ---------------------------------------------------------------------------------------------------------------
# A scripted policy, served in process


def test_eval_on_number_search_writes_the_report_field_by_field(workdir, write_config, capsys):
    config = write_config(number_search_eval())
    started = time.monotonic()
    with serve_policy(binary_search) as policy:
        status, out, err = run(["eval", str(config)], capsys)
    command_seconds = time.monotonic() - started
    assert status == 0, err
    out_dir = only_dir(workdir / "runs" / "eval" / "platoon-toy")
    assert "platoon: rolling out 2 tasks x 2 on split eval (4 at once)" in err
    assert f"platoon: inference.output_dir is not set, so this evaluation writes to {out_dir}" in err, err
    assert out_dir.name.endswith("Z") and len(out_dir.name) == len("20250101T000000Z")

    steps = {task: guesses_to_find(task) for task in ("val:0", "val:1")}
    assert len(policy.calls) == 2 * sum(steps.values())
    all_steps = [float(steps[t]) for t in ("val:0", "val:0", "val:1", "val:1")]
    report = json.loads((out_dir / "reports" / "final_report.json").read_text())
    summary = report["summary"]
    assert json.loads(out) == summary  # the summary is what the command prints
    elapsed = summary.pop("elapsed_seconds")
    assert 0 < elapsed <= command_seconds  # the evaluation's own time, inside the command's
    assert summary == {
        "total_tasks": 2,
        "tasks_without_valid_rollouts": 0,
        "total_rollouts": 4,
        "valid_rollouts": 4,
        "successful_rollouts": 4,
        "failed_rollouts": 0,
        "errored_rollouts": 0,
        "outcome_status_counts": {"scored": 4},
        "reward_key_counts": {"reward": 4},
        "success_rate": 1.0,
        "success_at_k": 1.0,
        "reward_mean": 1.0,
        "reward_max": 1.0,
        "reward_min": 1.0,
        "reward_at_k_mean": 1.0,
        "reward_at_k_max": 1.0,
        "reward_at_k_min": 1.0,
    }
    assert report["stats"]["num_steps_total"] == {
        "overall": stats(all_steps),
        "success": stats(all_steps),
        "failure": EMPTY,
    }
    assert report["stats"]["num_steps_root"] == report["stats"]["num_steps_total"]
    assert report["stats"]["num_steps_subtrajectories"]["overall"] == stats([0.0] * 4)
    wall = report["stats"]["rollout_wall_time_seconds"]
    assert wall["overall"]["count"] == 4 and wall["failure"] == EMPTY
    assert report["reward_components"]["overall"] == {"reward/success": stats([1.0] * 4)}
    assert report["reward_components"]["at_k_mean"] == {"reward/success": 1.0}
    assert report["subtrajectory_stats_by_depth"] == {}
    assert report["workflow_specific_metrics"] == {"rollouts_run": 4, "rollouts_reused": 0}
    assert report["workflow_config"]["num_rollouts_per_task"] == 2
    assert report["workflow_config"]["success_threshold"] == 1.0
    assert report["model"] == {
        "model_name": "platoon/toy",
        "model_path": None,
        "renderer_name": "qwen3_instruct",
        "backend": "tinker",
        "base_url_origin": None,
        "served_models": ["platoon/toy"],
    }
    calls = 2 * sum(steps.values())
    policy_usage = report["usage"]["policy"]
    assert policy_usage["total"]["calls"] == calls
    assert policy_usage["mean_per_rollout"]["calls"] == calls / 4
    assert (
        policy_usage["total"]["total_tokens"]
        == (policy_usage["total"]["prompt_tokens"] + policy_usage["total"]["completion_tokens"])
        > 0
    )
    assert report["usage"]["judge"]["total"]["calls"] == 0
    assert report["cost"] == {"total_usd": None, "mean_usd_per_rollout": None, "unpriced_calls": calls}
    assert report["backend"] == {
        "attempts": calls,
        "rate_limited": 0,
        "failed_calls": 0,
        "refusals": 0,
        "calls_without_usage": 0,
        "rollouts_with_failed_calls": 0,
        "served_models": ["platoon/toy"],
    }
    assert report["judges"] == {
        "enabled": True,
        "verifier_agents": 0,
        "verifier_steps": 0,
        "judge_calls": 0,
        "refused": 0,
        "children_sharing_episode_outcome": 0,
    }

    # task_results.jsonl: one task a line, the same summaries as the report's `tasks`.
    tasks = rows(out_dir / "reports" / "task_results.jsonl")
    assert tasks == report["tasks"]
    assert [t["task_id"] for t in tasks] == ["val:0", "val:1"]
    for task in tasks:
        assert {k: task[k] for k in task if k != "rollouts"} == {
            "task_id": task["task_id"],
            "label": "default",
            "total_rollouts": 2,
            "valid_rollouts": 2,
            "successful_rollouts": 2,
            "failed_rollouts": 0,
            "errored_rollouts": 0,
            "success_at_k": 1.0,
            "success_rate_within_task": 1.0,
            "reward_at_k": {"mean": 1.0, "max": 1.0, "min": 1.0},
        }
        assert [r["rollout_index"] for r in task["rollouts"]] == [0, 1]

    # Each rollout: its trajectories, its record and its event file, under rollouts/<safe task id>/rollout_<i>/.
    for task_id in ("val:0", "val:1"):
        for index in (0, 1):
            where = out_dir / "rollouts" / task_id.replace(":", "_") / f"rollout_{index}"
            meta = json.loads((where / "metadata.json").read_text())
            collection = json.loads((where / "trajectory_collection.json").read_text())
            assert meta["task_id"] == task_id and meta["rollout_index"] == index
            assert (
                meta["source_path"]
                == f"rollouts/{task_id.replace(':', '_')}/rollout_{index}/trajectory_collection.json"
            )
            assert meta["status"] == "completed" and meta["error"] is None
            assert (meta["outcome_status"], meta["reward_key"], meta["reward"]) == ("scored", "reward", 1.0)
            assert meta["provenance"] == {
                "judges": True,
                "backend": "tinker",
                "model": "platoon/toy",
                "model_path": None,
                "renderer": "qwen3_instruct",
            }
            assert meta["steps"] == {"total": steps[task_id], "root": steps[task_id], "subtrajectories": 0}
            assert meta["usage"]["policy"]["calls"] == steps[task_id]
            for key in ("wall_time_seconds", "created_at", "cost", "backend", "judges"):
                assert key in meta
            [events] = list((where / "events").iterdir())
            assert events.name == f"events_{task_id.replace(':', '_')}_{collection['id']}.jsonl"
            kinds = [e["type"] for e in rows(events)]
            assert kinds == ["trajectory_created", "trajectory_task_set"] + ["trajectory_step_added"] * steps[
                task_id
            ] + ["trajectory_finished"]

    # The run record: the snapshot names the chosen directory; the lock records judges, policy and parsing.
    snapshot = yaml.safe_load((out_dir / "config.resolved.yaml").read_text())
    assert snapshot["inference"]["output_dir"] == str(out_dir)
    lock = json.loads((out_dir / "lock.json").read_text())
    assert lock["judges"] == {"enabled": True}
    assert lock["policy"] == {
        "backend": "tinker",
        "model": "platoon/toy",
        "model_path": None,
        "renderer": "qwen3_instruct",
        "base_url_origin": None,
    }
    assert lock["tool_call_parsing"]["renderer_name"] == "qwen3_instruct"
    assert lock["excluded_tasks"] == {"default": {"val": {"listed": 1000, "excluded": []}}}
    kinds = {c["kind"]: c for c in lock["components"]}
    assert kinds["harness"]["resolved"] == "platoon-react@1"
    assert kinds["harness"]["distribution"] == "platoon-harnesses"
    assert kinds["environment"]["ref"] == "platoon-number-search@1"
    assert not (out_dir / "process.json").exists()  # released at the end


def test_a_second_start_writes_a_new_directory(workdir, write_config, capsys, monkeypatch):
    from platoon.eval import evaluator

    config = write_config(number_search_eval(workflow={"num_rollouts_per_task": 1}))
    # Both starts in the same second: the second takes the next suffix.
    monkeypatch.setattr(evaluator, "_stamp", lambda now: "20250102T030405Z")
    with serve_policy(binary_search):
        for _ in range(3):
            assert main(["eval", str(config), "environments.0.eval_dataset_kwargs.limit=1"]) == 0
    base = workdir / "runs" / "eval" / "platoon-toy"
    assert sorted(p.name for p in base.iterdir()) == [
        "20250102T030405Z",
        "20250102T030405Z-2",
        "20250102T030405Z-3",
    ]
    err = capsys.readouterr().err
    assert f"writes to {base / '20250102T030405Z-3'}" in err
    for run_dir in base.iterdir():  # each start rolled out its own task
        assert (run_dir / "reports" / "final_report.json").is_file()


def test_the_site_profiles_runs_hold_fresh_evaluations(workdir, write_config, capsys, monkeypatch):
    profile = workdir / "site.yaml"
    profile.write_text(f"runs: {workdir / 'site-runs'}\n")
    monkeypatch.setenv("PLATOON_SITE", str(profile))
    config = write_config(number_search_eval(model_path="tinker://run-1/sampler_weights/000040"))
    with serve_policy(binary_search):
        status = main(["eval", str(config), "environments.0.eval_dataset_kwargs.limit=1"])
    err = capsys.readouterr().err
    assert status == 0, err
    out_dir = only_dir(workdir / "site-runs" / "eval" / "run-1-sampler_weights-000040")
    assert f"writes to {out_dir}, under the site profile's runs" in err


def test_an_output_dir_holding_another_policys_rollouts_is_refused(workdir, write_config, capsys):
    out_dir = workdir / "shared-out"
    config = write_config(number_search_eval(output_dir=str(out_dir), workflow={"num_rollouts_per_task": 1}))
    with serve_policy(binary_search):
        assert main(["eval", str(config), "environments.0.eval_dataset_kwargs.limit=1"]) == 0
        capsys.readouterr()
        before = sorted(p.relative_to(out_dir) for p in out_dir.rglob("*"))
        for override in ("inference.model_name=other/model", "inference.judges=false"):
            status, out, err = run(["eval", str(config), override], capsys)
            assert status == 78
            assert out == ""
            [line] = problems(err)
            assert line.startswith(
                f"platoon: inference.output_dir: {out_dir} holds rollouts made by another policy or judges setting"
            ), err
        # Nothing was written: no record, no lock rewrite, no rollout.
        assert sorted(p.relative_to(out_dir) for p in out_dir.rglob("*")) == before
        # The same policy resumes: the completed rollout is kept, not rolled out again.
        status, out, err = run(["eval", str(config), "environments.0.eval_dataset_kwargs.limit=1"], capsys)
    assert status == 0, err
    report = json.loads((out_dir / "reports" / "final_report.json").read_text())
    assert report["workflow_specific_metrics"] == {"rollouts_run": 0, "rollouts_reused": 1}


def test_an_output_dir_in_use_is_refused(workdir, write_config, capsys):
    import socket
    import subprocess

    out_dir = workdir / "busy"
    out_dir.mkdir()
    holder = subprocess.Popen(["sleep", "60"])
    try:
        record = {
            "command": ["platoon", "eval"],
            "host": socket.gethostname(),
            "pid": holder.pid,
            "label": "eval",
        }
        (out_dir / "process.json").write_text(json.dumps(record))
        config = write_config(number_search_eval(output_dir=str(out_dir)))
        with serve_policy(binary_search):
            status, _, err = run(["eval", str(config)], capsys)
    finally:
        holder.kill()
        holder.wait()
    assert status == 78
    assert problems(err) == [
        f"platoon: inference.output_dir: {out_dir} is in use: process.json names pid {holder.pid} (eval) running "
        "on this host; stop that evaluation, or set another inference.output_dir (or none, for a fresh directory)"
    ]
    assert sorted(p.name for p in out_dir.iterdir()) == ["process.json"]


def test_rollouts_without_provenance_count_as_tinker_with_judges(
    workdir, write_config, capsys, hosted_server
):
    out_dir = workdir / "legacy"
    record = out_dir / "rollouts" / "val_0" / "rollout_0" / "metadata.json"
    record.parent.mkdir(parents=True)
    record.write_text(json.dumps({"task_id": "val:0", "rollout_index": 0, "status": "completed"}))
    hosted = {"base_url": hosted_server.base_url, "api_key_env": HOSTED_KEY_ENV}
    config = write_config(number_search_eval(renderer_name=None, hosted=hosted, output_dir=str(out_dir)))
    status, _, err = run(["eval", str(config)], capsys)
    assert status == 78
    assert "backend 'tinker' (this evaluation: 'hosted')" in err[-1]
    assert hosted_server.seen == []  # refused before the probe


def test_resume_keeps_completed_rollouts_and_retries_errored_ones(workdir, write_config, capsys):
    out_dir = workdir / "out"
    config = write_config(number_search_eval(output_dir=str(out_dir)))
    with serve_policy(binary_search) as policy:
        assert main(["eval", str(config)]) == 0
        first_calls = len(policy.calls)
        errored = out_dir / "rollouts" / "val_1" / "rollout_0" / "metadata.json"
        meta = json.loads(errored.read_text())
        errored.write_text(json.dumps({**meta, "status": "errored", "error": "boom"}))
        assert main(["eval", str(config)]) == 0
        assert len(policy.calls) == first_calls + guesses_to_find("val:1")
        # retry_errored: false keeps the errored record, and the report counts it as an error.
        errored.write_text(json.dumps({**meta, "status": "errored", "error": "boom"}))
        capsys.readouterr()
        status, out, _ = run(["eval", str(config), "inference.retry_errored=false"], capsys)
        assert len(policy.calls) == first_calls + guesses_to_find("val:1")
    assert status == 0
    summary = json.loads(out)
    assert (summary["valid_rollouts"], summary["errored_rollouts"], summary["failed_rollouts"]) == (3, 1, 0)
    assert summary["success_rate"] == 1.0  # successful / valid: the errored rollout is no failure


def test_unscored_rollouts_are_errors_not_failures(workdir, write_config, capsys):
    # A task table has no grader: every outcome is invalid, so no rollout is valid and none failed.
    data = {
        "inference": {
            "model_name": "platoon/toy",
            "renderer_name": "qwen3_instruct",
            "workflow": {"rollout_config": {"verbose": False, "max_steps": 2}},
        },
        "environments": [
            {
                "service": "table",
                "service_kwargs": {"rows": [{"id": "t1", "goal": "say hi", "split": "test"}]},
                "harness": "platoon-react",
            }
        ],
        "split": "test",
    }
    config = write_config(data)
    with serve_policy(lambda prompt: "hi"):
        status, out, err = run(["eval", str(config)], capsys)
    assert status == 0, err
    summary = json.loads(out)
    summary.pop("elapsed_seconds")
    assert summary == {
        "total_tasks": 1,
        "tasks_without_valid_rollouts": 1,
        "total_rollouts": 1,
        "valid_rollouts": 0,
        "successful_rollouts": 0,
        "failed_rollouts": 0,
        "errored_rollouts": 1,
        "outcome_status_counts": {"invalid": 1},
        "reward_key_counts": {},
        "success_rate": None,
        "success_at_k": None,
        "reward_mean": None,
        "reward_max": None,
        "reward_min": None,
        "reward_at_k_mean": None,
        "reward_at_k_max": None,
        "reward_at_k_min": None,
    }
    out_dir = only_dir(workdir / "runs" / "eval" / "platoon-toy")
    meta = json.loads((out_dir / "rollouts" / "t1" / "rollout_0" / "metadata.json").read_text())
    assert meta["status"] == "errored" and meta["reward"] is None
    assert meta["error"].startswith("Outcome invalid")


def test_judges_off_is_recorded_and_verifier_grading_read_by_a_custom_program_is_refused(
    workdir, write_config, capsys, monkeypatch
):
    data = number_search_eval(judges=False, workflow={"num_rollouts_per_task": 1})
    data["environments"][0]["agents"] = {"max_depth": 1, "child_grading": "verifier"}
    config = write_config(data)
    with serve_policy(binary_search):
        status, _, err = run(["eval", str(config)], capsys)
        assert status == 0, err
        out_dir = only_dir(workdir / "runs" / "eval" / "platoon-toy")
        lock = json.loads((out_dir / "lock.json").read_text())
        assert lock["judges"] == {
            "enabled": False,
            "child_grading": {
                "default": {"configured": "verifier", "applied": "none", "reason": "judges_off"}
            },
        }
        report = json.loads((out_dir / "reports" / "final_report.json").read_text())
        assert report["judges"]["enabled"] is False
        meta = json.loads((out_dir / "rollouts" / "val_0" / "rollout_0" / "metadata.json").read_text())
        assert meta["provenance"]["judges"] is False and meta["judges"]["enabled"] is False
        collection = json.loads(
            (out_dir / "rollouts" / "val_0" / "rollout_0" / "trajectory_collection.json").read_text()
        )
        root = next(iter(collection["trajectories"].values()))
        assert root["misc"]["judges"] == {"enabled": False}

        # A program of the user's own might read the verdicts the evaluation turned off: refused at start.
        (workdir / "judgesprog.py").write_text(
            "import platoon as pt\n\n\n@pt.program('reads-verdicts')\nasync def reads(ep):\n    raise AssertionError\n"
        )
        monkeypatch.syspath_prepend(str(workdir))
        extra = ["environments.0.package=judgesprog", "environments.0.program=reads-verdicts"]
        status, _, err = run(["eval", str(config), *extra], capsys)
    assert status == 78
    assert problems(err) == [
        "platoon: environments.0: agents.child_grading is verifier and its program 'reads-verdicts' may read the "
        "verifiers' verdicts, which inference.judges: false turns off; set inference.judges: true, or grade "
        "children another way"
    ]


def test_timeouts_are_errors_unless_counted_as_failures_and_fail_fast_stops(workdir, write_config, capsys):
    data = number_search_eval(workflow={"num_rollouts_per_task": 1})
    data["environments"][0]["eval_dataset_kwargs"]["limit"] = 1
    config = write_config(data)
    # the root's time limit, shorter than the policy's first answer takes: a rollout that never waits (an instant
    # policy, an environment answering in process) gives asyncio's timeout no moment to end it
    too_short = "inference.workflow.rollout_config.timeout=0.01"

    def slow_binary_search(prompt: str) -> Completion:
        return Completion(binary_search(prompt), delay=0.5)

    with serve_policy(slow_binary_search):
        status, out, err = run(["eval", str(config), too_short], capsys)
        assert status == 0, err
        summary = json.loads(out)
        assert summary["outcome_status_counts"] == {"timeout": 1}
        assert (summary["errored_rollouts"], summary["failed_rollouts"]) == (1, 0)

        counted = "inference.workflow.count_timeout_as_failure=true"
        status, out, err = run(["eval", str(config), too_short, counted], capsys)
        assert status == 0, err
        summary = json.loads(out)
        assert (summary["errored_rollouts"], summary["failed_rollouts"], summary["reward_mean"]) == (
            0,
            1,
            0.0,
        )

        status, out, err = run(["eval", str(config), too_short, "inference.workflow.fail_fast=true"], capsys)
    assert status == 1
    assert out == ""
    assert err[-1].startswith("platoon: 1 of 1 rollouts errored and inference.workflow.fail_fast is set")


def test_stage_rollouts_then_stage_report(workdir, write_config, capsys):
    out_dir = workdir / "out"
    config = write_config(number_search_eval(output_dir=str(out_dir)))
    with serve_policy(binary_search):
        status, out, _ = run(["eval", str(config), "stage=rollouts"], capsys)
    assert status == 0
    assert json.loads(out) == {
        "stage": "rollouts",
        "output_dir": str(out_dir),
        "total_rollouts": 4,
        "errored_rollouts": 0,
        "rollouts_run": 4,
        "rollouts_reused": 0,
    }
    assert not (out_dir / "reports").exists()
    # stage: report needs no policy, key or service: it reads the records.
    status, out, err = run(["eval", str(config), "stage=report", "--prepare"], capsys)
    assert status == 0, err
    assert "--prepare is ignored with stage: report" in err[0]
    summary = json.loads(out)
    assert (summary["total_rollouts"], summary["successful_rollouts"], summary["success_rate"]) == (4, 4, 1.0)
    assert (out_dir / "reports" / "task_results.jsonl").is_file()


# ---------------------------------------------------------------------------------------------------------------
# Refusals before anything is written


def test_a_missing_tinker_key_is_one_line_and_78_before_anything_is_written(workdir, write_config, capsys):
    config = write_config(number_search_eval())
    status, out, err = run(["eval", str(config)], capsys)
    assert status == 78
    assert out == ""
    assert problems(err) == [
        "platoon: TINKER_API_KEY is not set: the policy is sampled through Tinker, which needs it; for the "
        "embedded local server, which needs none, set TINKER_BASE_URL=local (or tinker_base_url: local in the "
        "config)"
    ]
    assert not (workdir / "runs").exists()


def test_stage_report_needs_an_output_dir(workdir, write_config, capsys):
    config = write_config(number_search_eval())
    status, _, err = run(["eval", str(config), "stage=report"], capsys)
    assert status == 78
    assert err == [
        "platoon: stage: report rebuilds the report of an existing evaluation: set inference.output_dir to its "
        "directory"
    ]


def test_an_unknown_harness_is_refused_before_anything_is_written(workdir, write_config, capsys):
    data = number_search_eval()
    data["environments"][0]["harness"] = "platoon-nothing"
    config = write_config(data)
    with serve_policy(binary_search):
        status, _, err = run(["eval", str(config)], capsys)
    assert status == 78
    assert "environments.0.harness: unknown harness 'platoon-nothing'" in "\n".join(err)
    assert not (workdir / "runs").exists()


# ---------------------------------------------------------------------------------------------------------------
# The local Tinker-compatible server


def test_eval_on_number_search_against_the_local_server(
    workdir, write_config, capsys, monkeypatch, tinker_server
):
    monkeypatch.setenv("TINKER_BASE_URL", tinker_server.base_url)
    monkeypatch.setenv("TINKER_API_KEY", tinker_server.api_key)  # the one key the server issued
    # The random toy model writes bytes, not tool calls: each episode ends after its first reply, scored 0.
    data = number_search_eval(
        workflow={
            "num_rollouts_per_task": 1,
            "rollout_config": {
                "verbose": False,
                "max_steps": 2,
                # the config's budget binds policy calls under `sampling_precedence: config`
                "sampling_precedence": "config",
                "inference_params": {"max_completion_tokens": 8},
            },
        }
    )
    config = write_config(data)
    status, out, err = run(["eval", str(config)], capsys)
    assert status == 0, err
    summary = json.loads(out)
    summary.pop("elapsed_seconds")
    assert summary == {
        "total_tasks": 2,
        "tasks_without_valid_rollouts": 0,
        "total_rollouts": 2,
        "valid_rollouts": 2,
        "successful_rollouts": 0,
        "failed_rollouts": 2,
        "errored_rollouts": 0,
        "outcome_status_counts": {"scored": 2},
        "reward_key_counts": {},  # platoon gave the zero itself: no grader's key to count
        "success_rate": 0.0,
        "success_at_k": 0.0,
        "reward_mean": 0.0,
        "reward_max": 0.0,
        "reward_min": 0.0,
        "reward_at_k_mean": 0.0,
        "reward_at_k_max": 0.0,
        "reward_at_k_min": 0.0,
    }
    out_dir = only_dir(workdir / "runs" / "eval" / "platoon-toy")
    report = json.loads((out_dir / "reports" / "final_report.json").read_text())
    port = tinker_server.base_url.rsplit(":", 1)[1].split("/")[0]
    assert report["model"]["base_url_origin"] == f"http://127.0.0.1:{port}"
    assert report["stats"]["num_steps_total"]["failure"]["count"] == 2
    assert report["usage"]["policy"]["total"]["completion_tokens"] <= 2 * 2 * 8
    lock = json.loads((out_dir / "lock.json").read_text())
    assert lock["policy"]["base_url_origin"] == f"http://127.0.0.1:{port}"
    assert files_containing(out_dir, tinker_server.api_key) == []


def test_a_refused_tinker_key_is_one_line_and_78(
    workdir, write_config, capsys, monkeypatch, refusing_service
):
    monkeypatch.setenv("TINKER_BASE_URL", refusing_service)
    monkeypatch.setenv("TINKER_API_KEY", "tml-refused-key")
    config = write_config(number_search_eval())
    status, out, err = run(["eval", str(config)], capsys)
    assert status == 78
    assert out == ""
    assert err[-1] == (
        f"platoon: the Tinker service at {refusing_service} refused TINKER_API_KEY when asked for a sampling "
        "client (HTTP 401: Invalid API key): set TINKER_API_KEY to a key that service accepts"
    )
    # the start made its directory and recorded no rollout: it is removed, and the command said so
    assert any(
        line.startswith("platoon: the evaluation stopped before any rollout was recorded: removed ")
        for line in err
    )
    assert not (workdir / "runs" / "eval" / "platoon-toy").exists()
    assert files_containing(workdir, "tml-refused-key") == []


def test_tinker_base_url_in_an_eval_config_and_an_unknown_checkpoint_leave_no_empty_directory(
    workdir, write_config, capsys, monkeypatch, tinker_server
):
    # The service named in the config (not $TINKER_BASE_URL), as a training config names it.
    monkeypatch.setenv("TINKER_API_KEY", tinker_server.api_key)
    config = write_config(number_search_eval(model_path="tinker://no-such-run/sampler_weights/final"))
    status, out, err = run(["eval", str(config), f"tinker_base_url={tinker_server.base_url}"], capsys)
    assert status == 1 and out == ""
    said = problems(err)
    assert said[-1] == (
        "platoon: the Tinker service could not open a sampler of tinker://no-such-run/sampler_weights/final: "
        "NotFoundError: 404 no checkpoint at tinker://no-such-run/sampler_weights/final"
    )
    removed = [line for line in said if "stopped before any rollout was recorded" in line]
    assert len(removed) == 1 and "/eval/no-such-run-sampler_weights-final/" in removed[0]
    assert not (workdir / "runs" / "eval" / "no-such-run-sampler_weights-final").exists()


def test_a_placeholder_model_path_is_refused_before_any_service_starts(workdir, write_config, capsys):
    # The README once showed `inference.model_path=tinker://...`: refused as the config is read, one problem line.
    config = write_config(number_search_eval())
    status, out, err = run(
        ["eval", str(config), "tinker_base_url=local", "inference.model_path=tinker://..."], capsys
    )
    assert status == 78 and out == ""
    assert err[-1] == (
        "  inference.model_path: ValueError: 'tinker://...' is not a checkpoint path: write "
        "tinker://<run>/sampler_weights/<name> (a sampler_path of the training run's checkpoints.jsonl), or leave "
        "it unset for the base model"
    )
    assert not any("local Tinker" in line for line in err)
    assert not (workdir / "runs").exists()
    assert (
        main(
            ["rollout", str(config), "--task", "val:0", "--model-path", "tinker://<run>/sampler_weights/<n>"]
        )
        == 64
    )
    assert (
        "--model-path: 'tinker://<run>/sampler_weights/<n>' is not a checkpoint path"
        in capsys.readouterr().err
    )


@pytest.mark.parametrize(
    "path",
    [
        "tinker://run-1/sampler_weights/final",
        "tinker://run-1/weights/000012",
        # skyrl-tx's sampler path: the model id and the name, no `sampler_weights/` segment
        "tinker://4f0c2a9e/final",
    ],
)
def test_a_checkpoint_path_the_service_answered_is_taken(workdir, write_config, capsys, path):
    config = write_config(number_search_eval())
    argv = [str(config), "tinker_base_url=local", f"inference.model_path={path}"]
    assert main(["config", "validate", *argv]) == 0
    assert capsys.readouterr().out.startswith("ok ")


@pytest.mark.parametrize(
    "path",
    [
        "tinker://run-1",
        "tinker://run-1/sampler_weights",
        "tinker://run-1/weights/",
        "tinker://run-1/sampler_weights/final/extra",
        "tinker://run-1/latest/final",
        "tinker://<run>/<name>",
        "run-1/sampler_weights/final",
    ],
)
def test_a_path_that_names_no_checkpoint_is_refused_in_one_line(workdir, write_config, capsys, path):
    config = write_config(number_search_eval())
    assert main(["config", "validate", str(config), f"inference.model_path={path}"]) == 78
    said = capsys.readouterr().out.splitlines()[1:]
    assert said == [
        f"  inference.model_path: ValueError: {path!r} is not a checkpoint path: write "
        "tinker://<run>/sampler_weights/<name> (a sampler_path of the training run's checkpoints.jsonl), or leave "
        "it unset for the base model"
    ]


# ---------------------------------------------------------------------------------------------------------------
# A hosted OpenAI-compatible model


def hosted_config(server, **hosted: Any) -> dict[str, Any]:
    settings = {"base_url": server.base_url, "api_key_env": HOSTED_KEY_ENV, "max_retries": 0, **hosted}
    return number_search_eval(model_name="my-hosted-model", renderer_name=None, hosted=settings)


def test_eval_against_a_hosted_model_keeps_the_key_out_of_every_record(
    workdir, write_config, capsys, hosted_server
):
    pricing = {"input": 1.0, "output": 2.0}
    config = write_config(hosted_config(hosted_server, pricing=pricing))
    status, out, err = run(["eval", str(config)], capsys)
    assert status == 0, err
    out_dir = only_dir(workdir / "runs" / "eval" / "my-hosted-model")
    steps = {task: guesses_to_find(task) for task in ("val:0", "val:1")}
    calls = 2 * sum(steps.values())
    assert len(hosted_server.calls) == calls
    probes = [s for s in hosted_server.seen if s["probe"]]
    assert len(probes) == 1 and probes[0]["body"]["max_completion_tokens"] == 16
    assert all(s["body"]["model"] == "my-hosted-model" for s in hosted_server.seen)

    summary = json.loads(out)
    summary.pop("elapsed_seconds")
    assert summary == {
        "total_tasks": 2,
        "tasks_without_valid_rollouts": 0,
        "total_rollouts": 4,
        "valid_rollouts": 4,
        "successful_rollouts": 4,
        "failed_rollouts": 0,
        "errored_rollouts": 0,
        "outcome_status_counts": {"scored": 4},
        "reward_key_counts": {"reward": 4},
        "success_rate": 1.0,
        "success_at_k": 1.0,
        "reward_mean": 1.0,
        "reward_max": 1.0,
        "reward_min": 1.0,
        "reward_at_k_mean": 1.0,
        "reward_at_k_max": 1.0,
        "reward_at_k_min": 1.0,
    }
    report = json.loads((out_dir / "reports" / "final_report.json").read_text())
    assert report["model"] == {
        "model_name": "my-hosted-model",
        "model_path": None,
        "renderer_name": None,
        "backend": "hosted",
        "base_url_origin": hosted_server.base_url.rsplit("/v1", 1)[0],
        "served_models": ["served-model-2025"],
    }
    # Each call: 100 prompt tokens (40 cached), 10 completion tokens.
    assert report["usage"]["policy"]["total"] == {
        "calls": calls,
        "prompt_tokens": 100 * calls,
        "completion_tokens": 10 * calls,
        "total_tokens": 110 * calls,
        "cached_input_tokens": 40 * calls,
    }
    per_call = (100 * 1.0 + 10 * 2.0) / 1_000_000
    assert report["cost"]["total_usd"] == pytest.approx(per_call * calls)
    assert report["cost"]["mean_usd_per_rollout"] == pytest.approx(per_call * calls / 4)
    assert report["cost"]["unpriced_calls"] == 0
    assert report["backend"] == {
        "attempts": calls,
        "rate_limited": 0,
        "failed_calls": 0,
        "refusals": 0,
        "calls_without_usage": 0,
        "rollouts_with_failed_calls": 0,
        "served_models": ["served-model-2025"],
    }
    meta = json.loads((out_dir / "rollouts" / "val_0" / "rollout_0" / "metadata.json").read_text())
    assert meta["provenance"] == {
        "judges": True,
        "backend": "hosted",
        "model": "my-hosted-model",
        "base_url_origin": hosted_server.base_url.rsplit("/v1", 1)[0],
    }
    lock = json.loads((out_dir / "lock.json").read_text())
    assert lock["policy"] == {
        "backend": "hosted",
        "model": "my-hosted-model",
        "base_url_origin": hosted_server.base_url.rsplit("/v1", 1)[0],
        "api_key_env": HOSTED_KEY_ENV,
        "max_concurrent_requests": None,
        "probe": {"ok": True, "dialects": ["openai_chat"]},
    }
    assert "tool_call_parsing" not in lock
    assert files_containing(out_dir, HOSTED_KEY) == []
    assert HOSTED_KEY not in out + "\n".join(err)


def test_a_hosted_call_failing_after_retries_errors_its_rollout(workdir, write_config, capsys, hosted_server):
    hosted_server.fail_with = [503]
    data = hosted_config(hosted_server)
    data["inference"]["workflow"] = {"num_rollouts_per_task": 1, "num_concurrent_workers": 1}
    data["environments"][0]["eval_dataset_kwargs"]["limit"] = 1
    config = write_config(data)
    status, out, err = run(["eval", str(config)], capsys)
    assert status == 0, err
    summary = json.loads(out)
    assert (summary["valid_rollouts"], summary["errored_rollouts"], summary["failed_rollouts"]) == (0, 1, 0)
    out_dir = only_dir(workdir / "runs" / "eval" / "my-hosted-model")
    meta = json.loads((out_dir / "rollouts" / "val_0" / "rollout_0" / "metadata.json").read_text())
    assert meta["status"] == "errored"
    assert meta["error"] == "backend_unavailable: 1 model call(s) failed after retries"
    report = json.loads((out_dir / "reports" / "final_report.json").read_text())
    assert report["backend"]["rollouts_with_failed_calls"] == 1
    assert files_containing(out_dir, HOSTED_KEY) == []  # the server echoed the key in its error


def test_a_hosted_refusal_stops_the_evaluation(workdir, write_config, capsys, hosted_server):
    hosted_server.fail_with = [401] * 10
    data = hosted_config(hosted_server)
    data["inference"]["workflow"] = {"num_rollouts_per_task": 2, "num_concurrent_workers": 1}
    config = write_config(data)
    status, out, err = run(["eval", str(config)], capsys)
    assert status == 78
    assert out == ""
    assert err[-1].startswith("platoon: the hosted model at http://127.0.0.1:")
    assert err[-1].endswith("the evaluation stopped: 3 rollout(s) did not start")
    assert HOSTED_KEY not in err[-1]
    assert len(hosted_server.calls) == 1


def test_a_failed_hosted_probe_is_one_line(workdir, write_config, capsys, hosted_server):
    hosted_server.probe_status = 404
    config = write_config(hosted_config(hosted_server))
    status, _, err = run(["eval", str(config)], capsys)
    assert status == 78
    assert err[-1].startswith("platoon: hosted probe failed for dialect openai_chat at http://127.0.0.1:")
    assert "no such model" in err[-1]
    assert hosted_server.calls == []


def test_a_missing_hosted_key_variable_is_refused_first(
    workdir, write_config, capsys, monkeypatch, hosted_server
):
    monkeypatch.delenv(HOSTED_KEY_ENV)
    config = write_config(hosted_config(hosted_server))
    status, _, err = run(["eval", str(config)], capsys)
    assert status == 78
    assert err[-1] == (
        f"platoon: inference.hosted.api_key_env names {HOSTED_KEY_ENV}, which is not set: set it to the hosted "
        "server's key (or api_key_env: null for a server without auth)"
    )
    assert not (workdir / "runs").exists()
    assert hosted_server.seen == []


# ---------------------------------------------------------------------------------------------------------------
# The garbage collector (platoon.heap)


def test_under_the_console_script_the_rollouts_run_on_a_frozen_heap_and_in_process_they_do_not(
    workdir, write_config, capsys, monkeypatch
):
    """The console script freezes what the evaluation loaded before its rollouts, so full collections do not
    walk it while they run; `main([...])` in process leaves the caller's collector alone."""
    config = write_config(number_search_eval())
    frozen_while_sampling: list[int] = []

    def policy(prompt: str) -> str:
        frozen_while_sampling.append(gc.get_freeze_count())
        return binary_search(prompt)

    gc.unfreeze()
    try:
        with serve_policy(policy):
            status, _, err = run(["eval", str(config)], capsys)
        assert status == 0, err
        in_process = max(frozen_while_sampling)
        frozen_while_sampling.clear()
        monkeypatch.setattr("sys.argv", ["platoon", "eval", str(config)])
        with serve_policy(policy):
            assert main() == 0, capsys.readouterr().err
        # The loaded stack is hundreds of thousands of objects. A few hundred sit in the permanent generation
        # without platoon's doing (375 here: at the interpreter's start, and again once the tinker SDK is imported).
        assert in_process < 1_000
        assert frozen_while_sampling and min(frozen_while_sampling) > 10_000
    finally:
        gc.unfreeze()
